# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Golden-answer parity on a real systemd test host with vLLM's CPU engine: false alarms of identical restarts and
what a numeric change the parity key cannot see does to the answers (issue #30).

    .venv/bin/python bench/parity.py [--restarts 20]

A host pivots to tiny-llama-a (the pivot records the golden answers of its parity key). Then, --restarts times, the
unit restarts and playbooks/parity.yml compares the fresh server's answers with the record: every run must match
(a false alarm otherwise); the largest logprob move and the near-ties seen measure the spread the defaults
(pivot_parity_epsilon, pivot_parity_tolerance) must cover. Then each numeric change in CHANGES goes into a drop-in made
by hand, and the check must name the slot: which probes diverged, at which token, by how much. Prints Markdown for
docs/benchmarks.md and writes results/bench-parity.json.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.request

import testbed_bench as tb
# pylint: disable-next=wrong-import-position  # testbed_bench puts the working tree's collection on the path
from ansible_collections.llmfleet.vllm.plugins.module_utils.host_slots import unit_name  # noqa: E402

HOST, SSH_PORT, HUB_PORT, PORT, MODEL = "bench-parity", 2241, 18101, 8741, "tiny-llama-a"
UNIT = "/etc/systemd/system/" + unit_name(MODEL)
DROPIN_DIR = UNIT + ".d"
# Changes a hand-made drop-in can make that the catalog (and so the parity key) does not see.
CHANGES = {
    "rms_norm_eps 1e-5 -> 0.5 (--hf-overrides)": ["--hf-overrides", "'{\"rms_norm_eps\": 0.5}'"],
    "rope_theta 10000 -> 100 (--hf-overrides)": ["--hf-overrides", "'{\"rope_theta\": 100.0}'"],
    "KV cache float32 -> fp8_e5m2 (--kv-cache-dtype)": ["--kv-cache-dtype", "fp8_e5m2"],
}


def healthy_wait(timeout_s: float = 900) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % PORT, timeout=5) as resp:
                if resp.status == 200:
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit("the server did not become healthy in %.0f s:\n%s" % (timeout_s, tb.ssh(HOST, "journalctl", "-u", UNIT.rsplit("/", 1)[1], "-n", "40")))


def restart() -> float:
    tb.ssh(HOST, "systemctl", "daemon-reload", "&&", "systemctl", "restart", os.path.basename(UNIT))
    return healthy_wait()


def check(inventory: str) -> tuple[int, dict]:
    report_file = os.path.join(inventory, "report.json")
    result, _wall = run(inventory, os.path.join(tb.REPO, "playbooks", "parity.yml"), "-e", "parity_report_file=" + report_file)
    with open(report_file, encoding="utf-8") as fh:
        return result.returncode, json.load(fh)[HOST][0]


def run(inventory: str, playbook: str, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(tb.REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    start = time.monotonic()
    result = subprocess.run([tb.ANSIBLE_PLAYBOOK, "-i", inventory, playbook, *args], capture_output=True, text=True,
                            env=env, cwd=tb.REPO, check=False)
    return result, time.monotonic() - start


def set_dropin(extra: list[str] | None) -> None:
    if extra is None:
        tb.ssh(HOST, "rm", "-rf", DROPIN_DIR)
        return
    unit = tb.ssh(HOST, "cat", UNIT)
    exec_start = re.search(r"^ExecStart=((?:.*\\\n)*.*)$", unit, re.M).group(1)
    text = "[Service]\nExecStart=\nExecStart=%s \\\n    %s\n" % (exec_start, " ".join(extra))
    tb.ssh(HOST, "mkdir -p %s && echo %s | base64 -d > %s/bench.conf"
           % (DROPIN_DIR, base64.b64encode(text.encode()).decode(), DROPIN_DIR))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--restarts", type=int, default=20)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="bench-parity-")
    results_dir = os.path.join(workdir, "results")
    tb.write_inventory(workdir, {HOST: {"ansible_port": SSH_PORT, "model_fetch_hf_endpoint": "http://127.0.0.1:%d" % HUB_PORT,
                                        "pivot_benchmark": False, "llmfleet_results_dir": results_dir,
                                        "llmfleet_models_extra": {MODEL: {"port": PORT}}}})
    image = tb.vllm_image()
    tb.hub("start", HUB_PORT)
    tb.machine_up(HOST, SSH_PORT, image)
    out = {"restarts": [], "changes": {}}
    try:
        first, wall = run(workdir, os.path.join(tb.REPO, "playbooks", "pivot.yml"), "-e", "model=" + MODEL)
        if first.returncode:
            raise SystemExit(first.stdout[-4000:])
        out["first_pivot_s"] = round(wall, 1)
        for i in range(args.restarts):
            ready_s = restart()
            rc, report = check(workdir)
            out["restarts"].append({"rc": rc, "status": report["status"], "ready_s": round(ready_s, 1),
                                    "max_logprob_delta": report["max_logprob_delta"], "near_ties": report["near_ties"]})
            print("restart %d: %s, max logprob move %s, near-ties %s" % (i + 1, report["status"], report["max_logprob_delta"],
                                                                         report["near_ties"]), flush=True)
        for name, extra in CHANGES.items():
            set_dropin(extra)
            restart()
            rc, report = check(workdir)
            diverged = [p for p in report["probes"] if p["status"] == "diverged"]
            out["changes"][name] = {"rc": rc, "status": report["status"], "probes": len(report["probes"]),
                                    "diverged": len(diverged), "first_index": sorted(p.get("index") for p in diverged),
                                    "reasons": [p.get("reason") for p in diverged]}
            print("%s: %s, %d of %d probes diverged at tokens %s" % (name, report["status"], len(diverged),
                                                                     len(report["probes"]), out["changes"][name]["first_index"]),
                  flush=True)
            set_dropin(None)
            restart()
    finally:
        tb.machine_down(HOST)
        tb.hub("stop", HUB_PORT)
    os.makedirs(os.path.join(tb.REPO, "results"), exist_ok=True)
    with open(os.path.join(tb.REPO, "results", "bench-parity.json"), "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=2)
    restarts = out["restarts"]
    alarms = sum(1 for r in restarts if r["status"] != "matched")
    print("\n| restarts | matched | false alarms | largest logprob move (nats) | near-ties |\n|---|---|---|---|---|")
    largest = max((r["max_logprob_delta"] or 0) for r in restarts)
    near_ties = sum(r["near_ties"] for r in restarts)
    print("| %d | %d | %d | %s | %d |" % (len(restarts), len(restarts) - alarms, alarms, largest, near_ties))
    print("\n| change by hand (drop-in) | check | probes diverged | first diverging token |\n|---|---|---|---|")
    for name, change in out["changes"].items():
        print("| %s | %s (rc %d) | %d of %d | %s |" % (name, change["status"], change["rc"], change["diverged"],
                                                       change["probes"], ", ".join(map(str, change["first_index"])) or "-"))


if __name__ == "__main__":
    main()
