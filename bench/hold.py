# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Requests held through stop-then-start pivots, the throughput gate before or after the held requests are admitted
(issue 44): side by side on one real systemd test host with vLLM's CPU engine behind Debian's HAProxy, an `openai`
client without retries on the slot's alias the whole time (docs/benchmarks.md).

    .venv/bin/python bench/hold.py [--rounds 2]

Each round pivots the served model to a new upstream commit (stop-then-start: one unit per model) once with
`pivot_admit_before_gate=false` (the gate, then the clients) and once with the default (the clients, then the gate),
alternating which goes first; then once each with a gate no model can pass (admitted or not, then rolled back).
Per pivot: the record's closed window and downtime, what the gateway counted (held, their longest and p95 wait,
refused), and the client's failures and longest request. Prints a Markdown table and the ratio of the closed windows;
writes results/bench-hold.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import testbed_bench as tb

sys.path.insert(0, os.path.join(tb.REPO, "tools", "traffic"))
sys.path.insert(0, os.path.join(tb.REPO, "tools", "crash"))
from continuous_client import ContinuousClient  # noqa: E402  pylint: disable=wrong-import-position
import harness  # noqa: E402  pylint: disable=wrong-import-position

HUB_PORT, HOST, HOST_SSH, GATEWAY = 18098, "bench-hold", 2238, 8891
PORTS = {"tiny-llama-a": 8811, "tiny-llama-b": 8812}
GW_URL, ALIAS, MODEL = f"http://127.0.0.1:{GATEWAY}", "chat", "tiny-llama-a"
ORDERS = {"gate, then clients": ["-e", "pivot_admit_before_gate=false"], "clients, then gate": []}


def publish_new_commit():
    """A new upstream commit of MODEL on the hub: the next pivot to revision=main stops the served one, then starts it."""
    subprocess.run([tb.HUB, "publish", str(HUB_PORT), MODEL], check=True, capture_output=True)


def pivot(work, name, order, extra):
    """One pivot of MODEL with an openai client (4 workers, no retries) on the alias: what the record, the gateway and
    the client saw."""
    client = ContinuousClient(GW_URL + "/v1", ALIAS, workers=4, max_seconds=1800, timeout_s=400)
    started = time.time()
    with client:
        rc, out, _killed = harness.run_pivot(work, ["-e", f"model={MODEL}", "-e", "revision=main", *ORDERS[order], *extra])
    record = tb.read_pivot_record(os.path.join(work, "results"), HOST, MODEL) if rc == 0 else json.loads(
        tb.ssh(HOST, "cat $(ls -1 /var/lib/llmfleet/pivots/*-rolled-back.json | tail -1)"))
    window = record.get("gateway_window") or {}
    failed = [r for r in client.requests if not r["ok"]]
    return {"pivot": name, "order": order, "rc": rc, "seconds": round(time.time() - started, 1),
            "closed_s": record.get("closed_s"), "downtime_s": record.get("downtime_s"),
            "held": window.get("held_requests"), "held_wait_max_s": window.get("held_wait_max_s"),
            "held_wait_p95_s": window.get("held_wait_p95_s"), "refused": window.get("refused_requests"),
            "requests": len(client.requests), "failed": len(failed),
            "longest_request_s": round(max((r["end"] - r["start"] for r in client.requests), default=0), 1),
            "gate": [{"concurrency": level.get("concurrency"), "output_tok_s": level.get("output_tok_s")}
                     for level in record.get("gate") or []],
            "tail": out[-3000:] if rc not in (0, 2) else ""}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=os.path.join(tb.REPO, "results", "bench-hold.json"))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-hold-")
    tb.write_inventory(work, {HOST: {
        "ansible_port": HOST_SSH, "llmfleet_models_extra": {m: {"port": p} for m, p in PORTS.items()},
        "model_fetch_hf_endpoint": f"http://127.0.0.1:{HUB_PORT}", "pivot_benchmark": False,
        "pivot_controller_results_dir": os.path.join(work, "results"), "gateway_port": GATEWAY}})
    rows = []
    tb.hub("start", HUB_PORT)
    tb.machine_up(HOST, HOST_SSH, tb.vllm_image())
    try:
        rc, out, _killed = harness.run_pivot(work, ["-e", f"model={MODEL}", "-e", "pivot_gateway=true", "-e", f"pivot_alias={ALIAS}"])
        if rc != 0:
            raise SystemExit(out[-4000:])
        for round_no in range(args.rounds):
            orders = list(ORDERS) if round_no % 2 == 0 else list(reversed(ORDERS))
            for order in orders:
                publish_new_commit()
                rows.append(pivot(work, "new commit", order, []))
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "tail"}), flush=True)
        for order in ORDERS:
            publish_new_commit()
            rows.append(pivot(work, "gate fails", order, ["-e", "pivot_gate_min_output_tok_s=1e9"]))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "tail"}), flush=True)
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1)
    finally:
        tb.machine_down(HOST)
        tb.hub("stop", HUB_PORT)
    print("| pivot | order | rc | closed window s | downtime s | held (longest, p95 s) | refused | client requests | failed | longest request s |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['pivot']} | {r['order']} | {r['rc']} | {r['closed_s']} | {r['downtime_s']} | {r['held']} ({r['held_wait_max_s']}, "
              f"{r['held_wait_p95_s']}) | {r['refused']} | {r['requests']} | {r['failed']} | {r['longest_request_s']} |")
    closed = {order: [r["closed_s"] for r in rows if r["order"] == order and r["pivot"] == "new commit" and r["closed_s"]]
              for order in ORDERS}
    if all(closed.values()):
        before, after = (statistics.median(closed[o]) for o in ORDERS)
        print(f"closed window, median of {len(closed['clients, then gate'])}: gate first {before} s, clients first {after} s:"
              f" {round(after / before, 2)}x")


if __name__ == "__main__":
    main()
