# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where a vLLM start's time went, read from the server's own log (issue 45, item 5).

A start is cut at landmark lines vLLM writes on its way to serving (the same in vLLM 0.26 CUDA and 0.32 CPU), and at
the `llmfleet-launch:` lines of roles/service_deploy/files/vllm-launch.py when the launcher ran it:

    unit start -> [launcher: imported -> prefetched -> armed -> go] -> args parsed -> engine process logs
    -> weights loaded -> KV cache sized (compile and profiling done) -> CUDA graphs captured -> engine ready
    -> API server listening -> first good /health (from the caller)

vLLM stamps its lines to the second (`INFO 12-06 00:37:29`), without a year: a phase is good to about a second, and
a line's month and day are placed in the year of the start. What vLLM says it measured itself (weights, graphs,
compilation) is kept beside the phases at its own precision.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import calendar
import json
import re
import time

LAUNCH_PREFIX = "llmfleet-launch: "
_STAMP = re.compile(r"(?:INFO|WARNING|ERROR|DEBUG) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)")

# Landmark name -> the text that marks it; the first line holding it after the start (and after `go`) counts.
LANDMARKS = (
    ("args", "non-default args"),
    ("engine", "Initializing a V1 LLM engine"),
    ("weights", "Model loading took"),
    ("kv_cache", "Available KV cache memory"),
    ("graphs", "Graph capturing finished"),
    ("engine_ready", "init engine (profile, create kv cache, warmup model) took"),
    ("listening", "Starting vLLM server on"),
)
# Phase name -> (from landmark, to landmark); a phase whose ends are missing is None.
PHASES = (
    ("imports", "start", "args"),
    ("config_and_engine_process", "args", "engine"),
    ("weights", "engine", "weights"),
    ("compile_and_profile", "weights", "kv_cache"),
    ("cuda_graphs", "kv_cache", "graphs"),
    ("warmup", "graphs", "engine_ready"),
    ("api_server", "engine_ready", "listening"),
    ("first_health", "listening", "ready"),
)
_REPORTED = (
    ("weights_load_s", re.compile(r"Loading weights took ([0-9.]+) seconds")),
    ("graphs_s", re.compile(r"Graph capturing finished in ([0-9.]+) secs")),
    ("compilation_s", re.compile(r"\(compilation: ([0-9.]+) s\)")),
    ("engine_init_s", re.compile(r"warmup model\) took ([0-9.]+) s")),
)
_SPAWN = "We must use the `spawn` multiprocessing start method"


def line_time(line, year):
    """Epoch seconds of a vLLM log line's stamp (UTC, placed in `year`), or None for a line without one."""
    found = _STAMP.search(line)
    if not found:
        return None
    month, day, hour, minute, second = (int(x) for x in found.groups())
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))


def launcher_event(line):
    """The JSON object of a `llmfleet-launch:` line, or None."""
    at = line.find(LAUNCH_PREFIX)
    if at < 0:
        return None
    try:
        event = json.loads(line[at + len(LAUNCH_PREFIX):])
    except ValueError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


def start_phases(lines, started_at, ready_at=None):
    """Phases of the start whose unit began at `started_at` (epoch s) and first answered /health at `ready_at`.

    `lines` are the server's log lines from that start on (a later start's lines are ignored once a second
    `args` landmark is met). Returns landmarks (epoch s), phases (s, None where a landmark is missing), what vLLM
    reported itself, the launcher's events and whether vLLM had to spawn its engine (CUDA initialised first).
    With the launcher, the phases after `go` are the start proper: `from_go_s` is go -> ready.
    """
    year = _year_of(started_at)
    marks = {"start": float(started_at)}
    launcher = {}
    reported = {}
    spawn_forced = False
    for line in lines:
        event = launcher_event(line)
        if event is not None:
            launcher[event["event"]] = event
            continue
        if _SPAWN in line:
            spawn_forced = True
        stamp = line_time(line, year)
        for name, text in LANDMARKS:
            if text in line and stamp is not None:
                if name == "args" and "args" in marks:
                    return _result(marks, ready_at, reported, launcher, spawn_forced)
                marks.setdefault(name, stamp)
        for name, pattern in _REPORTED:
            found = pattern.search(line)
            if found and name not in reported:
                reported[name] = float(found.group(1))
    return _result(marks, ready_at, reported, launcher, spawn_forced)


def _year_of(epoch):
    return time.gmtime(float(epoch)).tm_year


def _result(marks, ready_at, reported, launcher, spawn_forced):
    if ready_at is not None:
        marks["ready"] = float(ready_at)
    go = launcher.get("go", {}).get("t")
    if go is not None:
        # The launcher's own phases replace `imports`: imports and prefetch ran before go, while an old model served.
        marks["go"] = float(go)
    phases = {}
    for name, first, last in PHASES:
        begin = marks.get("go" if (first == "start" and go is not None) else first)
        end = marks.get(last)
        phases[name] = round(max(end - begin, 0.0), 3) if begin is not None and end is not None else None
    if go is not None:
        phases["imports"] = None
    result = {
        "landmarks": marks,
        "phases": phases,
        "reported": reported,
        "spawn_forced": spawn_forced,
        "total_s": round(marks["ready"] - marks["start"], 3) if "ready" in marks else None,
    }
    if launcher:
        imported = launcher.get("imported", {})
        prefetched = launcher.get("prefetched", {})
        result["launcher"] = {
            "import_s": imported.get("import_s"),
            "cuda_initialised": imported.get("cuda_initialised"),
            "prefetch_s": prefetched.get("prefetch_s"),
            "prefetch_bytes": prefetched.get("prefetch_bytes"),
            "go_at": go,
            "multiproc_method": launcher.get("go", {}).get("multiproc_method"),
        }
        result["from_go_s"] = round(marks["ready"] - go, 3) if go is not None and "ready" in marks else None
    return result


def split_starts(text, marker="-- start "):
    """The lines of each start in a log that marks every start with a line beginning with `marker`."""
    starts = []
    for line in text.splitlines():
        if line.startswith(marker):
            starts.append([])
        elif starts:
            starts[-1].append(line)
    return starts
