#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: models_root_usage
short_description: Read a models root - free bytes, its model directories oldest first, what each host serves from it
version_added: "0.4.0"
description:
  - The input of a disk plan (P(llmfleet.vllm.disk_plan#filter)) - the free bytes of the filesystem that holds
    O(path) (or would hold it), the model directories directly under it with their sizes and modification times
    (oldest first, the order a plan prunes in; dot directories and symlinks are never model directories), and the
    model directories each host sharing the root serves (its record C(.llmfleet/serving/<host>.json)).
  - M(llmfleet.vllm.hf_snapshot) reads a root the same way (C(module_utils/models_root.py)).
  - Reads only; changes nothing.
author:
  - llmfleet maintainers (@llmfleet)
options:
  path:
    description: The models root; it need not exist yet.
    type: path
    required: true
extends_documentation_fragment:
  - llmfleet.vllm.attributes
"""

EXAMPLES = r"""
- name: Read the models root
  llmfleet.vllm.models_root_usage:
    path: /srv/models
  register: usage

- name: Plan the download of a model, pruning old model dirs if needed
  ansible.builtin.set_fact:
    plan: "{{ entry | llmfleet.vllm.disk_plan(usage.free_bytes, 0, usage.candidates, ['/srv/models/minimax-m25']) }}"
"""

RETURN = r"""
free_bytes:
  description: Bytes an unprivileged writer may still use on the filesystem of O(path).
  returned: always
  type: int
candidates:
  description: The model directories under O(path), oldest first, each C({path, size_bytes, mtime}).
  returned: always
  type: list
  elements: dict
served_by:
  description: Serving records of hosts that share the root, by record name (C(<host>) or C(<host>.ray)) - the directory names each serves.
  returned: always
  type: dict
  sample: {"gpu-02": ["minimax-m25"], "gpu-02.ray": ["kimi-k25-int4"]}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.vllm.plugins.module_utils.models_root import usage


def main():
    module = AnsibleModule(argument_spec=dict(path=dict(type='path', required=True)), supports_check_mode=True)
    module.exit_json(changed=False, **usage(module.params['path']))


if __name__ == '__main__':
    main()
