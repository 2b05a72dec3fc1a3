#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_slots
short_description: Read, plan and record what each slot of a host serves (models, revisions, GPUs, ports)
version_added: "0.2.0"
description:
  - A host serves one model per slot, each on its own GPUs and port. This module owns that state
    (C(<state_dir>/slots.json)); every role and playbook of the collection reads and writes it through here.
  - V(read) returns the slots. A host set up by an older release kept one model in C(current.json); it becomes the
    slot C(default), written to C(slots.json) on the first run that is not in check mode (C(current.json) is kept
    as C(current.json.migrated)).
  - V(plan) says where the next model of a slot goes, changing nothing - GPUs that no other slot holds and that
    have the memory free, preferring GPUs linked by NVLink or under one PCIe switch / NUMA node; the slot's port
    (stable across its pivots); the model directory for the resolved commit (a directory holds one revision, so
    another commit of a model already on disk goes to C(<model>--<sha12>)). It fails, naming the variable, when
    the request cannot be met.
  - V(set) records a slot after its model serves; V(absent) removes a slot's record.
  - What a slot promises its clients is host state kept across runs - its alias, its port and whether it is behind
    the gateway - a run that does not give O(alias), O(port) or O(gateway) keeps the slot's (RV(contract) says which
    came from where).
  - V(intend) writes the intent of a pivot before its first change to the host (RV(intent)); V(set) with
    O(commit_intent) marks it committed when the new model becomes the slot's; V(clear_intent) removes it once the
    host agrees with the record. A run that finds an intent knows a pivot was interrupted - rolled back to the
    record while V(switching), forward while V(committed).
  - A slot may keep its previous model asleep (vLLM's sleep mode) on its standby port - V(set) with O(asleep=previous)
    records it, V(plan) chooses V(wake) for it and V(sleep) to put the slot's model to sleep (O(sleep_previous)),
    V(clear_asleep) forgets it once it was stopped.
author:
  - llmfleet maintainers (@llmfleet)
options:
  action:
    description: What to do.
    type: str
    choices: [read, plan, set, absent, intend, clear_intent, clear_asleep]
    default: read
  state_dir:
    description: Directory of the host state. Defaults to C(/var/lib/llmfleet).
    type: path
  slot:
    description: Slot name (a lower-case letter, then up to 31 lower-case letters, digits or C(-)).
    type: str
    default: default
  model:
    description: Catalog name of the model (V(plan), V(set)).
    type: str
  profile:
    description: Serving profile of the model (V(set)).
    type: str
    default: ""
  revision:
    description: Commit sha the model is pinned to (V(plan), V(set)); null when it is not known (check mode).
    type: str
  models_root:
    description:
      - Directory of the model directories (V(plan); with any action, a slot migrated from C(current.json) gets
        its model directory, the commit its manifest records and the port of its unit).
    type: path
  model_dir:
    description: Directory the model is served from (V(set)).
    type: path
  catalog_port:
    description: The model's port in the catalog, used for a new slot when no other slot has it (V(plan)).
    type: int
  port:
    description: Port the slot must use (V(plan), checked against the other slots; V(set), recorded).
    type: int
  reserved_ports:
    description: Ports no slot may take (a gateway's).
    type: list
    elements: int
    default: []
  gpus_needed:
    description: GPUs the model needs (tensor x pipeline x data parallel); 0 on the CPU engine (V(plan)).
    type: int
    default: 0
  gpu_ids:
    description: GPU indexes (V(plan), explicit GPUs, checked; V(set), recorded).
    type: list
    elements: int
    default: []
  gpu_facts:
    description: The C(llmfleet_gpu) fact of M(llmfleet.vllm.gpu_facts) (GPUs with their memory, topology matrix).
    type: dict
    default: {}
  gpu_memory_utilization:
    description: Share of each GPU's memory the model claims (free memory below it makes a GPU busy).
    type: float
  variable_prefix:
    description: Prefix of the caller's variable names in error messages (e.g. C(pivot_) names C(pivot_gpu_ids)).
    type: str
    default: ""
  unit_dir:
    description: Directory of the systemd units (a slot migrated from C(current.json) takes its port from its unit).
    type: path
    default: /etc/systemd/system
  alias:
    description:
      - Name clients send as C(model) for the slot (served first by vLLM, routed by the gateway). V(plan) checks it
        against the other slots; empty keeps the slot's alias, else the slot's name.
    type: str
  standby_port:
    description: The slot's second port, where the next model of a blue/green pivot starts (V(set)).
    type: int
  gateway:
    description:
      - Whether the slot is behind the host's gateway (V(plan) gives it a standby port and may choose blue/green;
        V(set) records it). Null or empty keeps what the slot has (off for a new slot); true or false changes it.
    type: raw
  hold:
    description:
      - Whether the host's gateway holds the slot's requests through a stop-then-start pivot instead of answering 503
        (V(plan) says it in RV(contract), V(set) records it). Null or empty keeps what the slot has (on for a new slot).
    type: raw
  strategy:
    description: How the pivot replaces the slot's model (V(intend)), the RV(strategy) of V(plan).
    type: str
  owner:
    description: Who pivots (V(intend)), e.g. the run's C(llmfleet.vllm.host_lock) owner.
    type: dict
  commit_intent:
    description:
      - With V(set), a pivot intent of the slot becomes V(committed) instead of being removed (the old model still has
        to stop; a re-run rolls forward).
    type: bool
    default: false
  blue_green:
    description:
      - With O(gateway), start a different model beside the old one when GPUs no slot holds are free for it, or when
        the slot's own GPUs have its share of memory free with the old model running (RV(shared_gpu_ids)), switch
        the gateway, then stop the old one (V(plan) returns RV(strategy)).
    type: bool
    default: true
  sleep_previous:
    description:
      - With O(gateway) and no blue/green, put the slot's model to sleep instead of stopping it when its unit was started
        with sleep mode (the slot's C(sleep_mode)); V(plan) returns RV(strategy) V(sleep). A pivot to the slot's
        sleeping model is a V(wake) either way; this option also puts the model it replaces to sleep.
    type: bool
    default: false
  asleep_alive:
    description:
      - Whether the slot's sleeping previous model (its C(asleep) record) still sleeps (its server answered
        C(/is_sleeping)); V(plan) wakes it only then.
    type: bool
    default: false
  sleep_mode:
    description: Whether the slot's model was started with vLLM's sleep mode (V(set)); null keeps what the slot has for the same model.
    type: bool
  asleep:
    description:
      - The slot's sleeping previous model (V(set)) - V(keep) what the slot has for the same model, V(previous) the model
        the new one replaces (put to sleep by the pivot, until O(keep_previous_s) from now), V(none) no sleeping model.
      - V(clear_asleep) removes it from the slot's record (it was stopped).
    type: str
    choices: [keep, previous, none]
    default: keep
  keep_previous_s:
    description: Seconds the sleeping previous model is kept (V(set) with O(asleep=previous)), recorded as its C(until).
    type: int
  fast_start:
    description:
      - V(plan) - the new model starts behind the fast start launcher, armed while the old one serves. A stop-then-start
        to another revision of the model the slot serves then takes the model's other unit (C(vllm-<model>.service) and
        C(vllm-<model>-alt.service) take turns), returned as RV(unit).
    type: bool
    default: false
  unit:
    description:
      - V(set), V(intend) - the unit that serves (or will serve) the model, as V(plan) returned it; default
        C(vllm-<model>.service).
    type: str
  since:
    description: When the slot's model began to serve, seconds since the epoch (V(set)).
    type: float
  previous:
    description: What the slot served before (V(set)), e.g. C({model, revision, model_dir}).
    type: dict
attributes:
  check_mode:
    description: V(read) and V(plan) run the same; V(set), V(absent), V(intend) and V(clear_intent) report what they would write.
  diff_mode:
    description: V(set) and V(absent) return the state file before and after.
extends_documentation_fragment:
  - llmfleet.vllm.attributes.diff
seealso:
  - module: llmfleet.vllm.gpu_facts
"""

EXAMPLES = r"""
- name: Read what each slot serves
  llmfleet.vllm.host_slots:
  register: slots

- name: Plan slot b for a TP4 model on an 8-GPU PCIe host (GPUs under one NUMA node, a port of its own)
  llmfleet.vllm.host_slots:
    action: plan
    slot: b
    model: minimax-m25
    revision: 0123456789abcdef0123456789abcdef01234567
    models_root: /srv/models
    catalog_port: 8000
    gpus_needed: 4
    gpu_facts: "{{ ansible_facts.llmfleet_gpu }}"
  register: plan

- name: Record the slot once its model serves
  llmfleet.vllm.host_slots:
    action: set
    slot: b
    model: minimax-m25
    revision: "{{ plan.revision }}"
    model_dir: "{{ plan.model_dir }}"
    gpu_ids: "{{ plan.gpu_ids }}"
    port: "{{ plan.port }}"
    since: "{{ now(utc=true).timestamp() }}"
"""

RETURN = r"""
slots:
  description: The host's slots by name (after the action), each with model, profile, revision, model_dir, gpu_ids, port, unit, since, previous.
  returned: always
  type: dict
  sample: {default: {name: default, model: tiny-llama-a, revision: 3f1c0b6d5e0f4b7a8e2d1c9b8a7f6e5d4c3b2a10, gpu_ids: [], port: 8001,
           unit: vllm-tiny-llama-a.service, model_dir: /srv/models/tiny-llama-a, since: 1764750000.0, previous: null}}
slot:
  description: The named slot's record before the action; null when the slot is new.
  returned: always
  type: dict
state_dir:
  description: Directory of the host state.
  returned: always
  type: str
  sample: /var/lib/llmfleet
records_dir:
  description: Directory of the host's pivot records.
  returned: always
  type: str
  sample: /var/lib/llmfleet/pivots
migrated:
  description: Whether the slots came from an older release's current.json.
  returned: always
  type: bool
gpu_ids:
  description: GPUs the slot gets (V(plan)).
  returned: when action is plan
  type: list
  elements: int
  sample: [4, 5, 6, 7]
port:
  description: Port the slot gets (V(plan)).
  returned: when action is plan
  type: int
  sample: 8001
unit:
  description: systemd unit of the model (V(plan)).
  returned: when action is plan
  type: str
  sample: vllm-minimax-m25.service
model_dir:
  description: Directory for the model at the revision (V(plan)).
  returned: when action is plan
  type: str
  sample: /srv/models/minimax-m25
serving_same:
  description: Whether the slot already serves this model at this revision (V(plan)).
  returned: when action is plan
  type: bool
strategy:
  description:
    - How the model is replaced (V(plan)) - V(none), V(new), V(blue_green), V(stop_start), V(sleep) (the old model sleeps on
      the standby port, the new one starts on its GPUs) or V(wake) (the slot's sleeping model is the target).
  returned: when action is plan
  type: str
switch:
  description:
    - The switch a pivot runs for RV(strategy) (V(plan)) - V(blue_green), V(sleep) (also for V(wake)) or V(stop_start)
      (also for V(new) and V(none)).
  returned: when action is plan
  type: str
sleeps_previous:
  description: Whether the pivot puts the slot's model to sleep instead of stopping it (V(plan)).
  returned: when action is plan
  type: bool
stops_asleep:
  description: Whether the slot's sleeping model must stop before the switch (V(plan)); it is not the target.
  returned: when action is plan
  type: bool
asleep:
  description: The slot's sleeping previous model as recorded (V(plan)); null when none.
  returned: when action is plan
  type: dict
strategy_reason:
  description: Why not blue/green (V(plan)).
  returned: when action is plan
  type: str
gateway_slots_before:
  description:
    - The host's slots as the gateway must see them before the switch (V(plan)) - the planned slot's active port is the
      one serving now (blue/green - the old model's; the new model's port is its standby) or the port the new model
      will use (stop-then-start).
  returned: when action is plan
  type: dict
shared_gpu_ids:
  description:
    - GPUs a blue/green pivot's new model shares with the slot's running one (V(plan)); each had the new model's share
      of memory (gpu_memory_utilization x total) free when planned, and the pivot checks again right before the start.
  returned: when action is plan
  type: list
  elements: int
  sample: [0]
alias:
  description: Name clients send as C(model) for the slot (V(plan)).
  returned: when action is plan
  type: str
standby_port:
  description: The slot's other port (V(plan) with O(gateway)); null without a gateway.
  returned: when action is plan
  type: int
gateway:
  description: Whether the slot is behind the host's gateway after this run (given, else kept, else false).
  returned: always
  type: bool
hold:
  description: Whether the gateway holds the slot's requests through a stop-then-start after this run (given, else kept, else true).
  returned: always
  type: bool
contract:
  description: What the slot promises its clients (V(plan)) - C(gateway), C(alias), C(port), C(hold), each C({value, source}) with
    source C(given) (this run), C(kept) (the host's record) or C(default).
  returned: when action is plan
  type: dict
intent:
  description: The slot's pivot in progress (C(phase) switching or committed, C(from), C(to), C(strategy), C(since), C(owner)); null when none.
  returned: always
  type: dict
heal:
  description:
    - What healing the slot's pivot in progress (RV(intent)) does; null when there is none. C(forward) (it passed its
      commit) or back to C(from) (what the slot served, {} for nothing); C(changes_slot_port) - it stops or starts a
      model on the slot's own port, which the gateway must close and drain first; the units it stops or starts -
      C(stop_new) (rolling back), C(restart_previous) (rolling back a pivot that reused the old unit), C(stop_previous)
      (rolling forward, the replaced model on the slot's port), C(drain_previous) (rolling forward, the replaced model on
      the other port, drained at the gateway first).
  returned: always
  type: dict
units:
  description: The units of every slot (to tell them from servers the collection does not manage).
  returned: always
  type: list
  elements: str
"""

import json
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.vllm.plugins.module_utils import host_slots as hs
from ansible_collections.llmfleet.vllm.plugins.module_utils.atomic_write import atomic_write, replace_durably

PORT_ARG_RE = re.compile(r'^ExecStart=.*\s--port\s+([0-9]+)', re.M)


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _write_atomic(path, text):
    # The file and its directory fsynced: after a power loss slots.json is the old state or the new one.
    atomic_write(path, text, mode=0o644)


def _unit_port(unit_dir, unit):
    match = PORT_ARG_RE.search(_read(os.path.join(unit_dir, unit)) or '')
    return int(match.group(1)) if match else None


def _completed(record, models_root, unit_dir):
    """A slot migrated from current.json, completed from the host: the model's directory, the commit its manifest
    records and the port its unit listens on."""
    if record.get('model_dir') or not record.get('model'):
        return record
    return dict(record, model_dir=os.path.join(models_root, record['model']),
                revision=record.get('revision') or hs.manifest_commit(models_root, record['model']),
                port=record.get('port') or _unit_port(unit_dir, record.get('unit') or hs.unit_name(record['model'])),
                gpu_ids=record.get('gpu_ids') or [])


def _plan(module, slots, result):
    p = module.params
    prefix = p['variable_prefix']
    if not p['model'] or not p['models_root']:
        module.fail_json(msg='action=plan needs model and models_root', **result)
    hs.check_model_free(p['slot'], p['model'], slots)
    revision = p['revision'] or None
    if revision is not None and not hs.COMMIT_RE.match(revision):
        module.fail_json(msg='%srevision must be resolved to a 40-hex commit sha before planning, got %s'
                         % (prefix, json.dumps(revision)), **result)
    names = hs.model_dir_candidates(p['model'], revision)
    dir_name = hs.model_dir_name(p['model'], revision, {n: hs.manifest_commit(p['models_root'], n) for n in names})
    current = slots.get(p['slot']) or {}
    model_dir = os.path.join(p['models_root'], dir_name)
    serving_same = (bool(current) and current.get('model') == p['model'] and current.get('revision') in (revision, None)
                    and current.get('model_dir') in (model_dir, None))
    alias = hs.assign_alias(p['slot'], slots, requested=p['alias'], variable=prefix + 'alias')
    port = hs.assign_port(p['slot'], slots, p['catalog_port'], requested=p['port'], reserved=p['reserved_ports'],
                          variable=prefix + 'port')
    standby = hs.standby_port(p['slot'], slots, port, reserved=p['reserved_ports']) if result['gateway'] else None
    strategy, why = _strategy(p, result['gateway'], current, serving_same, model_dir)
    gpu_ids = None
    asleep = hs.asleep_of(current)
    if strategy == 'wake':
        gpu_ids, port, standby = asleep.get('gpu_ids') or [], int(asleep['port']), port
    if strategy == 'blue_green':
        try:
            gpu_ids = hs.assign_gpus(p['slot'], p['gpus_needed'], p['gpu_facts'], slots, requested=p['gpu_ids'],
                                     memory_fraction=p['gpu_memory_utilization'], variable=prefix + 'gpu_ids', beside=True)
        except hs.SlotError as exc:
            strategy, why = _sleep_or_stop(p, current, 'the new model does not fit beside the old one (%s)' % exc)
    if strategy in ('blue_green', 'sleep'):
        port, standby = standby, port  # the new model starts on the standby port; the old one's becomes standby
    if gpu_ids is None:
        gpu_ids = hs.assign_gpus(p['slot'], p['gpus_needed'], p['gpu_facts'], slots, requested=p['gpu_ids'],
                                 memory_fraction=p['gpu_memory_utilization'], variable=prefix + 'gpu_ids')
    result.update(gpu_ids=gpu_ids, port=port, standby_port=standby, alias=alias,
                  unit=hs.planned_unit(p['model'], current, strategy, p['fast_start']),
                  model_dir=model_dir, serving_same=serving_same, strategy=strategy, strategy_reason=why,
                  switch=hs.switch_of(strategy),
                  shared_gpu_ids=hs.shared_gpus(p['slot'], slots, gpu_ids) if strategy == 'blue_green' else [],
                  gateway_slots_before=hs.gateway_slots_before(slots, p['slot'], alias, p['model'], strategy, port,
                                                               standby),
                  # The old model sleeps instead of stopping: sleep, or a wake whose current model has sleep mode.
                  sleeps_previous=strategy == 'sleep' or (strategy == 'wake' and p['sleep_previous']
                                                          and current.get('sleep_mode') is True),
                  # The slot's sleeping model (as recorded) when this pivot does not wake it: stopped before the switch
                  # (it holds the standby port), whether it still sleeps or not.
                  stops_asleep=bool(asleep) and strategy not in ('wake', 'none'),
                  asleep=asleep,
                  contract=hs.contract(current, result['gateway'], result['gateway_source'], alias, p['alias'],
                                       standby if strategy in hs.NEW_ON_STANDBY else port, p['port'], result['hold'],
                                       result['hold_source']))
    module.exit_json(**result)


def _strategy(p, gateway, current, serving_same, model_dir):
    """How the slot's model is replaced: none, new (nothing served), wake (the slot's sleeping previous model is the
    target), blue_green (the new model starts beside the old one, the gateway switches, then the old one stops), sleep
    (the old one sleeps, the new one starts on its GPUs) or stop_start; and why not blue_green."""
    if serving_same:
        return 'none', 'already serves it'
    if not current.get('model'):
        return 'new', 'nothing served in the slot'
    asleep = hs.asleep_of(current) if p['asleep_alive'] else None
    if (asleep and asleep['model'] == p['model'] and asleep.get('revision') in (p['revision'] or None, None)
            and asleep.get('model_dir') in (model_dir, None)):
        return 'wake', '%s sleeps on port %d' % (asleep['model'], int(asleep['port']))
    if not gateway:
        return 'stop_start', 'no gateway in front of the slot'
    if current.get('model') == p['model']:
        return 'stop_start', 'another revision of the same model (one unit per model)'
    if not p['blue_green']:
        return _sleep_or_stop(p, current, 'blue/green switched off')
    return 'blue_green', ''


def _sleep_or_stop(p, current, why):
    """Not blue/green: the old model sleeps when asked to (pivot_sleep_previous) and its unit has sleep mode."""
    if p['sleep_previous'] and current.get('sleep_mode') is True:
        return 'sleep', why
    if p['sleep_previous']:
        why += '; %s was started without sleep mode, so it stops (the new model starts with it)' % current['model']
    return 'stop_start', why


def _kept_unit(current, model):
    """The slot's unit when it serves ``model`` already (a fast start may have moved it to the model's other unit),
    else the model's first unit."""
    current = hs.without_intent(current)
    if current.get('model') == model and current.get('unit'):
        return current['unit']
    return hs.unit_name(model)


def _set_record(p, current, gateway, hold):
    """The slot's record once its model serves; a pivot intent is removed, or kept as committed (commit_intent)."""
    record = {
        'name': p['slot'], 'model': p['model'], 'profile': p['profile'], 'revision': p['revision'] or None,
        'model_dir': p['model_dir'], 'gpu_ids': p['gpu_ids'], 'port': p['port'],
        # Not given: the slot's own unit when it serves this model already (a fast start may have moved it to the
        # model's other unit), else the model's first one.
        'unit': p['unit'] or _kept_unit(current, p['model']),
        'since': p['since'] if p['since'] is not None else round(time.time(), 3), 'previous': p['previous'],
        'alias': p['alias'] or (current or {}).get('alias') or p['slot'],
        'standby_port': p['standby_port'] or (current or {}).get('standby_port'), 'gateway': gateway}
    # Holding is the default: recorded only when off, so that the record of a slot that holds stays as it was.
    if hold is False:
        record['hold'] = False
    committed = hs.without_intent(current)
    same_model = committed.get('model') == p['model']
    # Sleep mode and the sleeping previous model: as given, else what the slot has for the same model.
    # Recorded only when set, so that the record of a slot that never sleeps stays as it was.
    if p['sleep_mode'] if p['sleep_mode'] is not None else same_model and committed.get('sleep_mode') is True:
        record['sleep_mode'] = True
    if p['asleep'] == 'previous':  # the model this pivot replaces sleeps
        asleep = hs.asleep_record(committed, round(time.time(), 3), p['keep_previous_s'] or 0)
    else:
        asleep = committed.get(hs.ASLEEP_KEY) if p['asleep'] == 'keep' and same_model else None
    if asleep:
        record[hs.ASLEEP_KEY] = asleep
    if committed.get('model') and all(committed.get(k) == record.get(k) for k in set(record) | set(committed)
                                      if k not in ('since', 'previous', hs.INTENT_KEY)):
        record = committed  # the same model where it was: keep when it began and what came before
    intent = hs.intent_of(current)
    if intent and p['commit_intent']:
        record = dict(record, **{hs.INTENT_KEY: dict(intent, phase=hs.INTENT_COMMITTED)})
    return record


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type='str', default='read', choices=['read', 'plan', 'set', 'absent', 'intend', 'clear_intent',
                                                             'clear_asleep']),
            state_dir=dict(type='path'),
            slot=dict(type='str', default=hs.DEFAULT_SLOT),
            model=dict(type='str'),
            profile=dict(type='str', default=''),
            revision=dict(type='str'),
            models_root=dict(type='path'),
            model_dir=dict(type='path'),
            catalog_port=dict(type='int'),
            port=dict(type='int'),
            reserved_ports=dict(type='list', elements='int', default=[]),
            gpus_needed=dict(type='int', default=0),
            gpu_ids=dict(type='list', elements='int', default=[]),
            gpu_facts=dict(type='dict', default={}),
            gpu_memory_utilization=dict(type='float'),
            variable_prefix=dict(type='str', default=''),
            since=dict(type='float'),
            previous=dict(type='dict'),
            unit_dir=dict(type='path', default='/etc/systemd/system'),
            alias=dict(type='str'),
            standby_port=dict(type='int'),
            gateway=dict(type='raw'),
            hold=dict(type='raw'),
            strategy=dict(type='str'),
            owner=dict(type='dict'),
            commit_intent=dict(type='bool', default=False),
            blue_green=dict(type='bool', default=True),
            sleep_previous=dict(type='bool', default=False),
            asleep_alive=dict(type='bool', default=False),
            sleep_mode=dict(type='bool'),
            asleep=dict(type='str', default='keep', choices=['keep', 'previous', 'none']),
            keep_previous_s=dict(type='int'),
            fast_start=dict(type='bool', default=False),
            unit=dict(type='str'),
        ),
        required_if=[('action', 'set', ('model', 'model_dir', 'port')),
                     ('action', 'intend', ('model', 'model_dir', 'port', 'strategy'))],
        supports_check_mode=True,
    )
    p = module.params
    if p['unit'] and not hs.UNIT_RE.match(p['unit']):
        module.fail_json(msg='unit must be NAME.service (letters, digits, @ . _ : -), got %s' % json.dumps(p['unit']))
    paths = hs.state_paths(p['state_dir'])
    try:
        hs.check_slot_name(p['slot'], p['variable_prefix'] + 'slot')
        slots, migrated = hs.load_state(_read(paths['state_file']), _read(paths['legacy_state_file']))
    except hs.SlotError as exc:
        module.fail_json(msg='%s (%s)' % (exc, paths['state_file']))
    before_text = hs.dump_state(slots)
    if p['models_root']:
        # Slots migrated from current.json say neither directory nor commit: the model's directory and its manifest do.
        slots = {name: _completed(record, p['models_root'], p['unit_dir']) for name, record in slots.items()}
    current = slots.get(p['slot'])
    try:
        gateway, gateway_source = hs.resolve_gateway(current, p['gateway'], p['variable_prefix'] + 'gateway')
        hold, hold_source = hs.resolve_hold(current, p['hold'], p['variable_prefix'] + 'hold')
    except hs.SlotError as exc:
        module.fail_json(msg=str(exc))
    result = dict(changed=False, slots=slots, slot=current, migrated=migrated, gateway=gateway,
                  gateway_source=gateway_source, hold=hold, hold_source=hold_source, intent=hs.intent_of(current),
                  heal=hs.heal_plan(current, hs.intent_of(current)),
                  state_dir=paths['state_dir'], records_dir=paths['records_dir'], units=hs.slot_units(slots))
    if p['action'] == 'plan':
        try:
            _plan(module, slots, result)
        except hs.SlotError as exc:
            module.fail_json(msg=str(exc), **result)

    after = dict(slots)
    if p['action'] == 'set':
        after[p['slot']] = _set_record(p, current, gateway, hold)
    elif p['action'] == 'absent':
        after.pop(p['slot'], None)
    elif p['action'] == 'intend':
        target = {k: p[k] for k in ('model', 'profile', 'model_dir', 'port', 'standby_port', 'gpu_ids')}
        if p['unit']:
            target['unit'] = p['unit']
        target.update(revision=p['revision'] or None, alias=p['alias'], gateway=gateway)
        after[p['slot']] = dict(current or {'name': p['slot']}, **{hs.INTENT_KEY: hs.intent_record(
            current, target, p['strategy'], owner=p['owner'], now=round(time.time(), 3))})
    elif p['action'] == 'clear_asleep' and current and hs.ASLEEP_KEY in current:
        after[p['slot']] = {k: v for k, v in current.items() if k != hs.ASLEEP_KEY}
    elif p['action'] == 'clear_intent' and current:
        # A slot whose first model never got recorded goes with its intent.
        if current.get('model'):
            after[p['slot']] = hs.without_intent(current)
        else:
            after.pop(p['slot'])
    after_text = hs.dump_state(after)
    write = p['action'] != 'plan' and (after_text != before_text or migrated)
    result.update(changed=write, slots=after, units=hs.slot_units(after))
    if module._diff and write:
        result['diff'] = {'before': before_text if not migrated else '', 'after': after_text,
                          'before_header': paths['state_file'], 'after_header': paths['state_file']}
    if write and not module.check_mode:
        _write_atomic(paths['state_file'], after_text)
        if migrated:
            replace_durably(paths['legacy_state_file'], paths['legacy_state_file'] + '.migrated')
    module.exit_json(**result)


if __name__ == '__main__':
    main()
