# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Client requests during pivots and rollouts, behind the gateway and without it, on real systemd test hosts
with vLLM's CPU engine and Debian's HAProxy.

    .venv/bin/python bench/traffic.py [--parts host fleet]

An `openai` client (tools/traffic/continuous_client.py: one request at a time, 4 tokens, every 0.5 s) sends the
alias `chat` the whole time, and every failed request is counted. Side by side in one run:
  host (one test host, slot default):
    * peer: stop-then-start pivot tiny-llama-a -> b with the client on vLLM's port (no gateway);
    * (b) blue/green pivot b -> a behind the host's gateway, the client on the gateway;
    * (d) rollback under load: a pivot to b whose gate cannot pass, behind the gateway;
    * (c) stop-then-start behind the gateway (a new upstream commit of a): failures must all be 503 with
      Retry-After, inside the window the gateway was closed.
  fleet (three test hosts and a fourth as the fleet gateway):
    * peer: rollout.yml a -> b without the fleet gateway, the client on the first host's port;
    * (a) rollout.yml b -> a behind the fleet gateway (batch of 1 after the canary), the client on the gateway.
Prints a Markdown table for docs/benchmarks.md and writes results/bench-traffic.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import testbed_bench as tb

sys.path.insert(0, os.path.join(tb.REPO, "tools", "traffic"))
from continuous_client import ContinuousClient  # noqa: E402  pylint: disable=wrong-import-position

HUB_PORT = 18097
ALIAS = "chat"
HOST, HOST_SSH, HOST_GATEWAY, HOST_PORTS = "bench-traffic", 2237, 8790, {"tiny-llama-a": 8701, "tiny-llama-b": 8702}
FLEET = {f"bench-traffic-{i}": (2290 + i, {"tiny-llama-a": 8710 + 2 * i, "tiny-llama-b": 8711 + 2 * i}) for i in (1, 2, 3)}
FLEET_GATEWAY, FLEET_GATEWAY_SSH, FLEET_GATEWAY_PORT = "bench-traffic-gw", 2294, 8791


def host_vars(ssh_port: int, ports: dict, results: str, **extra) -> dict:
    return {"ansible_port": ssh_port, "llmfleet_models_extra": {m: {"port": p} for m, p in ports.items()},
            "model_fetch_hf_endpoint": f"http://127.0.0.1:{HUB_PORT}", "pivot_benchmark": False,
            "pivot_controller_results_dir": results, "pivot_alias": ALIAS, **extra}


def measured(base_url: str, action) -> tuple[dict, list, object]:
    """Run action() while the client sends requests to base_url; returns (summary, requests, action's result)."""
    client = ContinuousClient(base_url + "/v1", ALIAS, max_seconds=3600)
    with client:
        result = action()
        time.sleep(2)  # requests after the change count too
    return client.summary(), client.requests, result


def row(part: str, scenario: str, path: str, summary: dict, requests: list, record: dict | None = None) -> dict:
    failed = [r for r in requests if not r["ok"]]
    polite = [r for r in failed if r["status"] == 503 and r.get("retry_after")]
    window = None
    if record and record.get("gateway_closed_at") is not None:
        closed, opened = record["gateway_closed_at"], record["gateway_opened_at"]
        window = all(closed - 0.5 <= r["start"] and r["end"] <= opened + 0.5 for r in failed)
    return {"part": part, "scenario": scenario, "path": path, "requests": summary["requests"], "failed": len(failed),
            "failed_503_retry_after": len(polite), "failures_inside_closed_window": window,
            "downtime_s": (record or {}).get("downtime_s"), "strategy": (record or {}).get("strategy"),
            "errors": summary["errors"][:3]}


def run_host_part(work: str, image: str) -> list[dict]:
    results, inventory = os.path.join(work, "host-results"), os.path.join(work, "host-inventory")
    os.makedirs(inventory)
    tb.write_inventory(inventory, {HOST: host_vars(HOST_SSH, HOST_PORTS, results, gateway_port=HOST_GATEWAY,
                                                   gateway_retry_after_s=5)})
    pivot_yml = os.path.join(tb.REPO, "playbooks", "pivot.yml")
    gateway = ("-e", "pivot_gateway=true")
    direct_url, gateway_url = f"http://127.0.0.1:{HOST_PORTS['tiny-llama-a']}", f"http://127.0.0.1:{HOST_GATEWAY}"
    rows = []
    tb.machine_up(HOST, HOST_SSH, image)
    try:
        tb.run_playbook(inventory, pivot_yml, "-e", "model=tiny-llama-a", log=os.path.join(work, "host-0.log"))
        summary, requests, _result = measured(direct_url, lambda: tb.run_playbook(
            inventory, pivot_yml, "-e", "model=tiny-llama-b", log=os.path.join(work, "host-peer.log")))
        rows.append(row("host", "pivot a -> b, stop then start", "vLLM port (peer)", summary, requests,
                        tb.read_pivot_record(results, HOST, "tiny-llama-b")))
        # The slot moves behind the gateway (vLLM rebinds to loopback): not measured.
        tb.run_playbook(inventory, pivot_yml, "-e", "model=tiny-llama-b", *gateway, log=os.path.join(work, "host-gw.log"))
        summary, requests, _result = measured(gateway_url, lambda: tb.run_playbook(
            inventory, pivot_yml, "-e", "model=tiny-llama-a", *gateway, log=os.path.join(work, "host-bg.log")))
        rows.append(row("host", "(b) pivot b -> a, blue/green", "gateway", summary, requests,
                        tb.read_pivot_record(results, HOST, "tiny-llama-a")))
        summary, requests, _result = measured(gateway_url, lambda: subprocess.run(
            [tb.ANSIBLE_PLAYBOOK, "-i", inventory, pivot_yml, "-e", "model=tiny-llama-b", *gateway,
             "-e", "pivot_gate_min_output_tok_s=1e9"], capture_output=True, text=True, cwd=tb.REPO, check=False,
            env=dict(os.environ, ANSIBLE_CONFIG=os.path.join(tb.REPO, "ansible.cfg"))))
        rows.append(row("host", "(d) pivot a -> b failing its gate: rollback", "gateway", summary, requests))
        subprocess.run([tb.HUB, "publish", str(HUB_PORT), "tiny-llama-a"], check=True, capture_output=True)
        summary, requests, _result = measured(gateway_url, lambda: tb.run_playbook(
            inventory, pivot_yml, "-e", "model=tiny-llama-a", "-e", "revision=main", *gateway,
            log=os.path.join(work, "host-stop-start.log")))
        rows.append(row("host", "(c) a -> a at a new commit, stop then start", "gateway", summary, requests,
                        tb.read_pivot_record(results, HOST, "tiny-llama-a")))
    finally:
        tb.machine_down(HOST)
    return rows


def run_fleet_part(work: str, image: str) -> list[dict]:
    results, inventory = os.path.join(work, "fleet-results"), os.path.join(work, "fleet-inventory")
    os.makedirs(inventory)
    tb.write_inventory(inventory, {h: host_vars(ssh, ports, results, rollout_min_tok_s_ratio=0.05)
                                   for h, (ssh, ports) in FLEET.items()})
    with open(os.path.join(inventory, "hosts.yml"), "a", encoding="utf-8") as fh:
        fh.write(f"  children:\n    bench_fleet_gateways:\n      hosts:\n        {FLEET_GATEWAY}:\n"
                 f"          ansible_port: {FLEET_GATEWAY_SSH}\n          gateway_port: {FLEET_GATEWAY_PORT}\n")
    rollout_yml = os.path.join(tb.REPO, "playbooks", "rollout.yml")
    first_host = next(iter(FLEET.values()))[1]["tiny-llama-a"]
    hosts = ",".join(FLEET)
    rows = []
    for host, (ssh, _ports) in FLEET.items():
        tb.machine_up(host, ssh, image)
    tb.machine_up(FLEET_GATEWAY, FLEET_GATEWAY_SSH, image)
    try:
        common = ("-e", "rollout_batch_size=1", "-e", f"rollout_hosts={hosts}")
        tb.run_playbook(inventory, rollout_yml, "-e", "model=tiny-llama-a", *common, log=os.path.join(work, "fleet-0.log"))
        summary, requests, _result = measured(f"http://127.0.0.1:{first_host}", lambda: tb.run_playbook(
            inventory, rollout_yml, "-e", "model=tiny-llama-b", *common, log=os.path.join(work, "fleet-peer.log")))
        rows.append(row("fleet", "rollout a -> b over 3 hosts", "first host's port (peer)", summary, requests))
        gateway_group = ("-e", "rollout_gateway_group=bench_fleet_gateways")
        # The fleet gateway comes up with a rollout that changes nothing (b again): not measured.
        tb.run_playbook(inventory, rollout_yml, "-e", "model=tiny-llama-b", *common, *gateway_group,
                        log=os.path.join(work, "fleet-gw-setup.log"))
        summary, requests, _result = measured(f"http://127.0.0.1:{FLEET_GATEWAY_PORT}", lambda: tb.run_playbook(
            inventory, rollout_yml, "-e", "model=tiny-llama-a", *common, *gateway_group, log=os.path.join(work, "fleet-gw.log")))
        rows.append(row("fleet", "(a) rollout b -> a over 3 hosts", "fleet gateway", summary, requests))
    finally:
        for host in [*FLEET, FLEET_GATEWAY]:
            tb.machine_down(host)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=["host", "fleet"], default=["host", "fleet"])
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-traffic-")
    image = tb.vllm_image()
    load_before = tb.load_average()
    tb.hub("start", HUB_PORT)
    rows = []
    try:
        if "host" in args.parts:
            rows += run_host_part(work, image)
        if "fleet" in args.parts:
            rows += run_fleet_part(work, image)
    finally:
        tb.hub("stop", HUB_PORT)
    os.makedirs(os.path.join(tb.REPO, "results"), exist_ok=True)
    with open(os.path.join(tb.REPO, "results", "bench-traffic.json"), "w", encoding="utf-8") as fh:
        json.dump({"rows": rows, "logs": work, "load_average_before": load_before}, fh, indent=2)
    print(f"\none client, one request at a time every 0.5 s (4 tokens); logs under {work}; load before: {load_before}\n")
    print("| part | change | client on | requests | failed | of them 503 + Retry-After | inside the closed window | downtime s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        inside = "-" if r["failures_inside_closed_window"] is None else ("yes" if r["failures_inside_closed_window"] else "NO")
        downtime = "-" if r["downtime_s"] is None else r["downtime_s"]
        print(f"| {r['part']} | {r['scenario']} | {r['path']} | {r['requests']} | {r['failed']} | "
              f"{r['failed_503_retry_after']} | {inside} | {downtime} |")


if __name__ == "__main__":
    main()
