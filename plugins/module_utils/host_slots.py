# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Host state as slots: what each slot of a host serves, and where the next model of a slot goes.

A slot is one served model on its own GPUs and port: {name, model, profile, revision (commit sha), model_dir,
gpu_ids, port, unit, since, previous, alias, standby_port, gateway, sleep_mode, asleep, pivot}. ``pivot`` is the intent
of a pivot in progress (written before its first change to the host, see ``intent_record``); ``asleep`` the slot's
previous model kept asleep on the standby port (vLLM's sleep mode, see ``asleep_record``). The host keeps all of them
in <state_dir>/slots.json. A host of an older release kept one model in <state_dir>/current.json: that becomes the
slot ``default`` (read here, written by the host_slots module on the first run).

This file owns the state's paths and schema, the slot and model-directory naming rules, the choice of GPUs
and port for a slot, what a slot promises its clients across runs (alias, gateway, port) and the pivot intent.
Pure python (no Ansible): the host_slots module reads the disk and passes it in.
"""
from __future__ import annotations

import itertools
import json
import os
import re

from ansible_collections.llmfleet.vllm.plugins.module_utils.catalog import MAX_PORT, MIN_VLLM_PORT
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_manifest import MANIFEST_FILENAME

DEFAULT_STATE_DIR = '/var/lib/llmfleet'
STATE_FILE = 'slots.json'
LEGACY_STATE_FILE = 'current.json'
RECORDS_DIR = 'pivots'
DEFAULT_SLOT = 'default'
FIRST_PORT = 8000
# The intent of a pivot in progress, kept in the slot's record: ``switching`` until the new model is recorded as the
# slot's (a re-run rolls back to what the slot records), ``committed`` after (a re-run rolls forward).
INTENT_KEY = 'pivot'
INTENT_SWITCHING = 'switching'
INTENT_COMMITTED = 'committed'
# The slot's previous model, put to sleep by a pivot (vLLM's sleep mode, level 1: weights in host RAM, GPU memory
# free) instead of stopped: woken by a rollback or a pivot back to it until a timer on the host stops it.
ASLEEP_KEY = 'asleep'
ASLEEP_DIR = 'asleep'
ASLEEP_FIELDS = ('model', 'profile', 'revision', 'model_dir', 'unit', 'port', 'gpu_ids', 'alias')
# How a pivot replaces the slot's model. The new model starts on the slot's standby port (the gateway switches at the
# commit) in blue_green (beside the old one), sleep (the old one asleep) and wake (the slot's sleeping model woken).
NEW_ON_STANDBY = ('blue_green', 'sleep', 'wake')
# The switch a pivot runs for each strategy (roles/pivot/tasks/switch_<switch>.yml): a wake is the sleep switch's,
# and a first model or a re-run of an unhealthy one is a start without a stop.
SWITCH_OF_STRATEGY = {'blue_green': 'blue_green', 'sleep': 'sleep', 'wake': 'sleep'}


def switch_of(strategy):
    """The switch that carries out a plan's strategy: blue_green, sleep, or stop_start."""
    return SWITCH_OF_STRATEGY.get(strategy, 'stop_start')


BOOL_TRUE = ('true', 'yes', 'on', '1')
BOOL_FALSE = ('false', 'no', 'off', '0')
# \Z, not $: $ also matches before a final newline ('chat\n' would end ExecStart= and split the gateway's map lines).
SLOT_NAME_RE = re.compile(r'^[a-z][a-z0-9-]{0,31}\Z')
COMMIT_RE = re.compile(r'^[0-9a-f]{40}\Z')
ALIAS_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}\Z')
# A systemd service name as host state records it (it reaches a command line: unit-stopped-at.py).
UNIT_RE = re.compile(r'^[A-Za-z0-9@._:-]+[.]service\Z')
# vLLM's default share of each GPU's memory (fit_check uses the same figure).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# nvidia-smi topo -m cells, cheapest path first: a bonded NVLink set, one PCIe switch, several switches, one host
# bridge, several host bridges of a NUMA node, across NUMA nodes.
LINK_COST = {'PIX': 1, 'PXB': 2, 'PHB': 3, 'NODE': 4, 'SYS': 5}
UNKNOWN_LINK_COST = 5
# Above this many GPU combinations the choice is greedy (a 16-GPU host picking 8 has 12870).
MAX_COMBINATIONS = 20000


class SlotError(ValueError):
    """A slot request that cannot be met; the message names the variable and what is allowed."""


def state_paths(state_dir=None):
    state_dir = (state_dir or DEFAULT_STATE_DIR).rstrip('/') or '/'
    return {'state_dir': state_dir, 'state_file': os.path.join(state_dir, STATE_FILE),
            'legacy_state_file': os.path.join(state_dir, LEGACY_STATE_FILE),
            'records_dir': os.path.join(state_dir, RECORDS_DIR)}


# The second unit of a model: a fast start arms a new revision of the model a slot serves in it, beside the old one.
ALT_UNIT_VARIANT = 'alt'


def planned_unit(model, current, strategy, fast_start):
    """The unit a pivot to ``model`` starts: the slot's own when it serves it already, the sleeping model's when it
    wakes; with fast start, a stop-then-start to another revision of the model the slot serves takes the model's other
    unit (vllm-<model>.service <-> vllm-<model>-alt.service), so the new one can be armed while the old one serves;
    else vllm-<model>.service."""
    plain = unit_name(model)
    current_unit = (current or {}).get('unit')
    if strategy == 'none' and current_unit:
        return current_unit
    if strategy == 'wake':
        return (asleep_of(current) or {}).get('unit') or plain
    if fast_start and strategy == 'stop_start' and current_unit == plain:
        return unit_name(model, ALT_UNIT_VARIANT)
    return plain


def unit_name(model, variant=None):
    """The systemd unit that serves ``model`` (the one place this name is spelt): vllm-<model>.service, or
    vllm-<model>-<variant>.service for another way of serving it (the Ray cluster's: variant ``ray``)."""
    if not model or not isinstance(model, str) or '/' in model:
        raise SlotError('a vLLM unit is named after a catalog model name; got %s' % json.dumps(model))
    return 'vllm-%s%s.service' % (model, '-%s' % variant if variant else '')


def check_slot_name(name, variable='slot'):
    if not isinstance(name, str) or not SLOT_NAME_RE.match(name):
        raise SlotError('%s must be a slot name of 1-32 characters: a lower-case letter, then lower-case letters, digits'
                        ' or "-" (e.g. default, a, minimax); got %s' % (variable, json.dumps(name)))
    return name


def migrate_legacy(legacy):
    """The slot ``default`` from an older release's current.json ({model, unit, since, previous})."""
    model = legacy.get('model') if isinstance(legacy, dict) else None
    if not model:
        return {}
    return {DEFAULT_SLOT: {
        'name': DEFAULT_SLOT, 'model': model, 'profile': '', 'revision': None, 'model_dir': None,
        'gpu_ids': None, 'port': None, 'unit': legacy.get('unit') or unit_name(model),
        'since': legacy.get('since'), 'previous': {'model': legacy['previous']} if legacy.get('previous') else None}}


def load_state(state_text=None, legacy_text=None):
    """(slots, migrated): the slots of slots.json, or those migrated from current.json when there is none."""
    if state_text is not None:
        try:
            data = json.loads(state_text)
        except ValueError as exc:
            raise SlotError('the host state file is not JSON (%s); fix or move it aside' % exc)
        slots = data.get('slots') if isinstance(data, dict) else None
        if not isinstance(slots, dict):
            raise SlotError('the host state file has no "slots" mapping; fix or move it aside')
        return _check_units(slots, 'slots.json'), False
    if legacy_text is not None:
        try:
            slots = migrate_legacy(json.loads(legacy_text))
        except ValueError as exc:
            raise SlotError('the old host state file current.json is not JSON (%s); fix or move it aside' % exc)
        return _check_units(slots, 'current.json'), True
    return {}, False


def _check_units(slots, source):
    """The slots, once every recorded unit is a systemd service name (it reaches commands and the journal)."""
    for name, record in sorted(slots.items()):
        unit = record.get('unit') if isinstance(record, dict) else None
        if unit is not None and not (isinstance(unit, str) and UNIT_RE.match(unit)):
            raise SlotError('the host state file %s: slot %s records the unit %s, not a systemd service name (letters,'
                            ' digits and "@._:-", ending in .service); fix or move it aside'
                            % (source, name, json.dumps(unit)))
    return slots


def dump_state(slots):
    return json.dumps({'version': 1, 'slots': slots}, indent=2, sort_keys=True) + '\n'


def manifest_commit(models_root, name):
    """The commit the manifest of <models_root>/<name> (written by model_fetch) records; None without one."""
    try:
        with open(os.path.join(models_root, name, MANIFEST_FILENAME)) as handle:
            return json.load(handle).get('revision')
    except (OSError, ValueError, AttributeError):
        return None


def model_dir_candidates(model, commit):
    """The directory names that may hold ``model`` at ``commit``: <model>, then <model>--<first 12 hex of the commit>
    (the one place that name is spelt)."""
    return [model, '%s--%s' % (model, commit[:12])] if commit else [model]


def model_dir_name(model, commit, commit_in_dir):
    """The directory (under the models root) that holds ``model`` at ``commit``.

    commit_in_dir maps a candidate directory name (model_dir_candidates) to the commit its manifest records (None: the
    directory is missing or has no manifest). A directory holds one revision and is never written with another:
    <model> is used while it is free or holds this commit, otherwise the pinned name.
    """
    if not commit:
        return model
    pinned = model_dir_candidates(model, commit)[1]
    for name in (model, pinned):
        if commit_in_dir.get(name) == commit:
            return name
    return model if commit_in_dir.get(model) is None else pinned


def _link_cost(matrix, a, b):
    cell = (matrix.get('GPU%d' % a) or {}).get('GPU%d' % b) or (matrix.get('GPU%d' % b) or {}).get('GPU%d' % a)
    if not cell:
        return UNKNOWN_LINK_COST
    if cell.startswith('NV'):
        return 0
    return LINK_COST.get(cell, UNKNOWN_LINK_COST)


def _group_cost(matrix, ids):
    return sum(_link_cost(matrix, a, b) for a, b in itertools.combinations(ids, 2))


def _best_group(candidates, needed, matrix, prefer):
    """The ``needed`` GPUs of ``candidates`` with the cheapest links between them; then most of ``prefer`` (the
    slot's GPUs now), then the lowest indexes."""
    def key(ids):
        return (_group_cost(matrix, ids), -len(set(ids) & prefer), list(ids))
    count = 1
    for i in range(needed):
        count = count * (len(candidates) - i) // (i + 1)
    if count <= MAX_COMBINATIONS:
        return list(min(itertools.combinations(sorted(candidates), needed), key=key))
    group = [min(sorted(candidates), key=lambda g: (g not in prefer, g))]
    while len(group) < needed:
        rest = [g for g in sorted(candidates) if g not in group]
        group.append(min(rest, key=lambda g: (sum(_link_cost(matrix, g, h) for h in group), g not in prefer, g)))
    return sorted(group)


def _free_mib(gpu):
    total, used = gpu.get('memory_total_mib'), gpu.get('memory_used_mib')
    if total is None or used is None:
        return None
    return total - used


def assign_gpus(slot, needed, gpu_facts, slots, requested=None, memory_fraction=None, variable='gpu_ids',
                beside=False):
    """GPU indexes for ``slot``: ``needed`` of them, none held by another slot, each with the memory vLLM claims
    free (GPUs the slot holds now count as free: its model stops before the new one starts), the cheapest links
    between them (same PCIe switch / NUMA node, or NVLink). ``requested`` (explicit ids) wins but is checked.

    ``beside``: the new model starts next to the slot's running one (blue/green). GPUs no slot holds are preferred;
    when too few are free, the new engine shares the slot's own GPUs where their free memory now (the old engine
    running) holds its share (gpu_memory_utilization x total), as vLLM checks when it starts. See ``shared_gpus``."""
    if needed == 0:
        if requested:
            raise SlotError('%s=%s: the model runs on the CPU engine and uses no GPU' % (variable, json.dumps(requested)))
        return []
    fraction = memory_fraction or DEFAULT_GPU_MEMORY_UTILIZATION
    gpus = {g.get('index'): g for g in (gpu_facts or {}).get('gpus') or [] if isinstance(g, dict)}
    matrix = ((gpu_facts or {}).get('topology') or {}).get('matrix') or {}
    own = set((slots.get(slot) or {}).get('gpu_ids') or [])
    held = {}
    for name, record in sorted(slots.items()):
        if name != slot:
            for index in record.get('gpu_ids') or []:
                held[index] = name

    def why_not(index, share_own):
        if index not in gpus:
            return 'GPU %s is not on this host (GPUs: %s)' % (index, ', '.join(str(i) for i in sorted(gpus)) or 'none')
        if index in held:
            return 'GPU %s is held by slot %s' % (index, held[index])
        if index in own and beside and not share_own:
            return 'GPU %s is held by slot %s (its running model)' % (index, slot)
        free = _free_mib(gpus[index])
        needed_mib = int((gpus[index].get('memory_total_mib') or 0) * fraction)
        if (beside or index not in own) and (free is None or free < needed_mib):
            return 'GPU %s is busy: %s MiB free, the model needs %d MiB (%s x its memory)' % (
                index, 'unknown' if free is None else free, needed_mib, fraction)
        return None

    if requested:
        ids = list(requested)
        if len(set(ids)) != len(ids) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise SlotError('%s must be a list of distinct GPU indexes, got %s' % (variable, json.dumps(requested)))
        if len(ids) != needed:
            raise SlotError('%s=%s names %d GPUs; the model needs %d (tensor x pipeline x data parallel)'
                            % (variable, json.dumps(ids), len(ids), needed))
        problems = [p for p in (why_not(i, True) for i in ids) if p]
        if problems:
            raise SlotError('%s=%s cannot be used by slot %s: %s' % (variable, json.dumps(ids), slot, '; '.join(problems)))
        return sorted(ids)
    if len(gpus) < needed:
        raise SlotError('the model needs %d GPUs (tensor x pipeline x data parallel) and this host has %d: it does not'
                        ' fit this host' % (needed, len(gpus)))
    candidates = [i for i in gpus if why_not(i, False) is None]
    prefer = set() if beside else own
    if len(candidates) < needed and beside:
        candidates = [i for i in gpus if why_not(i, True) is None]
        prefer = {i for i in gpus if i not in own}  # after the cheapest links, the fewest shared GPUs
    if len(candidates) < needed:
        reasons = [why_not(i, True) for i in sorted(gpus) if why_not(i, True)]
        detail = (': ' + '; '.join(reasons)) if reasons else ''
        raise SlotError('slot %s needs %d GPUs but only %d are free on this host%s. Pivot or remove another slot first,'
                        ' or name the GPUs with %s' % (slot, needed, len(candidates), detail, variable))
    return _best_group(candidates, needed, matrix, prefer)


def shared_gpus(slot, slots, gpu_ids):
    """The GPUs of ``gpu_ids`` that the slot's running model holds: a blue/green pivot's new engine shares them."""
    return sorted(set(gpu_ids or []) & set((slots.get(slot) or {}).get('gpu_ids') or []))


def assign_port(slot, slots, catalog_port, requested=None, reserved=(), variable='port'):
    """The slot's port: the one it has (stable across pivots: its clients and the gateway use it), else
    ``requested``, else the model's catalog port when no other slot has it, else the lowest free one from 8000.
    A ``requested`` port other than the one a serving slot has is refused (a change of what the slot promises its
    clients). ``reserved``: ports that belong to something else on the host (a gateway)."""
    taken = {}
    for name, record in sorted(slots.items()):
        if name != slot and record.get('port'):
            taken[int(record['port'])] = 'slot %s' % name
        if name != slot and record.get('standby_port'):
            taken[int(record['standby_port'])] = 'slot %s (standby)' % name
        target = (intent_of(record) or {}).get('to') or {}
        if name != slot and target.get('port'):
            taken.setdefault(int(target['port']), 'slot %s (a pivot in progress)' % name)
    for port in reserved or ():
        taken.setdefault(int(port), 'the gateway')
    if requested not in (None, ''):
        try:
            port = int(requested)
        except (TypeError, ValueError):
            port = 0
        if not MIN_VLLM_PORT <= port <= MAX_PORT:
            raise SlotError('%s must be a TCP port in %d..%d (vLLM runs without privileges - CapabilityBoundingSet= is'
                            ' empty - so it cannot bind a port below %d), got %s'
                            % (variable, MIN_VLLM_PORT, MAX_PORT, MIN_VLLM_PORT, json.dumps(requested)))
        if port in taken:
            raise SlotError('%s=%d is already used by %s on this host; pick another port' % (variable, port, taken[port]))
        record = slots.get(slot) or {}
        if record.get('model') and record.get('port') and int(record['port']) != port:
            raise SlotError('%s=%d: slot %s serves %s on port %d, and a serving slot keeps its port (its clients and the'
                            ' gateway use it). Leave %s unset to keep port %d, or serve the model in a new slot on port'
                            ' %d (-e slot=NAME -e %s=%d). Nothing was changed.'
                            % (variable, port, slot, record['model'], int(record['port']), variable, int(record['port']),
                               port, variable, port))
        return port
    current = (slots.get(slot) or {}).get('port')
    for port in reserved or ():
        for name, record in sorted(slots.items()):
            if int(port) in (record.get('port'), record.get('standby_port')):
                raise SlotError('gateway_port %d is a port of slot %s; pick another gateway_port' % (int(port), name))
    if current and int(current) not in taken:
        return int(current)
    if catalog_port and int(catalog_port) not in taken:
        return int(catalog_port)
    port = FIRST_PORT
    while port in taken:
        port += 1
    return port


def assign_alias(slot, slots, requested=None, variable='alias'):
    """The name clients send as ``model`` for the slot (vLLM serves it first, the gateway routes by it): requested,
    else the one the slot has, else the slot's name. No two slots answer to one name."""
    alias = requested or (slots.get(slot) or {}).get('alias') or slot
    if not isinstance(alias, str) or not ALIAS_RE.match(alias):
        raise SlotError('%s must be a model alias of letters, digits and "._:/-" (at most 128), got %s'
                        % (variable, json.dumps(alias)))
    for name, record in sorted(slots.items()):
        if name != slot and alias in (record.get('alias') or name, record.get('model')):
            raise SlotError('%s=%s is already the name of slot %s (alias %s, model %s); give each slot its own alias'
                            % (variable, alias, name, record.get('alias') or name, record.get('model')))
    return alias


def standby_port(slot, slots, active_port, reserved=()):
    """The slot's second port, where the next model of a blue/green pivot starts: the one it has, else the lowest
    free one above the active port that no slot uses, else (at the top of the range) the highest free one below it;
    always in 1024..65535."""
    taken = {int(p) for p in reserved or ()} | {active_port}
    for name, record in slots.items():
        taken |= {int(p) for p in (record.get('port'), record.get('standby_port')) if p and name != slot}
    current = (slots.get(slot) or {}).get('standby_port')
    if current and int(current) not in taken and MIN_VLLM_PORT <= int(current) <= MAX_PORT:
        return int(current)
    for port in itertools.chain(range(active_port + 1, MAX_PORT + 1), range(active_port - 1, MIN_VLLM_PORT - 1, -1)):
        if port not in taken:
            return port
    raise SlotError('slot %s has no free standby port in %d..%d for a blue/green pivot' % (slot, MIN_VLLM_PORT, MAX_PORT))


def gateway_slots_before(slots, slot, alias, model, strategy, port, standby):
    """The host's slots as the gateway must see them before a pivot's switch: the planned slot's active server is the
    one serving now (blue/green: the old model's port, which the plan gives as ``standby``; the new model's ``port``
    is then its standby) or the port the new model will use (stop-then-start); the other slots as recorded."""
    active, other = (standby, port) if strategy in NEW_ON_STANDBY else (port, standby)
    view = {name: dict(record) for name, record in (slots or {}).items()}
    view[slot] = dict(view.get(slot) or {}, name=slot, alias=alias, model=model, port=active, standby_port=other)
    return view


def check_model_free(slot, model, slots):
    """A model serves in one slot of a host: its unit is named after it (a sleeping one too)."""
    for name, record in sorted(slots.items()):
        if name != slot and record.get('model') == model:
            raise SlotError('%s already serves in slot %s of this host; a model serves in one slot (pivot slot %s,'
                            ' or serve another model in slot %s)' % (model, name, name, slot))
        if name != slot and (asleep_of(record) or {}).get('model') == model:
            raise SlotError('%s sleeps in slot %s of this host (its previous model, until a timer stops it); a model'
                            ' serves in one slot (pivot slot %s back to it, or wait until it is stopped)'
                            % (model, name, name))


def asleep_of(record):
    """The slot's sleeping previous model (dict: model, unit, port, ..., since, until), or None."""
    asleep = (record or {}).get(ASLEEP_KEY)
    if isinstance(asleep, dict) and asleep.get('model') and asleep.get('unit') and asleep.get('port'):
        return asleep
    return None


def asleep_record(record, now, keep_s):
    """What the slot keeps of its committed model when a pivot puts it to sleep: where it is (unit, port, GPUs, its
    directory and commit) and until when a timer on the host lets it sleep."""
    kept = {k: (record or {}).get(k) for k in ASLEEP_FIELDS}
    return dict(kept, since=now, until=None if now is None else round(float(now) + int(keep_s), 3))


def asleep_paths(unit, state_dir=None):
    """What belongs to a model's unit while it sleeps: the answers it gave right before it was put to sleep (compared
    after a wake) and the transient timer on the host that stops it (systemd-run --unit=NAME makes NAME.timer)."""
    if not isinstance(unit, str) or not UNIT_RE.match(unit):
        raise SlotError('a sleeping model is named by its systemd unit such as vllm-m.service; got %s' % json.dumps(unit))
    stem = unit[:-len('.service')]
    return {'answers': os.path.join(state_paths(state_dir)['state_dir'], ASLEEP_DIR, stem + '.answers.json'),
            'timer': 'llmfleet-asleep-%s' % stem, 'timer_unit': 'llmfleet-asleep-%s.timer' % stem}


def as_bool(value, variable):
    """A boolean given as true/false or as a string from ``-e`` (true/false, yes/no, on/off, 1/0); None or "" when
    it was not given."""
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == '':
        return None
    if text in BOOL_TRUE:
        return True
    if text in BOOL_FALSE:
        return False
    raise SlotError('%s must be true or false (or left unset to keep what the slot has), got %s'
                    % (variable, json.dumps(value)))


def slot_gateway(record):
    """Whether the slot's model is behind the host's gateway, as the host recorded it. A slot recorded by an older
    release says nothing; it had a standby port only behind a gateway."""
    record = record or {}
    if isinstance(record.get('gateway'), bool):
        return record['gateway']
    return bool(record.get('model') and record.get('standby_port'))


def resolve_gateway(record, requested=None, variable='gateway'):
    """(on, source): the run's gateway setting when it was given ('given'), else the slot's ('kept'), else off for a
    slot that serves nothing yet ('default'). A later run without the flag keeps the slot behind its gateway."""
    wanted = as_bool(requested, variable)
    if wanted is not None:
        return wanted, 'given'
    if (record or {}).get('model'):
        return slot_gateway(record), 'kept'
    return False, 'default'


def resolve_hold(record, requested=None, variable='hold'):
    """(on, source): whether the gateway holds the slot's requests through a stop-then-start instead of answering 503:
    the run's setting when it was given ('given'), else the slot's ('kept': a record says ``hold: false`` only when
    it is off), else on for a slot that serves nothing yet ('default')."""
    wanted = as_bool(requested, variable)
    if wanted is not None:
        return wanted, 'given'
    record = record or {}
    if record.get('model'):
        return record.get('hold') is not False, 'kept'
    return True, 'default'


def contract(record, gateway, gateway_source, alias, alias_requested, port, port_requested, hold=True,
             hold_source='default'):
    """What the slot promises its clients after this run, each with where it comes from: given (this run), kept (the
    host's record) or default (a new slot)."""
    record = record or {}

    def source(requested, current, value):
        if requested not in (None, ''):
            return 'given'
        return 'kept' if current not in (None, '') and current == value else 'default'
    return {
        'gateway': {'value': gateway, 'source': gateway_source},
        'alias': {'value': alias, 'source': source(alias_requested, record.get('alias'), alias)},
        'port': {'value': port, 'source': source(port_requested, record.get('port'), port)},
        'hold': {'value': hold, 'source': hold_source},
    }


def intent_of(record):
    """The intent of a pivot in progress in the slot (dict), or None."""
    intent = (record or {}).get(INTENT_KEY)
    return intent if isinstance(intent, dict) and intent.get('phase') in (INTENT_SWITCHING, INTENT_COMMITTED) else None


def intent_record(record, target, strategy, owner=None, now=None):
    """The intent written before a pivot's first change to the host: what the slot served (``from``, its record as
    committed) and what it is about to serve (``to``: model, unit, revision, model_dir, port, standby_port, gpu_ids,
    profile)."""
    committed = {k: v for k, v in (record or {}).items() if k != INTENT_KEY}
    return {'phase': INTENT_SWITCHING, 'strategy': strategy, 'since': now, 'owner': owner,
            'from': committed if committed.get('model') else None,
            'to': dict(target, unit=target.get('unit') or unit_name(target['model']))}


def heal_changes_slot_port(record, intent):
    """Whether healing the slot's half-done pivot stops or starts a model on the slot's own port, so that the gateway
    must close and drain that port first: rolling back a pivot whose new model took the slot's port (stop-then-start,
    a revision), or rolling forward one that still has to stop the replaced model on it. Blue/green's new model is on
    the standby port, which the gateway did not route to yet."""
    port = (record or {}).get('port')
    if port is None or not intent:
        return False
    target, origin = intent.get('to') or {}, intent.get('from') or {}
    if intent.get('phase') != INTENT_COMMITTED:
        return target.get('port') == port
    return bool(origin) and origin.get('unit') != target.get('unit') and origin.get('port') == port


def heal_plan(record, intent):
    """What healing the slot's half-done pivot does (None when there is none): roll it ``forward`` (it passed its
    commit: the new model serves) or back to ``from`` (what the slot served before it, {} for nothing), and which
    units that stops or starts. ``stop_new`` - the new model's unit, when rolling back and it is not the old one's;
    ``restart_previous`` - the old model's unit again, when rolling back a pivot that reused it (a revision);
    ``stop_previous`` - the replaced model on the slot's port, when rolling forward; ``drain_previous`` - the replaced
    model on the other port (blue/green), drained at the gateway before its stop, when rolling forward."""
    if not intent:
        return None
    forward, target, origin = intent.get('phase') == INTENT_COMMITTED, intent.get('to') or {}, intent.get('from') or {}
    replaced = bool(origin) and origin.get('unit') != target.get('unit')
    on_slot_port = origin.get('port') == (record or {}).get('port')
    return {
        'forward': forward, 'from': origin, 'changes_slot_port': heal_changes_slot_port(record, intent),
        'stop_new': not forward and target.get('unit') != origin.get('unit', ''),
        'restart_previous': not forward and bool(origin) and target.get('unit') == origin.get('unit'),
        'stop_previous': forward and replaced and on_slot_port,
        'drain_previous': forward and replaced and not on_slot_port,
    }


def slot_units(slots):
    """The units of every slot, those of a pivot in progress included (its old and its new model), and sleeping ones."""
    units = set()
    for record in (slots or {}).values():
        intent = intent_of(record) or {}
        units |= {record.get('unit'), ((intent.get('from') or {}).get('unit')), (intent.get('to') or {}).get('unit'),
                  (asleep_of(record) or {}).get('unit')}
    return sorted(u for u in units if u)


def without_intent(record):
    return {k: v for k, v in (record or {}).items() if k != INTENT_KEY}
