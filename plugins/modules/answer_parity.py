#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: answer_parity
short_description: Ask a vLLM server the parity probes greedily and return its answers with their parity key
version_added: "0.5.0"
description:
  - Sends each probe to C(/v1/completions) with temperature 0, a fixed seed, C(ignore_eos), C(logprobs=2) and
    C(return_tokens_as_token_ids), one request at a time, and returns the token ids, their logprobs and the top-1/top-2
    margin of every position. With O(tool_probe), one chat completion with that tool offered (C(tool_choice=auto)).
  - Reads the engine's version from C(/version) and returns the parity key - a digest of the weights (O(key_parts)),
    that version and the serving settings that change the numerics (C(NUMERIC_SERVING_KEYS) in
    C(module_utils/answer_parity.py)). A different key is a different record, never a failure.
  - Only asks; compares nothing (P(llmfleet.vllm.parity_compare#filter) does, on the controller). Runs the same in
    check mode.
author:
  - llmfleet maintainers (@llmfleet)
options:
  base_url:
    description: The server, for example C(http://127.0.0.1:8001) (the unit's own port, not the gateway).
    type: str
    required: true
  model:
    description: The served model name to ask.
    type: str
    required: true
  api_key:
    description: Bearer key of the server; empty for none.
    type: str
    default: ""
  probes:
    description: The prompts, each C({name, prompt}) (C(expect) is ignored here).
    type: list
    elements: dict
    required: true
  tool_probe:
    description: C({prompt, tool {name, description, parameters}}); null for none.
    type: dict
  max_tokens:
    description: Tokens generated per probe (all of them - C(ignore_eos)).
    type: int
    default: 16
  seed:
    description: The requests' seed.
    type: int
    default: 0
  key_parts:
    description: C({repo, commit, serving, quantization, patches}) of what the server serves; the engine's version is added here.
    type: dict
    required: true
  timeout_s:
    description: Seconds one request may take.
    type: float
    default: 120
extends_documentation_fragment:
  - llmfleet.vllm.attributes
"""

EXAMPLES = r"""
- name: Ask the new server the parity probes
  llmfleet.vllm.answer_parity:
    base_url: http://127.0.0.1:8001
    model: tiny-llama-a
    probes: "{{ entry | llmfleet.vllm.parity_probes }}"
    key_parts: {repo: "{{ entry.repo }}", commit: "{{ commit }}", serving: "{{ entry.serving }}"}
  register: probe

- name: Compare with the golden record
  ansible.builtin.set_fact:
    parity: "{{ probe | llmfleet.vllm.parity_compare(record) }}"
"""

RETURN = r"""
key:
  description: The parity key - C(digest) (16 hex) and the C(parts) it is made of.
  returned: always
  type: dict
  sample: {"digest": "3f0c9a1e2b4d5c6f", "parts": {"repo": "org/m", "commit": "0123abcd", "engine_version": "0.32.0"}}
answers:
  description: Per probe C({name, prompt, text, token_ids, logprobs, margins}).
  returned: always
  type: list
  elements: dict
tool_answer:
  description: The chat message the tool probe got back; null without O(tool_probe).
  returned: always
  type: dict
settings:
  description: C({max_tokens, seed}) the answers were asked with (a record compares only with the same).
  returned: always
  type: dict
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.llmfleet.vllm.plugins.module_utils.answer_parity import (
    ParityError, answer_from_completion, parity_key)


def _request(params, path, body=None):
    headers = {'Content-Type': 'application/json'}
    if params['api_key']:
        headers['Authorization'] = 'Bearer ' + params['api_key']
    response = open_url(params['base_url'].rstrip('/') + path, method='POST' if body is not None else 'GET',
                        data=json.dumps(body) if body is not None else None, headers=headers,
                        timeout=params['timeout_s'])
    return json.loads(response.read())


def ask(params):
    answers = []
    for probe in params['probes']:
        if not probe.get('name') or not probe.get('prompt'):
            raise ParityError('every probe needs a name and a prompt, got %s' % json.dumps(probe))
        reply = _request(params, '/v1/completions', {
            'model': params['model'], 'prompt': probe['prompt'], 'max_tokens': params['max_tokens'], 'temperature': 0,
            'seed': params['seed'], 'ignore_eos': True, 'logprobs': 2, 'return_tokens_as_token_ids': True})
        answers.append(answer_from_completion(probe['name'], probe['prompt'], reply['choices'][0]))
    tool_answer = None
    if params['tool_probe']:
        tool = params['tool_probe']['tool']
        reply = _request(params, '/v1/chat/completions', {
            'model': params['model'], 'messages': [{'role': 'user', 'content': params['tool_probe']['prompt']}],
            'tools': [{'type': 'function', 'function': {'name': tool['name'], 'description': tool.get('description', ''),
                                                        'parameters': tool['parameters']}}],
            'tool_choice': 'auto', 'temperature': 0, 'seed': params['seed'], 'max_tokens': 256})
        tool_answer = reply['choices'][0].get('message')
    return answers, tool_answer


def main():
    module = AnsibleModule(
        argument_spec=dict(
            base_url=dict(type='str', required=True),
            model=dict(type='str', required=True),
            api_key=dict(type='str', default='', no_log=True),
            probes=dict(type='list', elements='dict', required=True),
            tool_probe=dict(type='dict'),
            max_tokens=dict(type='int', default=16, no_log=False),
            seed=dict(type='int', default=0),
            key_parts=dict(type='dict', required=True, no_log=False),
            timeout_s=dict(type='float', default=120),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        version = _request(params, '/version').get('version') or 'unknown'
        answers, tool_answer = ask(params)
    except (ParityError, KeyError, IndexError, ValueError) as exc:
        module.fail_json(msg='%s did not answer the parity probes as expected: %s' % (params['base_url'], exc))
    except Exception as exc:  # noqa: BLE001 - URL errors of every kind: the server did not answer
        module.fail_json(msg='%s did not answer the parity probes: %s' % (params['base_url'], exc))
    parts = params['key_parts']
    key = parity_key(parts.get('repo'), parts.get('commit'), version, parts.get('serving'), parts.get('quantization'),
                     parts.get('patches'))
    module.exit_json(changed=False, key=key, answers=answers, tool_answer=tool_answer,
                     settings={'max_tokens': params['max_tokens'], 'seed': params['seed']})


if __name__ == '__main__':
    main()
