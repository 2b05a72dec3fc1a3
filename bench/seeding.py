# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fleet wall time of staging a model: downloaded once and seeded over the LAN, against every host pulling from the hub.

    .venv/bin/python bench/seeding.py [--hosts 4] [--pairs 3] [--uplink-mb-s 0.5] [--model tiny-llama-a]

Boots --hosts systemd test hosts (the base rootfs: staging needs no engine) and the local hub with its uplink throttled
to --uplink-mb-s for all downloads together (a site's one link to the hub). Then, side by side in one run, pairs of
`playbooks/rollout.yml -e rollout_stage_only=true` over all hosts, in the order A B B A A B ...:
  * A: seeding (the default): one host downloads, the others copy host to host with rsync;
  * B: the peer, `-e rollout_seed=false`: every host downloads from the hub.
Before each timed run every host's copy of the model is deleted, so each run stages from nothing. An untimed run of
B first installs the hub client on every host. Prints each pair, the median ratio A/B of the wall times, and the hub's
bytes per run (from its request log); writes results/bench-seeding.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import urllib.request

import testbed_bench as tb

HUB_PORT = 18097
SSH_PORT_BASE = 2290


def hub_call(method: str, path: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{HUB_PORT}{path}", data=data, method=method)
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.load(resp) if method == "GET" else None


def hub_body_bytes() -> int:
    return sum(e["bytes_sent"] for e in hub_call("GET", "/_fixture/requests") if e.get("file") and e["method"] == "GET")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--uplink-mb-s", type=float, default=0.5)
    parser.add_argument("--model", default="tiny-llama-a", choices=tb.MODELS)
    args = parser.parse_args()
    names = [f"bench-seed-{i}" for i in range(1, args.hosts + 1)]
    work = tempfile.mkdtemp(prefix="bench-seeding-")
    inventory = os.path.join(work, "inventory")
    os.makedirs(inventory)
    tb.write_inventory(inventory, {name: {"ansible_port": SSH_PORT_BASE + i,
                                          "model_fetch_hf_endpoint": f"http://127.0.0.1:{HUB_PORT}",
                                          "pivot_controller_results_dir": os.path.join(work, "results")}
                                   for i, name in enumerate(names, start=1)})
    playbook = os.path.join(tb.REPO, "playbooks", "rollout.yml")
    modes = {"A": ("seeded", []), "B": ("every host from the hub", ["-e", "rollout_seed=false"])}
    tb.hub("start", HUB_PORT)
    runs = []
    try:
        for i, name in enumerate(names, start=1):
            tb.machine_up(name, SSH_PORT_BASE + i, "")
        hub_call("POST", "/_fixture/faults", {"uplink_rate": int(args.uplink_mb_s * 1e6)})
        model_bytes = sum(s["size"] for s in hub_call("GET", f"/api/models/llmfleet-test/{args.model}?blobs=true")["siblings"])

        def staged_run(mode: str, timed: bool = True) -> None:
            for name in names:
                tb.ssh(name, f"rm -rf /srv/models/{args.model} /srv/models/{args.model}--*")
            hub_call("DELETE", "/_fixture/requests")
            label, extra = modes[mode]
            result, wall = tb.run_playbook(inventory, playbook, "-e", f"model={args.model}", "-e",
                                           "rollout_stage_only=true", *extra, forks=args.hosts,
                                           log=os.path.join(work, f"run-{len(runs)}-{mode}.log"))
            if timed:
                runs.append({"mode": mode, "label": label, "wall_s": round(wall, 1), "hub_bytes": hub_body_bytes(),
                             "load": tb.load_average()})
                print(f"{mode} {label}: {wall:.1f} s, hub sent {runs[-1]['hub_bytes'] / 1e6:.1f} MB", flush=True)
            assert "staged" in result.stdout
            if mode == "A":
                assert runs[-1]["hub_bytes"] < 1.5 * model_bytes if timed else True
            elif timed:
                assert runs[-1]["hub_bytes"] >= 0.9 * args.hosts * model_bytes, runs[-1]

        staged_run("B", timed=False)
        order = "".join("AB" if pair % 2 == 0 else "BA" for pair in range(args.pairs))
        for mode in order:
            staged_run(mode)
    finally:
        for name in names:
            tb.machine_down(name)
        tb.hub("stop", HUB_PORT)
    walls = {mode: [r["wall_s"] for r in runs if r["mode"] == mode] for mode in modes}
    ratios = [a / b for a, b in zip(walls["A"], walls["B"])]
    summary = {"hosts": args.hosts, "uplink_mb_s": args.uplink_mb_s, "model": args.model, "runs": runs,
               "ratio_median": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
               "wall_s": {m: tb.spread(w) for m, w in walls.items()},
               "hub_mb": {m: tb.spread([r["hub_bytes"] / 1e6 for r in runs if r["mode"] == m]) for m in modes}}
    os.makedirs(os.path.join(tb.REPO, "results"), exist_ok=True)
    with open(os.path.join(tb.REPO, "results", "bench-seeding.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2)
    print("\n| run | wall s, median (min-max) | MB from the hub |\n|---|---|---|")
    for mode, (label, _extra) in modes.items():
        print(f"| {mode}: {label} | {summary['wall_s'][mode]} | {summary['hub_mb'][mode]} |")
    print(f"\nseeded / every host from the hub, pair by pair: {summary['ratios']}, median {summary['ratio_median']}")


if __name__ == "__main__":
    main()
