"""Wait until a vLLM unit answers /health, or fail as soon as systemd says it crashed.

    wait-ready.py UNIT HEALTH_URL TIMEOUT_S INTERVAL_S [LAUNCH_RUN_DIR]

Exit 0 when /health answers 200 (HEALTH_URL file:///PATH: when PATH exists and, when it is JSON naming a pid, that pid
is the unit's main process: a file an earlier start left, in a directory systemd did not remove, is not this start's),
printing JSON: time_to_ready_s (the
unit's main process start -> the first 200; for a start behind vllm-launch.py, whose LAUNCH_RUN_DIR/went says when it
went: that moment -> the first 200, so a held start's wait is not counted), held (whether that start was held),
ready_monotonic_s (CLOCK_MONOTONIC then, comparable with systemd's and the journal's monotonic timestamps on this host)
and ready_at (epoch seconds then). Exit 3 when the unit failed or its main process exited during start-up (a bad
flag, an import error: no use waiting out a 30-minute load timeout); 4 on timeout.
"""
import json
import os
import subprocess
import sys
import time
import urllib.request


def main_start_monotonic(unit):
    out = subprocess.run(["systemctl", "show", "-P", "ExecMainStartTimestampMonotonic", unit],
                         capture_output=True, text=True, check=False).stdout.strip()
    return int(out or 0) / 1e6


def unit_state(unit):
    """(ActiveState, SubState, NRestarts) of the unit."""
    out = subprocess.run(["systemctl", "show", "--property=ActiveState,SubState,NRestarts", unit],
                         capture_output=True, text=True, check=False).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return props.get("ActiveState", ""), props.get("SubState", ""), int(props.get("NRestarts") or 0)


def went(run_dir, main_started):
    """The launcher's go of this start (its monotonic seconds, held or not), or (None, None)."""
    try:
        with open(os.path.join(run_dir, "went")) as handle:
            data = json.load(handle)
    except (OSError, ValueError, TypeError):
        return None, None
    if not main_started or data.get("monotonic_s", 0) < main_started:
        return None, None  # an earlier start's
    return data["monotonic_s"], bool(data.get("held"))


def main_pid(unit):
    out = subprocess.run(["systemctl", "show", "-P", "MainPID", unit], capture_output=True, text=True, check=False).stdout
    return int(out.strip() or 0)


def this_starts_file(path, unit):
    """Whether PATH exists and is this start's: a JSON file with a pid (the launcher's armed) must name the unit's main
    process. A unit rewritten without the launcher keeps the directory of its last launcher start when it stops."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    return not isinstance(data, dict) or "pid" not in data or data["pid"] == main_pid(unit)


def healthy(url, unit):
    if url.startswith("file://"):
        return this_starts_file(url[len("file://"):], unit)
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def main():
    unit, url, timeout_s, interval_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    run_dir = sys.argv[5] if len(sys.argv) > 5 else None
    restarts_at_start = unit_state(unit)[2]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if healthy(url, unit):
            ready_monotonic, ready_at = time.clock_gettime(time.CLOCK_MONOTONIC), time.time()
            started = main_start_monotonic(unit)
            went_at, held = went(run_dir, started) if run_dir else (None, None)
            origin = went_at or started
            print(json.dumps({"time_to_ready_s": round(ready_monotonic - origin, 2) if origin else None,
                              "held": held, "ready_monotonic_s": round(ready_monotonic, 3),
                              "ready_at": round(ready_at, 3)}))
            return 0
        state, substate, restarts = unit_state(unit)
        # auto-restart: the main process exited and systemd waits RestartSec before the next try.
        if state == "failed" or substate == "auto-restart" or restarts > restarts_at_start:
            print("%s crashed during start-up (ActiveState=%s, SubState=%s, NRestarts=%s)" % (unit, state, substate, restarts))
            return 3
        time.sleep(interval_s)
    print("%s did not answer %s within %.0f s" % (unit, url, timeout_s))
    return 4


if __name__ == "__main__":
    sys.exit(main())
