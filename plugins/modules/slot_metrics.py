#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: slot_metrics
short_description: Write a host's slots and each slot's last pivot as metrics for node_exporter's textfile collector
version_added: "0.6.0"
description:
  - Reads the host's slot records (C(<state_dir>/slots.json)) and the pivot records the pivot keeps on the host
    (C(<state_dir>/pivots/*.json)) and writes C(llmfleet.prom) into node_exporter's textfile directory, atomically
    (node_exporter never reads half a file).
  - Per slot - the model it serves with its alias, revision, port and GPUs (C(llmfleet_slot_info)), since when, a pivot
    begun and not ended, a previous model asleep, and whether it serves the fleet's locked revision.
  - Per slot, its last pivot - result (C(passed), C(rolled_back), C(failed)), from and to which model, when it ended,
    downtime, load time, rollback time, the gate's output tokens per second with its 95% confidence interval, error
    ratio and inter-token latency at each concurrency.
  - The file is a function of the host's records only, so a re-run that finds nothing new changes nothing.
author:
  - llmfleet maintainers (@llmfleet)
options:
  state_dir:
    description: The host state's directory.
    type: path
    default: /var/lib/llmfleet
  textfile_dir:
    description: node_exporter's textfile directory (its C(--collector.textfile.directory)).
    type: path
    default: /var/lib/prometheus/node-exporter
  only_if_present:
    description: Write nothing (and say so) when O(textfile_dir) does not exist - no node_exporter reads it.
    type: bool
    default: true
  locks:
    description: The fleet's locked commit of each model (the rollout's revision locks), by model name.
    type: dict
    default: {}
extends_documentation_fragment:
  - llmfleet.vllm.attributes
"""

EXAMPLES = r"""
- name: Publish the host's slots and pivots to node_exporter
  llmfleet.vllm.slot_metrics:
    textfile_dir: /var/lib/prometheus/node-exporter
    locks: {minimax-m25: 0123456789abcdef0123456789abcdef01234567}
"""

RETURN = r"""
path:
  description: The textfile written (or that would be).
  returned: always
  type: str
written:
  description: Whether the textfile directory exists, so that the file is (or stays) there.
  returned: always
  type: bool
text:
  description: The metrics, in Prometheus' text format.
  returned: always
  type: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.vllm.plugins.module_utils import host_slots as hs
from ansible_collections.llmfleet.vllm.plugins.module_utils.atomic_write import atomic_write
from ansible_collections.llmfleet.vllm.plugins.module_utils.observability import TEXTFILE_NAME, slot_metrics_text
from ansible_collections.llmfleet.vllm.plugins.module_utils.results_paths import read_json_files


def _read(path):
    try:
        with open(path, encoding='utf-8') as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _load_record(path):
    return json.loads(_read(path) or 'null')


def _records(records_dir):
    # a record cut short by a crash (not JSON) says nothing; the slot's earlier record still does
    return read_json_files(records_dir, load=_load_record, broken=(ValueError,))


def main():
    module = AnsibleModule(argument_spec=dict(
        state_dir=dict(type='path', default=hs.DEFAULT_STATE_DIR),
        textfile_dir=dict(type='path', default='/var/lib/prometheus/node-exporter'),
        only_if_present=dict(type='bool', default=True),
        locks=dict(type='dict', default={}),
    ), supports_check_mode=True)
    p = module.params
    paths = hs.state_paths(p['state_dir'])
    try:
        slots, _migrated = hs.load_state(_read(paths['state_file']), _read(paths['legacy_state_file']))
    except hs.SlotError as exc:
        module.fail_json(msg=str(exc))
    text = slot_metrics_text(slots, _records(paths['records_dir']), p['locks'])
    path = os.path.join(p['textfile_dir'], TEXTFILE_NAME)
    present = os.path.isdir(p['textfile_dir'])
    if not present and p['only_if_present']:
        module.exit_json(changed=False, path=path, written=False, text=text)
    before = _read(path)
    changed = before != text
    if changed and not module.check_mode:
        atomic_write(path, text, mode=0o644)
    diff = {'before': before or '', 'after': text, 'before_header': path, 'after_header': path}
    module.exit_json(changed=changed, path=path, written=True, text=text, diff=diff)


if __name__ == '__main__':
    main()
