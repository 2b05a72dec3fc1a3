"""Pivot downtime and idempotent re-run, on a real systemd test host with vLLM's CPU engine.

    .venv/bin/python bench/pivot.py [--runs 3]

Measures, side by side in one run on the same host:
  * playbooks/pivot.yml downtime (old stopped -> new ready, from its pivot record) against the new
    model's cold load time alone (unit start -> ready, the same record), target <= 1.1x;
  * a naive sequential pivot (bench/naive_pivot.yml: stop, delete, download, verify, start) downtime;
  * a second pivot.yml run for the model already served: wall time and changed count (target 0, < 20 s).
Prints a Markdown table (medians with min-max) for docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTBED = os.path.join(REPO, "tools", "testbed", "testbed.sh")
HUB = os.path.join(REPO, "tools", "localhub", "tiny-hub.sh")
MACHINE, SSH_PORT, HUB_PORT = "bench-pivot", "2235", "18093"
MODELS = ("tiny-llama-a", "tiny-llama-b")


def playbook(inventory: str, path: str, model: str) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    start = time.monotonic()
    result = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", inventory, path,
                             "-e", f"model={model}"], capture_output=True, text=True, env=env, cwd=REPO, check=False)
    wall = time.monotonic() - start
    if result.returncode != 0:
        sys.exit(f"{path} -e model={model} failed:\n{result.stdout[-3000:]}")
    return result, wall


def record(model: str) -> dict:
    with open(os.path.join(REPO, "results", MACHINE, "pivots", f"{model}-latest.json")) as fh:
        return json.load(fh)


def changed_count(output: str) -> int:
    return sum(int(n) for n in re.findall(r"changed=(\d+)", output.split("PLAY RECAP")[-1]))


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="pivots of each kind (default 3)")
    args = parser.parse_args()

    inv = tempfile.mkdtemp(prefix="bench-pivot-")
    with open(os.path.join(inv, "hosts.yml"), "w") as fh:
        fh.write(f"all:\n  hosts:\n    {MACHINE}:\n      ansible_port: {SSH_PORT}\n"
                 f"      model_fetch_hf_endpoint: http://127.0.0.1:{HUB_PORT}\n      pivot_benchmark: false\n")
    os.symlink(os.path.join(REPO, "inventory", "testbed", "group_vars"), os.path.join(inv, "group_vars"))
    image = subprocess.run([os.path.join(REPO, "tools", "testbed", "vllm-image.sh")], check=True,
                           capture_output=True, text=True).stdout.strip()
    subprocess.run([HUB, "start", HUB_PORT], check=True)
    subprocess.run([TESTBED, "up", MACHINE, SSH_PORT, image], check=True, capture_output=True)
    pivot_yml = os.path.join(REPO, "playbooks", "pivot.yml")
    naive_yml = os.path.join(REPO, "bench", "naive_pivot.yml")
    downtime, load, naive, rerun_wall, rerun_changed = [], [], [], [], []
    try:
        playbook(inv, pivot_yml, MODELS[0])
        current = MODELS[0]
        for _run in range(args.runs):
            target = MODELS[1] if current == MODELS[0] else MODELS[0]
            playbook(inv, pivot_yml, target)
            rec = record(target)
            downtime.append(float(rec["downtime_s"]))
            load.append(float(rec["load_time_s"]))
            result, wall = playbook(inv, pivot_yml, target)
            rerun_wall.append(wall)
            rerun_changed.append(changed_count(result.stdout))
            current = target
        for _run in range(args.runs):
            target = MODELS[1] if current == MODELS[0] else MODELS[0]
            result, _wall = playbook(inv, naive_yml, target)
            naive.append(float(re.search(r"NAIVE_DOWNTIME_S=([0-9.]+)", result.stdout).group(1)))
            current = target
    finally:
        subprocess.run([TESTBED, "down", MACHINE], check=False, capture_output=True)
        subprocess.run([HUB, "stop", HUB_PORT], check=False)

    ratio = [d / l for d, l in zip(downtime, load)]
    print(f"| measure (s, median (min-max) of {args.runs}) | value |\n|---|---|")
    print(f"| pivot.yml downtime (old stopped -> new ready) | {spread(downtime)} |")
    print(f"| new model cold load time alone (unit start -> ready) | {spread(load)} |")
    print(f"| downtime / load time (target <= 1.1) | {spread(ratio)} |")
    print(f"| naive sequential pivot downtime (stop, download, verify, start) | {spread(naive)} |")
    print(f"| pivot.yml re-run for the served model: wall time (target < 20) | {spread(rerun_wall)} |")
    print(f"| pivot.yml re-run: changed tasks (target 0) | {max(rerun_changed)} (max) |")


if __name__ == "__main__":
    main()
