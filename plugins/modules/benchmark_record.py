#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark_record
short_description: Assemble one benchmark record from throughput_check, vllm bench serve and GPU power files
version_added: "0.1.0"
description:
  - Reads the result files of one C(llmfleet.vllm.throughput_check) run per concurrency level, the
    C(vllm bench serve --save-result) files (optional) and the C(llmfleet.vllm.benchmark_power) samples
    (optional) on the host, and writes one benchmark record (JSON) to O(path).
  - Per-level GPU energy uses the samples between a level file's C(started_at) and its modification time.
  - Used by the C(llmfleet.vllm.benchmark) role; the record schema is described in its documentation.
author:
  - llmfleet maintainers (@llmfleet)
options:
  path:
    description: Record file to write.
    type: path
    required: true
  host:
    description: Host name stored in the record.
    type: str
    required: true
  model:
    description: Model name stored in the record.
    type: str
    required: true
  timestamp:
    description: Run timestamp (C(YYYYmmddTHHMMSSZ)) stored in the record.
    type: str
    required: true
  throughput_files:
    description: throughput_check result files (its C(results_path)), one per level, in sweep order.
    type: list
    elements: path
    required: true
  side:
    description:
      - V(peer) records the C(peer) part of each throughput_check result (rounds interleaved with the main
        endpoint's, see its O(llmfleet.vllm.throughput_check#module:peer) option) instead of its main levels.
    type: str
    choices: [main, peer]
    default: main
  vllm_bench_files:
    description: C(vllm bench serve --save-result) JSON files; the level is their C(max_concurrency).
    type: list
    elements: path
  vllm_bench_error:
    description: Why C(vllm bench serve) gave no (or not all) results; stored in the record.
    type: str
  power_file:
    description: Output of C(llmfleet.vllm.benchmark_power).
    type: path
  power_reason:
    description: Why GPU power was not sampled (stored when O(power_file) is not given).
    type: str
  time_to_ready_s:
    description: Seconds the model took to become ready (from C(service_deploy_time_to_ready_s)).
    type: float
  base_url:
    description: Endpoint benchmarked.
    type: str
  settings:
    description: Sweep settings stored in the record as they are.
    type: dict
    default: {}
attributes:
  check_mode:
    description: In check mode the record is assembled and returned but not written.
extends_documentation_fragment:
  - llmfleet.vllm.attributes
"""

EXAMPLES = r"""
- name: Write the record
  llmfleet.vllm.benchmark_record:
    path: /var/lib/llmfleet/results/tiny-llama-a/20261202T150000Z.json
    host: "{{ inventory_hostname }}"
    model: tiny-llama-a
    timestamp: 20261202T150000Z
    throughput_files: [/var/lib/llmfleet/results/.run/tc-1.json, /var/lib/llmfleet/results/.run/tc-8.json]
"""

RETURN = r"""
record:
  description: The record written (see the role's documentation for its keys).
  returned: always
  type: dict
path:
  description: Where it was written.
  returned: always
  type: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native

from ansible_collections.llmfleet.vllm.plugins.module_utils.atomic_write import atomic_write
from ansible_collections.llmfleet.vllm.plugins.module_utils.bench_report import ReportError, build_record


def read_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise ReportError("cannot read %s %s: %s" % (what, path, to_native(exc)))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            host=dict(type="str", required=True),
            model=dict(type="str", required=True),
            timestamp=dict(type="str", required=True),
            throughput_files=dict(type="list", elements="path", required=True),
            side=dict(type="str", choices=["main", "peer"], default="main"),
            vllm_bench_files=dict(type="list", elements="path"),
            vllm_bench_error=dict(type="str"),
            power_file=dict(type="path"),
            power_reason=dict(type="str"),
            time_to_ready_s=dict(type="float"),
            base_url=dict(type="str"),
            settings=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        results, windows = [], {}
        for path in p["throughput_files"]:
            res = read_json(path, "throughput_check result")
            if p["side"] == "peer":
                if not isinstance(res.get("peer"), dict):
                    raise ReportError("%s has no peer measurements (throughput_check ran without peer)" % path)
                res = dict(res["peer"], started_at=res.get("started_at"))
            results.append(res)
            end = os.stat(path).st_mtime
            for lvl in res.get("levels") or []:
                windows[int(lvl["concurrency"])] = (float(res.get("started_at") or end - (lvl.get("duration_s") or 0)), end)
        bench = None
        if p["vllm_bench_files"] is not None:
            bench = [(None, read_json(f, "vllm bench result")) for f in p["vllm_bench_files"]]
        power = None
        if p["power_file"]:
            power = read_json(p["power_file"], "GPU power samples")
        elif p["power_reason"]:
            power = {"available": False, "reason": p["power_reason"]}
        record = build_record(p["host"], p["model"], p["timestamp"], results, settings=p["settings"],
                              base_url=p["base_url"], time_to_ready_s=p["time_to_ready_s"], vllm_bench_raw=bench,
                              vllm_bench_error=p["vllm_bench_error"], power=power, level_windows=windows)
    except (ReportError, KeyError, TypeError, ValueError) as exc:
        module.fail_json(msg="cannot assemble the benchmark record: %s" % to_native(exc))
    if not module.check_mode:
        atomic_write(p["path"], json.dumps(record, indent=2, sort_keys=True))
    module.exit_json(changed=True, record=record, path=p["path"])


if __name__ == "__main__":
    main()
