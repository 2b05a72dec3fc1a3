#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU facts (NVML, falling back to nvidia-smi)
version_added: "0.1.0"
description:
  - Gathers the number of NVIDIA GPUs and, for each, its name, UUID, memory, compute
    capability, power draw and limit, utilisation, PCI bus id, persistence mode and
    active NVLinks, plus the driver and CUDA versions and whether the GPUs are linked by
    NVLink or by PCIe only.
  - Reads NVML through the C(pynvml) module of nvidia-ml-py when it is importable, and
    otherwise parses C(nvidia-smi --query-gpu=... --format=csv,noheader,nounits). The
    topology matrix comes from C(nvidia-smi topo -m) when nvidia-smi is installed.
  - A host without GPUs, driver or nvidia-smi returns RV(ansible_facts.llmfleet_gpu.gpu_count=0)
    and RV(ansible_facts.llmfleet_gpu.source=none); that is not a failure.
author:
  - llmfleet maintainers (@llmfleet)
requirements:
  - nvidia-ml-py (python module C(pynvml)) on the target, optional; without it nvidia-smi is used.
options:
  source:
    description:
      - Which source to use. V(auto) tries NVML, then nvidia-smi.
      - V(nvml) or V(nvidia-smi) use that one only (gpu_count 0 when it is unavailable).
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  include_topology:
    description:
      - Also run C(nvidia-smi topo -m) and return the GPU-to-GPU matrix.
    type: bool
    default: true
  nvidia_smi_path:
    description:
      - Path to nvidia-smi. By default it is looked up in PATH and C(/usr/bin), C(/usr/local/nvidia/bin).
    type: path
  fact_name:
    description:
      - Name of the fact to set.
    type: str
    default: llmfleet_gpu
attributes:
  diff_mode:
    description: Changes nothing, so there is nothing to diff.
  facts:
    support: full
    description: Returns RV(ansible_facts.llmfleet_gpu).
extends_documentation_fragment:
  - llmfleet.vllm.attributes
seealso:
  - module: llmfleet.vllm.nccl_shm_cleanup
"""

EXAMPLES = r"""
- name: Gather GPU facts
  llmfleet.vllm.gpu_facts:

- name: Refuse to continue on a host with too few GPUs for tensor parallel 8
  ansible.builtin.assert:
    that:
      - ansible_facts.llmfleet_gpu.gpu_count >= 8
    fail_msg: "{{ inventory_hostname }} has {{ ansible_facts.llmfleet_gpu.gpu_count }} GPUs"

- name: Pick NCCL settings for PCIe-only boxes
  ansible.builtin.set_fact:
    nccl_p2p_disable: "{{ ansible_facts.llmfleet_gpu.topology.interconnect == 'pcie' }}"

- name: Force the nvidia-smi parser
  llmfleet.vllm.gpu_facts:
    source: nvidia-smi
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to ansible_facts.
  returned: always
  type: complex
  contains:
    llmfleet_gpu:
      description: GPU facts (the key is O(fact_name)).
      returned: always
      type: complex
      contains:
        source:
          description: Where the facts came from, V(nvml), V(nvidia-smi) or V(none).
          type: str
          sample: nvml
        gpu_count:
          description: Number of GPUs.
          type: int
          sample: 8
        driver_version:
          description: NVIDIA driver version.
          type: str
          sample: "580.159.04"
        cuda_version:
          description: Highest CUDA version the driver supports.
          type: str
          sample: "13.0"
        gpus:
          description: One entry per GPU, by index.
          type: list
          elements: dict
          sample:
            - index: 0
              name: NVIDIA H200
              uuid: GPU-6b2e0c1a-0000-0000-0000-000000000000
              memory_total_mib: 143771
              memory_used_mib: 0
              compute_capability: "9.0"
              power_draw_w: 74.3
              power_limit_w: 700.0
              utilization_gpu_pct: 0
              pci_bus_id: "00000000:00:05.0"
              persistence_mode: true
              nvlink_active_links: 0
        topology:
          description: >-
            C(nvlink) (any active NVLink), C(interconnect) (V(nvlink), V(pcie), V(single),
            V(none) or V(unknown)) and C(matrix), the GPU-to-GPU cells of C(nvidia-smi topo -m).
          type: dict
          sample: {nvlink: false, interconnect: pcie, matrix: {GPU0: {GPU1: NODE}, GPU1: {GPU0: NODE}}}
errors:
  description: Why a source was skipped (not importable, no driver...). Informational.
  returned: always
  type: list
  elements: str
  sample: ["nvml: NVML init failed: NVML Shared Library Not Found"]
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.vllm.plugins.module_utils.nvidia import gather

try:
    import pynvml
except ImportError:  # optional: nvidia-smi is the fallback
    pynvml = None


def _find_nvidia_smi(module):
    path = module.params["nvidia_smi_path"]
    if path:
        return path if os.access(path, os.X_OK) else None
    return module.get_bin_path("nvidia-smi", opt_dirs=["/usr/bin", "/usr/local/nvidia/bin", "/usr/local/bin"])


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            source=dict(type="str", default="auto", choices=["auto", "nvml", "nvidia-smi"]),
            include_topology=dict(type="bool", default=True),
            nvidia_smi_path=dict(type="path"),
            fact_name=dict(type="str", default="llmfleet_gpu"),
        ),
        supports_check_mode=True,
    )
    smi = _find_nvidia_smi(module)
    smi_run = None
    if smi:
        def smi_run(args):
            # LC_ALL=C: decimal points and messages as parsed
            return module.run_command([smi] + list(args), environ_update={"LC_ALL": "C"})
    facts, errors = gather(
        nvml=pynvml,
        smi_run=smi_run,
        source=module.params["source"],
        include_topology=module.params["include_topology"],
    )
    module.exit_json(changed=False, ansible_facts={module.params["fact_name"]: facts}, errors=errors)


def main():
    run_module()


if __name__ == "__main__":
    main()
