# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fleet rollout cost against fleet size, on real systemd test hosts with vLLM's CPU engine.

    .venv/bin/python bench/fleet.py [--sizes 1 3 6] [--runs 3] [--batch-size 100%] [--no-peer]

For each fleet size N it times, side by side in one run on the same hosts:
  * playbooks/rollout.yml over the first N hosts with forks=N (pre-stage, canary, then the rest in
    batches of --batch-size), tiny-llama-a <-> tiny-llama-b;
  * the peer: what a hand-run loop does, playbooks/pivot.yml on one host after the other.
Hosts are brought to one common model (an untimed rollout) before each timed one. Every host is a
test-bed machine on this one box: their vLLM loads share its cores, so a batch's loads do not
overlap for free as they would on separate GPU hosts (the per-host load times are printed too).
Prints a Markdown table for docs/benchmarks.md and writes results/bench-fleet.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import testbed_bench as tb

HUB_PORT = 18096
SSH_PORT_BASE = 2280
HTTP_PORT_BASE = 8200


def host_names(count: int) -> list[str]:
    return [f"bench-fleet-{i}" for i in range(1, count + 1)]


def host_vars(index: int, results_dir: str) -> dict:
    ports = {model: HTTP_PORT_BASE + 10 * index + n for n, model in enumerate(tb.MODELS, start=1)}
    return {
        "ansible_port": SSH_PORT_BASE + index,
        "llmfleet_models_extra": {m: {"port": p} for m, p in ports.items()},
        "model_fetch_hf_endpoint": f"http://127.0.0.1:{HUB_PORT}",
        "pivot_benchmark": False,
        "pivot_controller_results_dir": results_dir,
        # The canary gate compares the new model's tok/s with the previous model's; these are two different
        # models (b is ~0.65x a at concurrency 1 on this box), and the bench times the rollout, not the models.
        "rollout_min_tok_s_ratio": 0.25,
    }


class Fleet:
    def __init__(self, inventory: str, results_dir: str, batch_size: str):
        self.inventory, self.results_dir, self.batch_size = inventory, results_dir, batch_size
        self.rollout_yml = os.path.join(tb.REPO, "playbooks", "rollout.yml")
        self.pivot_yml = os.path.join(tb.REPO, "playbooks", "pivot.yml")

    def rollout(self, hosts: list[str], model: str, log: str) -> float:
        _result, wall = tb.run_playbook(
            self.inventory, self.rollout_yml, "-e", f"model={model}", "-e", f"rollout_hosts={','.join(hosts)}",
            "-e", f"rollout_batch_size={self.batch_size}", forks=len(hosts), log=log)
        return wall

    def sequential_pivots(self, hosts: list[str], model: str, log_prefix: str) -> float:
        total = 0.0
        for host in hosts:
            _result, wall = tb.run_playbook(self.inventory, self.pivot_yml, "-e", f"model={model}", "--limit", host,
                                            log=f"{log_prefix}-{host}.log")
            total += wall
        return total

    def align(self, hosts: list[str], log: str) -> str:
        """Bring hosts to one common model (untimed); returns it."""
        models = {tb.serving(h) for h in hosts}
        if len(models) == 1 and "" not in models:
            return models.pop()
        common = tb.serving(hosts[0]) or tb.MODELS[0]
        self.rollout(hosts, common, log)
        return common

    def load_times(self, hosts: list[str], model: str) -> list[float]:
        return [float(tb.read_pivot_record(self.results_dir, h, model)["load_time_s"]) for h in hosts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 3, 6], help="fleet sizes N (default 1 3 6)")
    parser.add_argument("--runs", type=int, default=3, help="timed rollouts per size (default 3)")
    parser.add_argument("--batch-size", default="100%", help="rollout_batch_size after the canary (default 100%%)")
    parser.add_argument("--no-peer", action="store_true", help="skip the one-host-after-another pivot.yml peer")
    parser.add_argument("--keep", action="store_true", help="leave the hosts up afterwards")
    args = parser.parse_args()

    hosts = host_names(max(args.sizes))
    work = tempfile.mkdtemp(prefix="bench-fleet-")
    results_dir, inventory = os.path.join(work, "results"), os.path.join(work, "inventory")
    os.makedirs(inventory)  # a folder of its own: ansible reads every file in an inventory folder
    tb.write_inventory(inventory, {h: host_vars(i, results_dir) for i, h in enumerate(hosts, start=1)})
    fleet = Fleet(inventory, results_dir, args.batch_size)
    image = tb.vllm_image()
    tb.hub("start", HUB_PORT)
    rows = []
    try:
        for i, host in enumerate(hosts, start=1):
            tb.machine_up(host, SSH_PORT_BASE + i, image)
        fleet.align(hosts, os.path.join(work, "initial.log"))
        for run in range(args.runs):
            for n in args.sizes:
                group = hosts[:n]
                target = tb.other_model(fleet.align(group, os.path.join(work, f"align-{run}-{n}.log")))
                load_before = tb.load_average()
                wall = fleet.rollout(group, target, os.path.join(work, f"rollout-{run}-{n}.log"))
                loads = fleet.load_times(group, target)
                row = {"run": run, "n": n, "target": target, "rollout_s": round(wall, 1),
                       "load_times_s": loads, "load_average_before": load_before}
                if not args.no_peer:
                    target = tb.other_model(target)
                    row["sequential_target"] = target
                    row["sequential_s"] = round(fleet.sequential_pivots(group, target,
                                                                        os.path.join(work, f"seq-{run}-{n}")), 1)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        if not args.keep:
            for host in hosts:
                tb.machine_down(host)
        tb.hub("stop", HUB_PORT)

    os.makedirs(os.path.join(tb.REPO, "results"), exist_ok=True)
    with open(os.path.join(tb.REPO, "results", "bench-fleet.json"), "w", encoding="utf-8") as fh:
        json.dump({"batch_size": args.batch_size, "rows": rows, "logs": work}, fh, indent=2)
    base = statistics.median(r["rollout_s"] for r in rows if r["n"] == args.sizes[0])
    print(f"\nrollout.yml with forks=N, batch size {args.batch_size} after the canary; median (min-max) of {args.runs} "
          f"run(s); logs under {work}\n")
    print("| N hosts | rollout.yml wall (s) | vs N=%d | per host (s) | pivot.yml host after host (s) | "
          "rollout / sequential | vLLM load per host (s) |" % args.sizes[0])
    print("|---|---|---|---|---|---|---|")
    for n in args.sizes:
        mine = [r for r in rows if r["n"] == n]
        walls = [r["rollout_s"] for r in mine]
        seq = [r["sequential_s"] for r in mine if "sequential_s" in r]
        ratio = tb.spread([r["rollout_s"] / r["sequential_s"] for r in mine if "sequential_s" in r], 2)
        loads = [t for r in mine for t in r["load_times_s"]]
        print(f"| {n} | {tb.spread(walls)} | {statistics.median(walls) / base:.2f}x | "
              f"{statistics.median(walls) / n:.1f} | {tb.spread(seq)} | {ratio} | {tb.spread(loads)} |")


if __name__ == "__main__":
    main()
