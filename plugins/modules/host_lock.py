#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_lock
short_description: The host's pivot lock - one run at a time plans and changes a host's slots
version_added: "0.3.0"
description:
  - Two runs on one host (two slots pivoted at once, an operator's pivot during a rollout) would plan the same GPUs and
    port from the same state and stop each other's units. A run takes this lock before it reads the slots and gives
    it back when it ends, failed or not.
  - The lock is a file, C(<state_dir>/pivot.lock), naming its owner (the run, as C(lookup('llmfleet.vllm.controller_run'))
    returns it), what it does and since when; it is replaced atomically under C(flock), so two runs never both get it.
  - A run killed with its controller leaves the lock behind. Its owner is recorded, so the next run from the same
    controller sees that it is gone (C(llmfleet.vllm.controller_run_alive)) and takes it over with O(takeover); from
    another controller only an explicit O(takeover) does.
author:
  - llmfleet maintainers (@llmfleet)
options:
  state:
    description: V(present) takes the lock (RV(acquired) false when another run holds it; the module does not fail), V(absent) gives it back.
    type: str
    choices: [present, absent]
    default: present
  state_dir:
    description: Directory of the host state. Defaults to C(/var/lib/llmfleet).
    type: path
  owner:
    description: The run taking or giving back the lock (C(id) required; controller, boot_id, pid, started recorded).
    type: dict
    required: true
  purpose:
    description: What the run does, shown to a run that finds the lock held (e.g. C(pivot slot default to tiny-llama-b)).
    type: str
    default: ""
  takeover:
    description: The C(id) of a holder that is gone; its lock is replaced (only while that holder still has it).
    type: str
attributes:
  check_mode:
    description: Reports whether the lock would be taken; writes nothing.
  diff_mode:
    description: The lock file is bookkeeping of a run; no diff is shown.
extends_documentation_fragment:
  - llmfleet.vllm.attributes
seealso:
  - module: llmfleet.vllm.host_slots
"""

EXAMPLES = r"""
- name: Take the host's pivot lock
  llmfleet.vllm.host_lock:
    owner: "{{ lookup('llmfleet.vllm.controller_run') }}"
    purpose: pivot slot default to minimax-m25
  register: lock

- name: Give it back
  llmfleet.vllm.host_lock:
    state: absent
    owner: "{{ lookup('llmfleet.vllm.controller_run') }}"
"""

RETURN = r"""
acquired:
  description: Whether this run holds the lock now (V(present)).
  returned: always
  type: bool
holder:
  description: The lock as it was found (owner, purpose, since); null when it was free.
  returned: always
  type: dict
path:
  description: The lock file.
  returned: always
  type: str
  sample: /var/lib/llmfleet/pivot.lock
"""

import fcntl
import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.vllm.plugins.module_utils import host_slots as hs

LOCK_FILE = 'pivot.lock'


def _read_lock(path):
    try:
        with open(path) as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) and isinstance(data.get('owner'), dict) else {'owner': {'id': '?'}}
    except FileNotFoundError:
        return None
    except ValueError:
        return {'owner': {'id': 'unreadable'}}  # a torn write: only a takeover replaces it


def _write_lock(path, data):
    tmp = '%s.tmp-%d' % (path, os.getpid())
    with open(tmp, 'w') as handle:
        json.dump(data, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type='str', default='present', choices=['present', 'absent']),
            state_dir=dict(type='path'),
            owner=dict(type='dict', required=True),
            purpose=dict(type='str', default=''),
            takeover=dict(type='str'),
        ),
        supports_check_mode=True,
    )
    p = module.params
    owner_id = str(p['owner'].get('id') or '')
    if not owner_id:
        module.fail_json(msg='owner must have an id (lookup("llmfleet.vllm.controller_run"))')
    state_dir = hs.state_paths(p['state_dir'])['state_dir']
    path = os.path.join(state_dir, LOCK_FILE)
    result = dict(changed=False, acquired=False, holder=None, path=path)
    if module.check_mode and not os.path.isdir(state_dir):
        result['acquired'] = p['state'] == 'present'
        module.exit_json(**result)
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    # flock serialises the read-compare-replace of the lock file between runs on this host.
    with open(path + '.flock', 'a') as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        holder = _read_lock(path)
        result['holder'] = holder
        held_by = (holder or {}).get('owner', {}).get('id')
        if p['state'] == 'absent':
            if held_by == owner_id:
                result['changed'] = True
                if not module.check_mode:
                    os.unlink(path)
            module.exit_json(**result)
        if holder is None or held_by == owner_id or (p['takeover'] and held_by == p['takeover']):
            result.update(acquired=True, changed=held_by != owner_id)
            if result['changed'] and not module.check_mode:
                _write_lock(path, {'owner': p['owner'], 'purpose': p['purpose'], 'since': round(time.time(), 3),
                                   'took_over': held_by if holder is not None else None})
    module.exit_json(**result)


if __name__ == '__main__':
    main()
