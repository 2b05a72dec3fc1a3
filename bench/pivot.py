"""Pivot downtime and idempotent re-run, on a real systemd test host with vLLM's CPU engine.

    .venv/bin/python bench/pivot.py [--runs 3]

Measures, side by side in one run on the same host:
  * playbooks/pivot.yml downtime (systemd begins stopping the old unit -> the new one's first good
    /health, both on the host's monotonic clock, from its pivot record) against the new model's cold
    load time alone (vLLM process start -> first good /health, the same record), target <= 1.1x;
  * a naive sequential pivot (bench/naive_pivot.yml: stop, delete, download, verify, start) downtime;
  * a second pivot.yml run for the model already served: wall time and changed count (target 0, < 20 s).
Prints a Markdown table (medians with min-max) for docs/benchmarks.md; writes results/bench-pivot.json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile

import testbed_bench as tb

MACHINE, SSH_PORT, HUB_PORT = "bench-pivot", "2235", "18093"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="pivots of each kind (default 3)")
    args = parser.parse_args()

    inv = tempfile.mkdtemp(prefix="bench-pivot-")
    tb.write_inventory(inv, {MACHINE: {"ansible_port": int(SSH_PORT), "pivot_benchmark": False,
                                       "model_fetch_hf_endpoint": f"http://127.0.0.1:{HUB_PORT}"}})
    image = tb.vllm_image()
    tb.hub("start", HUB_PORT)
    tb.machine_up(MACHINE, SSH_PORT, image)
    pivot_yml = os.path.join(tb.REPO, "playbooks", "pivot.yml")
    naive_yml = os.path.join(tb.REPO, "bench", "naive_pivot.yml")
    load_before = tb.load_average()
    downtime, load, naive, rerun_wall, rerun_changed = [], [], [], [], []
    try:
        tb.run_playbook(inv, pivot_yml, "-e", f"model={tb.MODELS[0]}")
        current = tb.MODELS[0]
        for _run in range(args.runs):
            target = tb.other_model(current)
            tb.run_playbook(inv, pivot_yml, "-e", f"model={target}")
            rec = tb.read_pivot_record(os.path.join(tb.REPO, "results"), MACHINE, target)
            if rec["downtime_source"] != "journal":
                sys.exit(f"downtime of the pivot to {target} was not measured on the host's clock: {rec}")
            downtime.append(float(rec["downtime_s"]))
            load.append(float(rec["load_time_s"]))
            result, wall = tb.run_playbook(inv, pivot_yml, "-e", f"model={target}")
            rerun_wall.append(wall)
            rerun_changed.append(tb.changed_count(result.stdout))
            current = target
        for _run in range(args.runs):
            target = tb.other_model(current)
            result, _wall = tb.run_playbook(inv, naive_yml, "-e", f"model={target}")
            naive.append(float(re.search(r"NAIVE_DOWNTIME_S=([0-9.]+)", result.stdout).group(1)))
            current = target
    finally:
        tb.machine_down(MACHINE)
        tb.hub("stop", HUB_PORT)

    ratio = [d / l for d, l in zip(downtime, load)]
    os.makedirs(os.path.join(tb.REPO, "results"), exist_ok=True)
    with open(os.path.join(tb.REPO, "results", "bench-pivot.json"), "w", encoding="utf-8") as fh:
        json.dump({"downtime_s": downtime, "load_time_s": load, "naive_downtime_s": naive, "rerun_wall_s": rerun_wall,
                   "rerun_changed": rerun_changed, "load_average_before": load_before,
                   "load_average_after": tb.load_average()}, fh, indent=2)
    print(f"load average before {load_before}, after {tb.load_average()}\n")
    print(f"| measure (s, median (min-max) of {args.runs}) | value |\n|---|---|")
    print(f"| pivot.yml downtime (old stopped -> new ready) | {tb.spread(downtime)} |")
    print(f"| new model cold load time alone (unit start -> ready) | {tb.spread(load)} |")
    print(f"| downtime / load time (target <= 1.1) | {tb.spread(ratio, 2)} |")
    print(f"| naive sequential pivot downtime (stop, download, verify, start) | {tb.spread(naive)} |")
    print(f"| pivot.yml re-run for the served model: wall time (target < 20) | {tb.spread(rerun_wall)} |")
    print(f"| pivot.yml re-run: changed tasks (target 0) | {max(rerun_changed)} (max) |")


if __name__ == "__main__":
    main()
