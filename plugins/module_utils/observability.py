# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What Prometheus learns from a host's state: the one owner of

- the scrape targets of a host (file-based service discovery: one JSON file per host, a target group per slot, the
  gateway's HAProxy and node_exporter) and their labels;
- the host's textfile for node_exporter's textfile collector: each slot and its last pivot as metrics, from the
  slot records (slots.json) and the pivot records the pivot writes on the host.

Pure functions of their inputs (no clock, no I/O), so a re-run that finds nothing new writes the same bytes.
"""
from __future__ import annotations

import ipaddress
import json
import re

from ansible_collections.llmfleet.vllm.plugins.module_utils.host_slots import intent_of, slot_gateway
from ansible_collections.llmfleet.vllm.plugins.module_utils.prom_text import Families, number

TARGETS_FILE_PREFIX = 'llmfleet-'
TEXTFILE_NAME = 'llmfleet.prom'
# The jobs the targets name (the scrape config may use one file_sd job for all of them: `job` comes from the targets).
JOB_VLLM = 'llmfleet_vllm'
JOB_GATEWAY = 'llmfleet_gateway'
JOB_NODE = 'llmfleet_node'
# The gateway's metrics listener: HAProxy's own metrics, and each slot's vLLM metrics under /slot/<name>/metrics.
GATEWAY_METRICS_PATH = '/metrics'
SLOT_METRICS_PATH = '/slot/%s/metrics'

TARGET_LABELS = ('host', 'slot', 'model', 'alias', 'revision', 'gpu_ids', 'engine_version', 'revision_locked')
LABEL_NAME_RE = re.compile(r'^[a-zA-Z_][a-zA-Z0-9_]*\Z')
HOST_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._-]{0,252}\Z')
ADDRESS_RE = re.compile(r'^[A-Za-z0-9.:_\[\]-]{1,253}\Z')

# A pivot record's result, as the metrics spell it (the record says success for a pivot that passed).
RESULTS = ('passed', 'rolled_back', 'failed')
_RECORD_RESULT = {'success': 'passed', 'rolled_back': 'rolled_back', 'failed': 'failed'}


class ObservabilityError(ValueError):
    """Input that cannot become targets or metrics; the message names the variable and what is allowed."""


def check_extra_labels(labels, variable='observability_target_labels'):
    """The user's extra target labels, once they are Prometheus label names that clash with none of ours."""
    if labels is None:
        return {}
    if not isinstance(labels, dict):
        raise ObservabilityError('%s must be a mapping of label names to values, got %s' % (variable, json.dumps(labels)))
    for name, value in sorted(labels.items()):
        if not isinstance(name, str) or not LABEL_NAME_RE.match(name) or name.startswith('__'):
            raise ObservabilityError('%s: %s is not a Prometheus label name (letters, digits and "_", not starting with a'
                                     ' digit or "__")' % (variable, json.dumps(name)))
        if name in TARGET_LABELS or name in ('job', 'instance'):
            raise ObservabilityError('%s: the label %s clashes with a label the collection sets (%s); rename it'
                                     % (variable, name, ', '.join(('job', 'instance') + TARGET_LABELS)))
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ObservabilityError('%s: the value of %s must be a string or a number, got %s'
                                     % (variable, name, json.dumps(value)))
    return {name: str(value) for name, value in labels.items()}


def targets_file_name(host):
    """llmfleet-<host>.json: the file of one host's targets in the targets directory."""
    if not isinstance(host, str) or not HOST_RE.match(host):
        raise ObservabilityError('a host that Prometheus scrapes needs an inventory name of letters, digits and "._-",'
                                 ' got %s' % json.dumps(host))
    return TARGETS_FILE_PREFIX + host + '.json'


def revision_locked(model, revision, locks):
    """'true' or 'false' when the fleet has a revision lock for the model (rollout.yml), else ''."""
    commit = (locks or {}).get(model)
    if not commit or not revision:
        return ''
    return 'true' if commit == revision else 'false'


def _port(value, variable):
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = 0
    if not 1 <= port <= 65535:
        raise ObservabilityError('%s must be a TCP port in 1..65535, got %s' % (variable, json.dumps(value)))
    return port


def host_port(address, port):
    """address:port as a target; an IPv6 literal in brackets ([2001:db8::1]:8405), as Prometheus parses it."""
    bare = address[1:-1] if address.startswith('[') and address.endswith(']') else address
    try:
        literal = ipaddress.ip_address(bare)
    except ValueError:
        return '%s:%d' % (address, port)
    return ('[%s]:%d' if literal.version == 6 else '%s:%d') % (literal.compressed, port)


def target_groups(host, address, slots, gateway_metrics_port=None, node_exporter_port=None, engine_versions=None,
                  locks=None, extra_labels=None, gateway_tls=False):
    """The file_sd target groups of one host.

    A slot behind the gateway is scraped through the gateway's metrics listener (its vLLM listens on loopback only),
    at /slot/<name>/metrics; a slot without a gateway at its own port. Every group carries the slot's labels, so
    every series of a slot's vLLM says which model, alias, revision and GPUs it serves; a pivot rewrites the file and
    the next scrape has the new labels. gateway_tls: the gateway's listeners serve TLS (gateway_tls_cert_file), so its
    targets say __scheme__ https.
    """
    targets_file_name(host)
    if not isinstance(address, str) or not ADDRESS_RE.match(address):
        raise ObservabilityError('observability_scrape_address must be one IP address or host name, got %s'
                                 % json.dumps(address))
    extra = check_extra_labels(extra_labels)
    versions = engine_versions or {}
    scheme = {'__scheme__': 'https'} if gateway_tls else {}
    groups = []
    gateway_used = False
    for name, record in sorted((slots or {}).items()):
        if not isinstance(record, dict) or not record.get('model') or not record.get('port'):
            continue
        if slot_gateway(record):
            if not gateway_metrics_port:
                continue
            gateway_used = True
            target = host_port(address, _port(gateway_metrics_port, 'gateway_metrics_port'))
            path = SLOT_METRICS_PATH % name
        else:
            target = host_port(address, _port(record['port'], 'slot %s port' % name))
            path = '/metrics'
        labels = dict(extra, **scheme) if slot_gateway(record) else dict(extra)
        labels.update({
            'job': JOB_VLLM, '__metrics_path__': path, 'host': host, 'slot': name, 'model': str(record['model']),
            'alias': str(record.get('alias') or ''), 'revision': str(record.get('revision') or ''),
            'gpu_ids': ','.join(str(i) for i in record.get('gpu_ids') or []),
            'engine_version': str(versions.get(name) or ''),
            'revision_locked': revision_locked(record['model'], record.get('revision'), locks)})
        groups.append({'targets': [target], 'labels': labels})
    if gateway_used:
        labels = dict(extra, job=JOB_GATEWAY, host=host, __metrics_path__=GATEWAY_METRICS_PATH, **scheme)
        groups.append({'targets': [host_port(address, int(gateway_metrics_port))], 'labels': labels})
    if node_exporter_port:
        labels = dict(extra, job=JOB_NODE, host=host)
        groups.append({'targets': [host_port(address, _port(node_exporter_port, 'observability_node_exporter_port'))],
                       'labels': labels})
    return groups


def targets_file_text(groups):
    return json.dumps(groups, indent=2, sort_keys=True) + '\n'


# --- the textfile -------------------------------------------------------------------------------------------------

def record_result(record):
    """passed, rolled_back or failed: a pivot record's result as the metrics spell it."""
    return _RECORD_RESULT.get((record or {}).get('result'), 'failed')


def record_time(record):
    """When a pivot ended (Unix seconds): the new model ready, or the previous one serving again after a rollback."""
    record = record or {}
    for value in (record.get('new_ready_at'), (record.get('rollback') or {}).get('serving_at'), record.get('at')):
        found = number(value)
        if found is not None:
            return found
    return None


def latest_records(named_records):
    """{slot: record}: each slot's latest pivot record, from (file name, record) pairs: the one that ended last
    (record_time; a record without a time comes before every timed one), the greatest name between equal times."""
    latest = {}

    def ended(pair):
        record = pair[1] if isinstance(pair[1], dict) else {}
        return (record_time(record) or 0.0, pair[0])

    for name, record in sorted(named_records or [], key=ended):
        if isinstance(record, dict) and record.get('slot'):
            latest[record['slot']] = record
    return latest


def slot_metrics_text(slots, named_records=None, locks=None):
    """The host's textfile: its slots and each slot's last pivot (result, downtime, load, rollback, the gate's
    figures with their confidence intervals), with the pivot's time so that a dashboard can annotate it."""
    families = Families()
    records = latest_records(named_records)
    for name, record in sorted((slots or {}).items()):
        if not isinstance(record, dict):
            continue
        slot = {'slot': name}
        if record.get('model'):
            families.add('llmfleet_slot_info', 'The model a slot serves (value 1), with its alias, revision, port and GPUs.',
                         dict(slot, model=record['model'], alias=record.get('alias') or '',
                              revision=record.get('revision') or '', port=record.get('port') or '',
                              gpu_ids=','.join(str(i) for i in record.get('gpu_ids') or []),
                              unit=record.get('unit') or ''), 1)
            families.add('llmfleet_slot_serving_since_timestamp_seconds', 'When the slot\'s model began to serve.',
                         slot, record.get('since'))
            locked = revision_locked(record['model'], record.get('revision'), locks)
            if locked:
                families.add('llmfleet_slot_revision_locked',
                             '1 when the slot serves the revision the fleet\'s lock names for its model, else 0.',
                             dict(slot, model=record['model'], revision=record.get('revision') or '',
                                  locked_revision=locks[record['model']]), 1 if locked == 'true' else 0)
        intent = intent_of(record)
        families.add('llmfleet_slot_pivot_in_progress',
                     '1 while a pivot of the slot has begun and not ended (a killed run leaves it: re-run the pivot).',
                     slot, 1 if intent else 0)
        if intent:
            families.add('llmfleet_slot_pivot_started_timestamp_seconds', 'When the unfinished pivot of the slot began.',
                         slot, intent.get('since'))
        asleep = record.get('asleep')
        families.add('llmfleet_slot_previous_asleep', '1 while the slot\'s previous model sleeps (rollback by wake).',
                     slot, 1 if asleep else 0)
    for name, record in sorted(records.items()):
        _pivot_metrics(families, name, record)
    return families.text()


def _pivot_metrics(families, name, record):
    slot = {'slot': name}
    result = record_result(record)
    families.add('llmfleet_pivot_last_info', 'The slot\'s last pivot (value 1): from and to which model, its result.',
                 dict(slot, model=record.get('model') or '', revision=record.get('revision') or '',
                      previous_model=record.get('previous_model') or '',
                      previous_revision=record.get('previous_revision') or '',
                      strategy=record.get('strategy') or '', result=result), 1)
    for each in RESULTS:
        families.add('llmfleet_pivot_last_result', 'The result of the slot\'s last pivot: 1 for its result, 0 for the others.',
                     dict(slot, result=each), 1 if each == result else 0)
    families.add('llmfleet_pivot_last_timestamp_seconds',
                 'When the slot\'s last pivot ended (the new model ready, or the previous one serving again).',
                 slot, record_time(record))
    families.add('llmfleet_pivot_last_downtime_seconds',
                 'Seconds the slot had no model serving in its last pivot (0 for blue/green).', slot, record.get('downtime_s'))
    families.add('llmfleet_pivot_last_load_seconds', 'Seconds the new model took from process start to ready.',
                 slot, record.get('load_time_s'))
    # The gateway's window of a stop-then-start (issue 44): counted from its own log, absent for other pivots.
    window = record.get('gateway_window') or {}
    families.add('llmfleet_pivot_last_closed_seconds',
                 'Seconds the gateway held or refused the slot\'s requests in its last pivot (closed -> admitting again).',
                 slot, window.get('closed_s'))
    families.add('llmfleet_pivot_last_held_requests', 'Requests the gateway held through the slot\'s last pivot.', slot,
                 window.get('held_requests'))
    families.add('llmfleet_pivot_last_held_wait_max_seconds',
                 'The longest wait of a request held through the slot\'s last pivot.', slot, window.get('held_wait_max_s'))
    families.add('llmfleet_pivot_last_refused_requests',
                 'Requests the gateway answered 503 for the slot during its last pivot.', slot, window.get('refused_requests'))
    rollback = record.get('rollback') or {}
    families.add('llmfleet_pivot_last_rollback_seconds',
                 'Seconds from the failure to the previous model serving again (a rolled-back pivot).', slot,
                 rollback.get('seconds'))
    _level_metrics(families, slot, 'gate', record.get('gate'))
    _level_metrics(families, slot, 'benchmark', (record.get('benchmark') or {}).get('levels'))


def _level_metrics(families, slot, kind, levels):
    """The figures of the gate's or the benchmark's levels: output tokens per second with its 95% confidence interval,
    error ratio, whether the level passed (gate), inter-token latency and time to first token percentiles."""
    what = {'gate': 'the gate after the switch', 'benchmark': 'the benchmark after the pivot'}[kind]
    prefix = 'llmfleet_pivot_last_%s_' % kind
    for level in levels or []:
        if not isinstance(level, dict) or level.get('concurrency') is None:
            continue
        at = dict(slot, concurrency=str(level['concurrency']))
        interval = level.get('output_tok_s_ci') or {}
        families.add(prefix + 'output_tokens_per_second', 'Output tokens per second in %s, at each concurrency.' % what,
                     at, level.get('output_tok_s'))
        families.add(prefix + 'output_tokens_per_second_ci_low',
                     'Low end of the 95%% confidence interval of the output tokens per second in %s.' % what, at,
                     interval.get('low'))
        families.add(prefix + 'output_tokens_per_second_ci_high',
                     'High end of the 95%% confidence interval of the output tokens per second in %s.' % what, at,
                     interval.get('high'))
        families.add(prefix + 'error_ratio', 'Share of the requests that failed in %s, at each concurrency.' % what, at,
                     level.get('error_rate'))
        if kind == 'gate':
            families.add(prefix + 'passed', '1 when the gate passed at this concurrency.', at, 1 if level.get('passed') else 0)
        for stat, label in (('itl_s', 'itl'), ('ttft_s', 'ttft')):
            for percentile in ('50', '90', '99'):
                families.add(prefix + label + '_seconds', '%s in %s, by percentile.'
                             % ({'itl': 'Inter-token latency', 'ttft': 'Time to first token'}[label], what),
                             dict(at, percentile=percentile), (level.get(stat) or {}).get('p' + percentile))
