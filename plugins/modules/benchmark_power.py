#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark_power
short_description: Sample GPU board power until told to stop (run it with async during a benchmark)
version_added: "0.1.0"
description:
  - Samples the summed power draw of the host's NVIDIA GPUs (NVML when C(pynvml) is importable, else
    C(nvidia-smi)) every O(interval_s) seconds with wall-clock timestamps, until O(stop_file) exists or
    O(max_duration_s) has passed, then writes the samples and a summary to O(output) as JSON.
  - Meant to be started with C(async) and C(poll=0) before a load and stopped by creating O(stop_file);
    the C(llmfleet.vllm.benchmark) role splits the samples into per-concurrency-level energy.
  - A host without GPUs (or without a working reader) is not an error; the module writes
    C(available=false) with the reason and returns at once.
author:
  - llmfleet maintainers (@llmfleet)
options:
  output:
    description: JSON file written at the end.
    type: path
    required: true
  stop_file:
    description: Sampling stops once this file exists. It is removed when sampling starts.
    type: path
    required: true
  interval_s:
    description: Seconds between samples.
    type: float
    default: 0.5
  max_duration_s:
    description: Stop after this many seconds even without O(stop_file).
    type: float
    default: 7200
  gpu_indices:
    description: GPU indexes to sample; all when empty.
    type: list
    elements: int
    default: []
attributes:
  check_mode:
    description: In check mode nothing is sampled or written.
extends_documentation_fragment:
  - llmfleet.vllm.attributes
"""

EXAMPLES = r"""
- name: Sample GPU power in the background
  llmfleet.vllm.benchmark_power:
    output: /var/lib/llmfleet/results/.run/power.json
    stop_file: /var/lib/llmfleet/results/.run/power.stop
  async: 7200
  poll: 0
  register: power_job
"""

RETURN = r"""
available:
  description: Whether GPU power could be read.
  returned: always
  type: bool
reason:
  description: Why not, when RV(available=false).
  returned: always
  type: str
summary:
  description: Sampler summary (C(source), C(samples), C(watts_mean), C(watts_max), C(joules), C(per_gpu), ...).
  returned: when available
  type: dict
output:
  description: File written.
  returned: unless check mode
  type: str
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmfleet.vllm.plugins.module_utils.atomic_write import atomic_write
from ansible_collections.llmfleet.vllm.plugins.module_utils.gpu_power import (
    PowerReadError,
    PowerSampler,
    default_reader,
)


def write_json(path, data):
    atomic_write(path, json.dumps(data))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            output=dict(type="path", required=True),
            stop_file=dict(type="path", required=True),
            interval_s=dict(type="float", default=0.5),
            max_duration_s=dict(type="float", default=7200.0),
            gpu_indices=dict(type="list", elements="int", default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["interval_s"] <= 0 or p["max_duration_s"] <= 0:
        module.fail_json(msg="interval_s and max_duration_s must be > 0")
    if module.check_mode:
        module.exit_json(changed=False, available=False, reason="check mode: not sampled")
    try:
        reader = default_reader(p["gpu_indices"] or None)
    except PowerReadError as exc:
        data = {"available": False, "reason": "no GPU power reader: %s" % exc}
        write_json(p["output"], data)
        module.exit_json(changed=True, output=p["output"], **data)
    if os.path.exists(p["stop_file"]):
        os.remove(p["stop_file"])
    sampler = PowerSampler(interval_s=p["interval_s"], reader=reader, clock=time.time)
    deadline = time.time() + p["max_duration_s"]
    sampler.start()
    try:
        while not os.path.exists(p["stop_file"]) and time.time() < deadline:
            time.sleep(min(0.2, p["interval_s"]))
    finally:
        summary = sampler.stop()
        if hasattr(reader, "close"):
            reader.close()
    samples = [[round(t, 3), round(sum(w), 2)] for t, w in sampler.samples]
    data = {"available": bool(samples), "reason": None if samples else "no successful reading (%s)" % sampler.last_error,
            "source": summary["source"], "gpus": len(summary["per_gpu"]), "watts_mean": summary["watts_mean"],
            "watts_max": summary["watts_max"], "joules": summary["joules"], "duration_s": summary["duration_s"],
            "summary": summary, "samples": samples}
    write_json(p["output"], data)
    module.exit_json(changed=True, output=p["output"], available=data["available"], reason=data["reason"],
                     summary=summary)


if __name__ == "__main__":
    main()
