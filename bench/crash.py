# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every task boundary of a pivot's switch phase, killed: the crash harness over both strategies, on a real systemd
test host with vLLM's CPU engine and Debian's HAProxy (docs/pivot-safety.md).

    .venv/bin/python bench/crash.py [--modes blue_green stop_start] [--every-task] [--stride 1] [--reboot-every 1]
                                    [--first N --last M] [--hold] [--tasks NAME ...]

For each mode, one unkilled pivot counts the switch phase's tasks (from the intent through the record step) and notes
which of them changed the host. A kill after a task that changed nothing (skipped, a fact, a check, a wait) leaves the
host as the kill after the last changing task before it: by default the bench tries the boundaries after each
changing task (--every-task: after every task). For each boundary N a pivot to the other model is killed (SIGKILL,
the whole controller) after N tasks of the phase, while an `openai` client sends the slot's alias `chat` through the
gateway; the harness checks that the alias answers or says 503 with Retry-After, reloads HAProxy and reboots the host
(every --reboot-every boundaries, each by default), then re-runs the same command once and checks that the host
serves the intended model with record, units and gateway agreeing. Prints a Markdown table and writes
results/bench-crash.json.

--hold: the boundaries of the gateway's request hold by task name (HOLD_BOUNDARIES: the kill comes as the first task of
the phase with that in its name starts, so they stay put when tasks are added elsewhere), in a stop-then-start that
commits and in one whose gate no model passes (mode stop_start_gate_fails: the rollback's window; its re-run heals,
pivots again and rolls back again). The slot holds each request at most HOLD_S (gateway_hold_s): a trial also fails
when a client request took longer than that and its answer (HOLD_SLACK_S), outside the host's reboot. --tasks: other
boundaries by name.
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
MODE_ARGS = {"blue_green": [], "stop_start": ["-e", "pivot_blue_green=false"],
             "stop_start_gate_fails": ["-e", "pivot_blue_green=false", "-e", "pivot_gate_min_output_tok_s=1000000"]}
# Modes whose pivot fails and rolls back: the host keeps serving the model it served.
FAILING_MODES = {"stop_start_gate_fails"}
RECORD_STEP_END = "Write this host's serving record"
REBOOT_WINDOW_S = 5
HOLD_S, HOLD_SLACK_S = 20, 25
# Issue 44: a run killed while the gateway holds the slot's requests (docs/pivot-safety.md).
HOLD_BOUNDARIES = {
    "stop_start": [
        "Drain the previous model",  # the window closed, the old model finishing its requests in flight
        "Hand over to the new model",  # drained, the old model still up, requests held
        "Smoke test the new model",  # the old model stopped, the new one up, requests held
        "Read from the journal when the old model began to stop",  # admitted to the new model, not gated
        "Commit the new model as the slot's",  # gated, not committed
        "End the slot's window",  # committed, the window still open on the new model
    ],
    "stop_start_gate_fails": [
        "Hold the slot's new requests at the gateway until the previous model is admitted again",  # gate failed, admitted
        "Stop and disable the new model's service",  # the window closed again, the new model drained
        "Wait until the previous model serves again",  # the previous model starting, requests held
        "Send the slot's requests to the restored model at the gateway",  # it serves, not admitted yet
        "End the slot's window",  # rolled back, the window still open on the previous model
    ],
}


def boundaries(inventory, work, mode, target):
    """The switch phase's tasks, from one unkilled pivot to `target` (which the host then serves, unless the mode's
    pivot fails), and all of them (named boundaries may come after the record step)."""
    log = os.path.join(work, f"count-{mode}.tsv")
    rc, out, _killed = harness.run_pivot(inventory, ["-e", f"model={target}", *MODE_ARGS[mode]], task_log=log)
    with open(os.path.join(work, f"count-{mode}.log"), "w", encoding="utf-8") as handle:
        handle.write(out)
    if (rc != 0) != (mode in FAILING_MODES):
        raise SystemExit(f"counting run of {mode} ended with {rc}:\n{out[-4000:]}")
    tasks = harness.phase_tasks(log)
    # The record step ends with the serving record (written at the commit too: the last one is the record step's).
    last = max((i for i, _a, name in tasks if RECORD_STEP_END in name), default=tasks[-1][0])
    return [t for t in tasks if t[0] <= last], harness.changed_tasks(log), tasks


def named(tasks, names):
    """(index, action, name) of the first task of the phase whose name holds each of `names` (as the kill finds it)."""
    chosen = []
    for text in names:
        found = [t for t in tasks if text in t[2]]
        if not found:
            raise SystemExit(f"no task of the switch phase is named with {text!r}")
        chosen.append((found[0][0], found[0][1], text))
    return chosen


def hold_verdicts(since):
    """The gateway's hold verdicts since `since` (its own log lines, as the pivot's gateway_window reads them)."""
    lines = harness.ssh(HOST, f"journalctl -t haproxy -o cat --no-pager -q --since=@{int(since)} | grep '^llmfleet-hold slot='")
    kinds = {"held": " held ", "admitted then ended": " ended: ", "503 at gateway_hold_s": "(gateway_hold_s)",
             "503 at gateway_hold_max": "(gateway_hold_max)"}
    return {kind: sum(text in line for line in lines.splitlines()) for kind, text in kinds.items()}


def trial(inventory, work, mode, target, boundary, name, reboot, serving):
    """Pivot to `target`, killed at `boundary` (a task count, or a name); the host must then serve `serving` after the
    re-run when the mode's pivot fails, else `target`."""
    # A held request's own timeout well past its bound: one waiting too long is seen as such, not as a timeout.
    client = ContinuousClient(GW_URL + "/v1", ALIAS, max_seconds=3600, timeout_s=4 * (HOLD_S + HOLD_SLACK_S))
    started = time.time()
    fails = mode in FAILING_MODES
    with client:
        seen = harness.crash_and_heal(HOST, inventory, ["-e", f"model={target}", *MODE_ARGS[mode]], boundary, GW_URL,
                                      ALIAS, serving if fails else target, reboot=reboot,
                                      task_log=os.path.join(work, "trial.tsv"), rerun_fails=fails)
    failed = [r for r in client.requests if not r["ok"]]
    not_503 = [r for r in failed if not (r["status"] == 503 and r.get("retry_after"))]
    # The reboot of the host that runs the gateway refuses connections for a moment: expected. Any other failure that
    # is not a 503 with Retry-After breaks the promise; HAProxy's log lines of its time (httplog: timers and how the
    # session ended) are kept with it. So does a request that waited past its bound at the gateway's hold.
    reboot_at = seen["at"].get("reboot")

    def at_reboot(r):
        return reboot_at and r["end"] >= reboot_at and r["start"] <= reboot_at + REBOOT_WINDOW_S
    unexpected = [r for r in not_503 if not at_reboot(r)]
    too_long = [r for r in client.requests if r["end"] - r["start"] > HOLD_S + HOLD_SLACK_S and not at_reboot(r)]
    seen["longest_s"] = round(max((r["end"] - r["start"] for r in client.requests), default=0), 1)
    seen["over_bound"] = [{"at_s": round(r["start"] - started, 1), "took_s": round(r["end"] - r["start"], 1),
                           "status": r["status"]} for r in too_long]
    seen["hold"] = hold_verdicts(started)
    seen["unexpected"] = [{"at_s": round(r["start"] - started, 1), "status": r["status"], "error": r["error"],
                           "haproxy": harness.ssh(HOST, "journalctl -t haproxy -o short-unix --no-pager -q"
                                                        f" --since=@{int(r['start']) - 2} --until=@{int(r['end']) + 2}"
                                                        " | grep -v ' 503 ' | tail -80")}
                          for r in unexpected]
    seen["healed"] = seen["healed"] and not unexpected and not too_long
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
    parser.add_argument("--hold", action="store_true",
                        help="the hold's boundaries by name (HOLD_BOUNDARIES; modes stop_start stop_start_gate_fails unless --modes)")
    parser.add_argument("--tasks", nargs="+", default=[], help="boundaries by name: before the first task so named")
    parser.add_argument("--serving", default="tiny-llama-a", choices=list(PORTS), help="the model served before the first mode")
    parser.add_argument("--out", default=os.path.join(tb.REPO, "results", "bench-crash.json"))
    args = parser.parse_args()
    if args.hold and "--modes" not in sys.argv:
        args.modes = list(HOLD_BOUNDARIES)
    work = tempfile.mkdtemp(prefix="bench-crash-")
    # The inventory in a folder of its own: Ansible reads every file of an inventory folder as a source (the task
    # logs and the pivots' records beside it were read as inventories, and warned about, in every run).
    inventory = os.path.join(work, "inventory")
    os.makedirs(inventory)
    results = os.path.join(work, "results")
    tb.write_inventory(inventory, {HOST: {
        "ansible_port": HOST_SSH, "llmfleet_models_extra": {m: {"port": p} for m, p in PORTS.items()},
        "model_fetch_hf_endpoint": f"http://127.0.0.1:{HUB_PORT}", "pivot_benchmark": False,
        "pivot_controller_results_dir": results, "gateway_port": GATEWAY, "gateway_retry_after_s": 5,
        "gateway_hold_s": HOLD_S}})
    rows, all_tasks, changing = [], {}, {}
    tb.hub("start", HUB_PORT)
    tb.machine_up(HOST, HOST_SSH, tb.vllm_image())
    try:
        rc, out, _killed = harness.run_pivot(inventory, ["-e", f"model={args.serving}", "-e", "pivot_gateway=true", "-e", f"pivot_alias={ALIAS}"])
        if rc != 0:
            raise SystemExit(out[-4000:])
        serving = args.serving
        for mode in args.modes:
            fails = mode in FAILING_MODES
            target = tb.other_model(serving)
            tasks, changed, phase = boundaries(inventory, work, mode, target)
            serving = serving if fails else target
            # The unkilled run must leave the host as promised too: a trial that starts from a broken host says nothing.
            left = harness.agrees(harness.host_state(HOST), serving)
            if left:
                raise SystemExit(f"the unkilled run of {mode} left the host not serving {serving} as recorded: {left}")
            if args.hold or args.tasks:
                chosen = named(phase, args.tasks or HOLD_BOUNDARIES.get(mode, []))
            else:
                distinct = tasks if args.every_task else [t for t in tasks if t[0] in changed]
                chosen = [t for t in distinct[::args.stride] if args.first <= t[0] <= args.last]
            print(f"{mode}: {len(tasks)} boundaries, {len(changed)} after a task that changed the host, trying {len(chosen)}",
                  flush=True)
            all_tasks[mode], changing[mode] = phase, changed
            for count, (index, _action, name) in enumerate(chosen):
                target = tb.other_model(serving)
                reboot = args.reboot_every > 0 and count % args.reboot_every == args.reboot_every - 1
                # A named boundary is killed by its name: where the phase's count of it was (index) is for the table.
                boundary = name if (args.hold or args.tasks) else index
                seen = trial(inventory, work, mode, target, boundary, name, reboot, serving)
                seen["index"] = index
                rows.append(seen)
                shown = ("mode", "boundary", "index", "task", "killed", "bad_answers", "healed", "problems", "failed",
                         "failed_not_503", "unexpected", "longest_s", "over_bound", "hold", "at", "seconds")
                print(json.dumps({k: seen[k] for k in shown}), flush=True)
                serving = serving if fails else target
                if not seen["healed"]:
                    serving = harness.host_state(HOST)["record"].get("model") or serving
                os.makedirs(os.path.dirname(args.out), exist_ok=True)
                with open(args.out, "w", encoding="utf-8") as handle:
                    json.dump({"tasks": all_tasks, "changed": changing, "trials": rows}, handle, indent=1)
    finally:
        tb.machine_down(HOST)
        tb.hub("stop", HUB_PORT)
    print("| mode | after task | killed | answers after kill / reload / reboot | healed by one re-run | requests | failed (not 503 + Retry-After)"
          " | longest request (s) | held / 503 at the hold's bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        answers = "/".join(",".join(sorted(set(r.get(k, [])))) or "-" for k in ("after_kill", "after_reload", "after_reboot"))
        print(f"| {r['mode']} | {r['index']} {r['task']} | {r['killed']} | {answers} | {r['healed']} | {r['requests']} |"
              f" {r['failed']} ({r['failed_not_503']}) | {r['longest_s']} | {r['hold']['held']} /"
              f" {r['hold']['503 at gateway_hold_s'] + r['hold']['503 at gateway_hold_max']} |")


if __name__ == "__main__":
    main()
