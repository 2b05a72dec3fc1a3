# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Recordings of issue 45's start facts from the archive tools/device/vllm_h200.sh `pack` writes:

    python tools/device/faststart_fixtures.py RESULTS_DIR FIXTURES_DIR PREFIX

RESULTS_DIR: the unpacked h200-vllm.tgz. Writes PREFIX-starts.json (every start: label, profile, environment laid
over the unit's, time to ready, ready and go times, the launcher's armed record), PREFIX-server-log.txt (each
start's marker, landmark, launcher and warning lines of the server log: what vllm_start_phases reads, without the
request lines), PREFIX-qbench.json (the vllm bench serve figures) and PREFIX-jit-cache-sizes.txt.
"""

import glob
import json
import os
import sys

KEEP = ("-- start ", "llmfleet-launch: ", "non-default args", "Initializing a V1 LLM engine", "Model loading took",
        "Loading weights took", "Available KV cache memory", "Graph capturing finished", "init engine (profile",
        "Starting vLLM server on", "attention backend", "Dynamo bytecode transform", "compiled graph", "AOT compil",
        "spawn", "Error", "ERROR")


def starts(results):
    found = []
    for path in glob.glob(os.path.join(results, "ready-*.json")):
        with open(path) as handle:
            ready = json.load(handle)
        found.append({
            "label": ready["label"], "profile": ready.get("profile") or "", "extra_env": ready.get("extra_env") or {},
            "time_to_ready_s": ready["time_to_ready_s"], "ready_at": ready["ready_at"],
            "started_at": round(ready["ready_at"] - ready["time_to_ready_s"], 3),
            "go_at": ready.get("go_at"), "armed": ready.get("armed"),
        })
    return sorted(found, key=lambda s: s["ready_at"])


def qbench(results):
    figures = {}
    for path in sorted(glob.glob(os.path.join(results, "qbench-*.json"))):
        with open(path) as handle:
            raw = json.load(handle)
        name = os.path.basename(path)[len("qbench-"):-len(".json")]
        figures[name] = {k: raw.get(k) for k in ("completed", "max_concurrency", "output_throughput", "median_ttft_ms",
                                                 "median_tpot_ms", "p99_tpot_ms")}
    return figures


def main(results, fixtures, prefix):
    out = os.path.join(fixtures, prefix)
    with open(out + "-starts.json", "w") as handle:
        json.dump(starts(results), handle, indent=1, sort_keys=True)
        handle.write("\n")
    with open(out + "-qbench.json", "w") as handle:
        json.dump(qbench(results), handle, indent=1, sort_keys=True)
        handle.write("\n")
    (log,) = glob.glob(os.path.join(results, "vllm-*.service.log"))
    with open(log, errors="replace") as src, open(out + "-server-log.txt", "w") as dst:
        for line in src:
            if any(k in line for k in KEEP) and "Traceback" not in line:
                dst.write(line[:400].rstrip("\n") + "\n")
    with open(os.path.join(results, "jit-cache-sizes.txt")) as src, open(out + "-jit-cache-sizes.txt", "w") as dst:
        dst.write(src.read())


if __name__ == "__main__":
    main(*sys.argv[1:4])
