# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every task boundary of a pivot's switch phase, killed: the crash harness over both strategies, on a real systemd
test host with vLLM's CPU engine and Debian's HAProxy (docs/pivot-safety.md).

    .venv/bin/python bench/crash.py [--modes blue_green stop_start] [--every-task] [--stride 1] [--reboot-every 1]
                                    [--first N --last M]

For each mode, one unkilled pivot counts the switch phase's tasks (from the intent through the record step) and notes
which of them changed the host. A kill after a task that changed nothing (skipped, a fact, a check, a wait) leaves the
host as the kill after the last changing task before it: by default the bench tries the boundaries after each
changing task (--every-task: after every task). For each boundary N a pivot to the other model is killed (SIGKILL,
the whole controller) after N tasks of the phase, while an `openai` client sends the slot's alias `chat` through the
gateway; the harness checks that the alias answers or says 503 with Retry-After, reloads HAProxy and reboots the host
(every --reboot-every boundaries, each by default), then re-runs the same command once and checks that the host
serves the intended model with record, units and gateway agreeing. Prints a Markdown table and writes
results/bench-crash.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import testbed_bench as tb

sys.path.insert(0, os.path.join(tb.REPO, "tools", "traffic"))
sys.path.insert(0, os.path.join(tb.REPO, "tools", "crash"))
from continuous_client import ContinuousClient  # noqa: E402  pylint: disable=wrong-import-position
import harness  # noqa: E402  pylint: disable=wrong-import-position

HUB_PORT, HOST, HOST_SSH, GATEWAY = 18099, "bench-crash", 2239, 8890
PORTS = {"tiny-llama-a": 8801, "tiny-llama-b": 8802}
GW_URL, ALIAS = f"http://127.0.0.1:{GATEWAY}", "chat"
MODE_ARGS = {"blue_green": [], "stop_start": ["-e", "pivot_blue_green=false"]}
RECORD_STEP_END = "Write this host's serving record"
REBOOT_WINDOW_S = 5


def boundaries(inventory, work, mode, target):
    """The switch phase's tasks, from one unkilled pivot to `target` (which the host then serves)."""
    log = os.path.join(work, f"count-{mode}.tsv")
    rc, out, _killed = harness.run_pivot(inventory, ["-e", f"model={target}", *MODE_ARGS[mode]], task_log=log)
    if rc != 0:
        raise SystemExit(f"counting run of {mode} failed:\n{out[-4000:]}")
    tasks = harness.phase_tasks(log)
    # The record step ends with the serving record (written at the commit too: the last one is the record step's).
    last = max((i for i, _a, name in tasks if RECORD_STEP_END in name), default=tasks[-1][0])
    return [t for t in tasks if t[0] <= last], harness.changed_tasks(log)


def trial(inventory, work, mode, target, boundary, name, reboot):
    client = ContinuousClient(GW_URL + "/v1", ALIAS, max_seconds=3600)
    started = time.time()
    with client:
        seen = harness.crash_and_heal(HOST, inventory, ["-e", f"model={target}", *MODE_ARGS[mode]], boundary, GW_URL,
                                      ALIAS, target, reboot=reboot, task_log=os.path.join(work, "trial.tsv"))
    failed = [r for r in client.requests if not r["ok"]]
    not_503 = [r for r in failed if not (r["status"] == 503 and r.get("retry_after"))]
    # The reboot of the host that runs the gateway refuses connections for a moment: expected. Any other failure that
    # is not a 503 with Retry-After breaks the promise; HAProxy's log lines of its time (httplog: timers and how the
    # session ended) are kept with it.
    reboot_at = seen["at"].get("reboot")
    unexpected = [r for r in not_503 if not (reboot_at and r["end"] >= reboot_at and r["start"] <= reboot_at + REBOOT_WINDOW_S)]
    seen["unexpected"] = [{"at_s": round(r["start"] - started, 1), "status": r["status"], "error": r["error"],
                           "haproxy": harness.ssh(HOST, "journalctl -t haproxy -o short-unix --no-pager -q"
                                                        f" --since=@{int(r['start']) - 2} --until=@{int(r['end']) + 2}"
                                                        " | grep -v ' 503 ' | tail -80")}
                          for r in unexpected]
    seen["healed"] = seen["healed"] and not unexpected
    # When and how the others failed, against the trial's own times (kill, reload, reboot, re-run in `seen`).
    seen["at"] = {step: round(at - started, 1) for step, at in seen["at"].items()}
    seen.update(mode=mode, target=target, task=name, seconds=round(time.time() - started, 1),
                requests=len(client.requests), failed=len(failed), failed_not_503=len(not_503),
                not_503=[{"at_s": round(r["start"] - started, 1), "status": r["status"], "error": r["error"]}
                         for r in not_503])
    return seen


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--modes", nargs="+", default=list(MODE_ARGS), choices=list(MODE_ARGS))
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--last", type=int, default=10**6)
    parser.add_argument("--reboot-every", type=int, default=1, help="0: never")
    parser.add_argument("--every-task", action="store_true", help="also the boundaries after tasks that changed nothing")
    parser.add_argument("--out", default=os.path.join(tb.REPO, "results", "bench-crash.json"))
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-crash-")
    results = os.path.join(work, "results")
    tb.write_inventory(work, {HOST: {
        "ansible_port": HOST_SSH, "llmfleet_models_extra": {m: {"port": p} for m, p in PORTS.items()},
        "model_fetch_hf_endpoint": f"http://127.0.0.1:{HUB_PORT}", "pivot_benchmark": False,
        "pivot_controller_results_dir": results, "gateway_port": GATEWAY, "gateway_retry_after_s": 5}})
    rows, all_tasks, changing = [], {}, {}
    tb.hub("start", HUB_PORT)
    tb.machine_up(HOST, HOST_SSH, tb.vllm_image())
    try:
        rc, out, _killed = harness.run_pivot(work, ["-e", "model=tiny-llama-a", "-e", "pivot_gateway=true", "-e", f"pivot_alias={ALIAS}"])
        if rc != 0:
            raise SystemExit(out[-4000:])
        serving = "tiny-llama-a"
        for mode in args.modes:
            serving = tb.other_model(serving)
            tasks, changed = boundaries(work, work, mode, serving)
            distinct = tasks if args.every_task else [t for t in tasks if t[0] in changed]
            chosen = [t for t in distinct[::args.stride] if args.first <= t[0] <= args.last]
            print(f"{mode}: {len(tasks)} boundaries, {len(changed)} after a task that changed the host, trying {len(chosen)}",
                  flush=True)
            all_tasks[mode], changing[mode] = tasks, changed
            for count, (index, _action, name) in enumerate(chosen):
                serving = tb.other_model(serving)
                reboot = args.reboot_every > 0 and count % args.reboot_every == args.reboot_every - 1
                seen = trial(work, work, mode, serving, index, name, reboot)
                rows.append(seen)
                shown = ("mode", "boundary", "task", "killed", "bad_answers", "healed", "problems", "failed",
                         "failed_not_503", "unexpected", "at", "seconds")
                print(json.dumps({k: seen[k] for k in shown}), flush=True)
                if not seen["healed"]:
                    serving = harness.host_state(HOST)["record"].get("model") or serving
                os.makedirs(os.path.dirname(args.out), exist_ok=True)
                with open(args.out, "w", encoding="utf-8") as handle:
                    json.dump({"tasks": all_tasks, "changed": changing, "trials": rows}, handle, indent=1)
    finally:
        tb.machine_down(HOST)
        tb.hub("stop", HUB_PORT)
    print("| mode | after task | killed | answers after kill / reload / reboot | healed by one re-run | requests | failed (not 503 + Retry-After) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        answers = "/".join(",".join(sorted(set(r.get(k, [])))) or "-" for k in ("after_kill", "after_reload", "after_reboot"))
        print(f"| {r['mode']} | {r['boundary']} {r['task']} | {r['killed']} | {answers} | {r['healed']} | {r['requests']} |"
              f" {r['failed']} ({r['failed_not_503']}) |")


if __name__ == "__main__":
    main()
