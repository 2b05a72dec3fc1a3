# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Golden-answer parity on the controller (module_utils answer_parity owns the rules; the module answer_parity asks)."""
from __future__ import annotations

import time

from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.module_utils import answer_parity as ap


def parity_probes(entry):
    """The catalog entry's probes, else the default set."""
    try:
        return list(entry.get('probes') or ap.DEFAULT_PROBES)
    except AttributeError:
        raise AnsibleFilterError('parity_probes: expected a catalog entry, got %r' % (entry,))


def parity_compare(probe, record=None, epsilon=ap.DEFAULT_EPSILON, tolerance=ap.DEFAULT_LOGPROB_TOLERANCE, reset=False):
    """{status, comparison, record}: status recorded (no record, or reset), matched or diverged; record is what to
    keep (the record given when it matched under the same key, the new answers otherwise). A record of another key is
    compared only when it is of the same weights (repo and commit): a rollout's canary for its other hosts."""
    if not isinstance(probe, dict) or 'answers' not in probe or 'key' not in probe:
        raise AnsibleFilterError('parity_compare: expected the result of llmfleet.vllm.answer_parity')
    fresh = {'key': probe['key'], 'settings': probe.get('settings', {}), 'answers': probe['answers'],
             'recorded_at': round(time.time(), 3)}
    if reset or not record:
        return {'status': 'recorded', 'comparison': None, 'record': fresh, 'reset': bool(reset and record)}
    record_key, key = record.get('key') or {}, probe['key']
    same_key = record_key.get('digest') == key['digest']
    # Another key of the same weights: a rollout's host compared with its canary, whatever its own serving settings.
    same_weights = all((record_key.get('parts') or {}).get(part) == key['parts'].get(part) for part in ('repo', 'commit'))
    if not same_key and not same_weights:
        raise AnsibleFilterError('parity_compare: the record is of key %s (other weights), the answers of key %s'
                                 % (record_key.get('digest'), key['digest']))
    try:
        comparison = ap.compare(record['answers'], probe['answers'], float(epsilon), float(tolerance))
    except (KeyError, TypeError, ap.ParityError) as exc:
        raise AnsibleFilterError('parity_compare: the record is not one roles/pivot writes: %s' % exc)
    comparison['same_key'] = same_key
    return {'status': 'matched' if comparison['ok'] else 'diverged', 'comparison': comparison,
            'record': record if comparison['ok'] and same_key else fresh, 'reset': False}


def parity_known_answers(probe, entry):
    """{checked, notice, missed, tool_errors}: the entry's expected answers and tool probe, on real weights only."""
    if entry.get('random_weights'):
        return {'checked': False, 'missed': [], 'tool_errors': [],
                'notice': '%s has random weights (catalog random_weights): known answers not checked' % entry.get('name')}
    missed = ap.known_answers(entry.get('probes') or [], probe.get('answers') or [])
    tool_errors = ap.tool_call_errors(entry['tool_probe'], probe.get('tool_answer')) if entry.get('tool_probe') else []
    return {'checked': True, 'missed': missed, 'tool_errors': tool_errors, 'notice': ''}


class FilterModule:
    def filters(self):
        return {'parity_probes': parity_probes, 'parity_compare': parity_compare, 'parity_known_answers': parity_known_answers}
