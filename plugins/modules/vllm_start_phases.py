#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_start_phases
short_description: Say where a vLLM unit's last start spent its time, read from its own log
version_added: "0.7.0"
description:
  - Reads the journal of O(unit) since its main process started and cuts that start at the lines vLLM writes on its
    way to serving (the same landmarks in vLLM 0.26 CUDA and 0.32 CPU) and at the C(llmfleet-launch:) lines of the fast
    start launcher - imports (or the launcher's go), configuration and the engine process, weights, compile and
    profiling, CUDA graphs, warm-up, the API server, the first good C(/health) (O(ready_at)).
  - vLLM stamps its lines to the second, so each phase is good to about a second; what vLLM measured itself (weights,
    graphs, compilation) is returned beside the phases at its own precision.
  - Reads only; changes nothing.
author:
  - llmfleet maintainers (@llmfleet)
options:
  unit:
    description: The systemd unit that serves the model, e.g. C(vllm-minimax-m25.service).
    type: str
    required: true
  ready_at:
    description: Epoch seconds of the first good C(/health) of that start (the caller's); without it the last phase is open.
    type: float
extends_documentation_fragment:
  - llmfleet.vllm.attributes
"""

EXAMPLES = r"""
- name: Read where the start went
  llmfleet.vllm.vllm_start_phases:
    unit: vllm-minimax-m25.service
    ready_at: "{{ service_deploy_ready_at }}"
  register: start

- name: Show the phases
  ansible.builtin.debug:
    msg: "{{ start.phases }}"
"""

RETURN = r"""
started_at:
  description: Epoch seconds the unit's main process started (systemd's C(ExecMainStartTimestamp)); null when it never ran.
  returned: always
  type: float
phases:
  description:
    - Seconds of each phase - imports (null behind the launcher, whose imports ran before its go),
      config_and_engine_process, weights, compile_and_profile, cuda_graphs, warmup, api_server, first_health; null
      where a landmark is missing.
  returned: always
  type: dict
  sample: {"weights": 2.8, "compile_and_profile": 13.8, "cuda_graphs": 2.4, "warmup": 11.9, "first_health": 0.5}
reported:
  description: What vLLM measured itself - weights_load_s, graphs_s, compilation_s, engine_init_s (where it said so).
  returned: always
  type: dict
launcher:
  description: The launcher's import_s, prefetch_s, prefetch_bytes, go_at and multiproc_method; absent without the launcher.
  returned: when the unit started behind the launcher
  type: dict
from_go_s:
  description: Seconds from the launcher's go to O(ready_at).
  returned: when the unit started behind the launcher
  type: float
total_s:
  description: Seconds from the main process start to O(ready_at).
  returned: always
  type: float
spawn_forced:
  description: Whether vLLM said it had to spawn its engine process (CUDA initialised before the fork).
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.vllm.plugins.module_utils.vllm_start_phases import start_phases


def main():
    module = AnsibleModule(argument_spec=dict(unit=dict(type='str', required=True), ready_at=dict(type='float')),
                           supports_check_mode=True)
    unit = module.params['unit']
    rc, out, err = module.run_command(['systemctl', 'show', '-P', 'ExecMainStartTimestamp', '--timestamp=unix', unit])
    stamp = out.strip().lstrip('@') if rc == 0 else ''
    if not stamp:
        module.exit_json(changed=False, started_at=None, phases={}, reported={}, total_s=None, spawn_forced=False)
    started_at = float(stamp)
    rc, out, err = module.run_command(['journalctl', '--no-pager', '-o', 'cat', '-u', unit, '--since', '@%d' % int(started_at)])
    if rc != 0:
        module.fail_json(msg='journalctl -u %s failed: %s' % (unit, err.strip()))
    result = start_phases(out.splitlines(), started_at, module.params['ready_at'])
    result.pop('landmarks', None)
    module.exit_json(changed=False, started_at=started_at, **result)


if __name__ == '__main__':
    main()
