#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: hand_over
short_description: Stop the old model, clean /dev/shm, wait for the GPUs' memory and let the new start go, in one step
version_added: 0.9.0
description:
  - The downtime of a stop-then-start switch in one module run instead of one task each (roles/service_deploy's
    entry point C(start) with C(service_deploy_hand_over), used by roles/pivot).
  - Stops the units of O(stop) in order (C(systemctl stop); a unit that is not loaded counts as stopped), then removes
    the stale NCCL, multiprocessing and PyTorch segments from O(shm_path) that no live process holds (as
    M(llmfleet.vllm.nccl_shm_cleanup) with its defaults), then reads the GPUs of O(gpu_ids) through NVML (else
    C(nvidia-smi)) every O(gpu_poll_s) until each has O(gpu_memory_utilization) x its memory free or O(gpu_wait_s)
    ran out, then removes O(release), the hold file a start armed by roles/service_deploy's entry point C(arm) waits on.
  - Memory that stays short does not fail the module; RV(gpu_memory) says C(ok=false) and O(release) is kept, so that the
    held start never meets another process's memory. A stop that fails fails the module, and nothing after it runs.
author:
  - llmfleet maintainers (@llmfleet)
options:
  stop:
    description: Units to stop, in this order.
    type: list
    elements: str
    default: []
  shm_cleanup:
    description: Remove stale shared-memory segments after the stops.
    type: bool
    default: true
  shm_path:
    description: Directory of the shared-memory segments.
    type: path
    default: /dev/shm
  gpu_ids:
    description: GPU indexes the new model starts on; empty checks no GPU (the CPU engine).
    type: list
    elements: int
    default: []
  gpu_memory_utilization:
    description: The new engine's share of each GPU's memory (vLLM's C(--gpu-memory-utilization)); default vLLM's 0.9.
    type: float
  gpu_wait_s:
    description: How long to wait for the memory to be free.
    type: int
    default: 60
  gpu_poll_s:
    description: Seconds between two readings.
    type: float
    default: 0.25
  model:
    description: The new model's name, for the messages.
    type: str
    default: the model
  release:
    description: Hold file of an armed start, removed last (the launcher starts within 20 ms).
    type: path
attributes:
  check_mode:
    description: Says which units would stop and which segments would go; stops, removes and releases nothing, and reads no GPU.
    support: full
extends_documentation_fragment:
  - llmfleet.vllm.attributes
seealso:
  - module: llmfleet.vllm.nccl_shm_cleanup
  - module: llmfleet.vllm.gpu_facts
"""

EXAMPLES = r"""
- name: Stop the old model, and start the armed new one as soon as its GPU memory is back
  llmfleet.vllm.hand_over:
    stop: [vllm-llama-b.service]
    gpu_ids: [0, 1]
    gpu_memory_utilization: 0.9
    model: llama-b
    release: /run/llmfleet-launch/vllm-llama-b-alt.hold
  register: hand_over

- name: Refuse to start next to another process's memory
  ansible.builtin.assert:
    that: hand_over.gpu_memory is none or hand_over.gpu_memory.ok
"""

RETURN = r"""
began_at:
  description: Epoch seconds when the first stop began.
  returned: always
  type: float
stopped:
  description: The units stopped, in order, with whether each was running and when its stop returned.
  returned: always
  type: list
  elements: dict
  sample: [{unit: vllm-llama-a.service, was_active: true, stopped_at: 1796557950.9}]
shm:
  description: The segments removed (name, size) and the bytes freed; null when O(shm_cleanup) is false.
  returned: always
  type: dict
  sample: {removed: [{name: nccl-abc, size: 33554432}], bytes_freed: 33554432}
gpu_memory:
  description:
    - The last reading, null when O(gpu_ids) is empty or in check mode. C(ok), C(errors), C(checked) (index, free_mib,
      needed_mib) as P(llmfleet.vllm.gpu_memory_free#filter) gives them, C(at) (epoch s), C(waited_s) and
      C(nvml_error) (why no GPU could be read, else empty).
  returned: always
  type: dict
  contains:
    ok:
      description: Whether every GPU had the new model's share free.
      type: bool
    errors:
      description: What was short, one line per GPU.
      type: list
      elements: str
    checked:
      description: Per GPU, C(index), C(free_mib) and C(needed_mib).
      type: list
      elements: dict
    at:
      description: Epoch seconds of the last reading.
      type: float
    waited_s:
      description: Seconds spent reading until the memory was free or the wait ran out.
      type: float
    nvml_error:
      description: Why no GPU could be read at all; empty when one could.
      type: str
released:
  description: Whether O(release) was there and was removed.
  returned: always
  type: bool
released_at:
  description: Epoch seconds of the release; null when nothing was released.
  returned: always
  type: float
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.vllm.plugins.module_utils.hand_over import (
    HandOverError,
    changed,
    gpu_memory_wait,
    hand_over,
)
from ansible_collections.llmfleet.vllm.plugins.module_utils.nvidia import gather
from ansible_collections.llmfleet.vllm.plugins.module_utils.shm_segments import DEFAULT_PATTERNS, clean

try:
    import pynvml
except ImportError:  # optional: nvidia-smi is the fallback
    pynvml = None

# systemctl's exit status for a unit that is not loaded (LSB "program is not installed").
NOT_LOADED = 5


def _unit_stopper(module, systemctl):
    def stop_unit(unit):
        rc, out, err = module.run_command([systemctl, "is-active", unit])
        was_active = out.strip() not in ("inactive", "failed", "unknown", "")
        if module.check_mode:
            return was_active, ""
        rc, out, err = module.run_command([systemctl, "stop", unit])
        if rc == NOT_LOADED:
            return False, ""
        if rc:
            return was_active, (err or out).strip() or "systemctl stop %s exited %d" % (unit, rc)
        return was_active, ""
    return stop_unit


def _shm_cleaner(module, path):
    def clean_shm():
        removed = clean(path, list(DEFAULT_PATTERNS), check_mode=module.check_mode)[0]
        return {"removed": [{"name": e["name"], "size": e["size"]} for e in removed],
                "bytes_freed": sum(e["size"] for e in removed)}
    return clean_shm


def _gpu_reader(module):
    smi = module.get_bin_path("nvidia-smi", opt_dirs=["/usr/bin", "/usr/local/nvidia/bin", "/usr/local/bin"])
    smi_run = None
    if smi:
        def smi_run(args):
            return module.run_command([smi] + list(args), environ_update={"LC_ALL": "C"})

    def read_gpus():
        return gather(nvml=pynvml, smi_run=smi_run, source="auto", include_topology=False)
    return read_gpus


def _releaser(path):
    def release():
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True
    return release


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            stop=dict(type="list", elements="str", default=[]),
            shm_cleanup=dict(type="bool", default=True),
            shm_path=dict(type="path", default="/dev/shm"),
            gpu_ids=dict(type="list", elements="int", default=[]),
            gpu_memory_utilization=dict(type="float"),
            gpu_wait_s=dict(type="int", default=60),
            gpu_poll_s=dict(type="float", default=0.25),
            model=dict(type="str", default="the model"),
            release=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    util = params["gpu_memory_utilization"]
    if util is not None and not 0 < util <= 1:
        module.fail_json(msg="gpu_memory_utilization must be in (0, 1], got %s" % util)
    if params["gpu_wait_s"] < 0 or params["gpu_poll_s"] <= 0:
        module.fail_json(msg="gpu_wait_s must be >= 0 and gpu_poll_s > 0")
    shm_path = os.path.realpath(params["shm_path"])
    if params["shm_cleanup"] and not os.path.isdir(shm_path):
        module.fail_json(msg="shm_path %s is not a directory" % params["shm_path"])

    gpu_wait = None
    if params["gpu_ids"] and not module.check_mode:
        read_gpus = _gpu_reader(module)

        def gpu_wait():
            return gpu_memory_wait(read_gpus, params["model"], params["gpu_ids"], util, params["gpu_wait_s"],
                                   params["gpu_poll_s"], time.time, time.monotonic, time.sleep)
    try:
        result = hand_over(
            params["stop"],
            _unit_stopper(module, module.get_bin_path("systemctl", required=True)),
            clean_shm=_shm_cleaner(module, shm_path) if params["shm_cleanup"] else None,
            gpu_wait=gpu_wait,
            release=_releaser(params["release"]) if params["release"] and not module.check_mode else None,
        )
    except HandOverError as exc:
        module.fail_json(msg=str(exc), changed=changed(exc.result), **exc.result)
    module.exit_json(changed=changed(result), **result)


def main():
    run_module()


if __name__ == "__main__":
    main()
