# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Time vLLM's sleep mode on a running server: POST /sleep?level=N, then /wake_up, then the first request.

    python3 tools/device/sleep_wake.py BASE_URL MODEL OUT.json [--cycles 3] [--level 1]

The server must run with --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 (the dev endpoints). Each cycle:
a completion of 16 tokens (awake), GPU memory in use (NVML, all processes), /sleep, /is_sleeping, GPU memory
asleep, /wake_up, GPU memory awake again, and the first completion after waking (its wall time and whether it
returned 16 tokens). Wall-clock times are measured around each HTTP call, on the same host.
"""
from __future__ import annotations

import argparse
import json
import time
import urllib.request


def call(method, url, body=None, timeout=600):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        text = resp.read().decode("utf-8", "replace")
        status = resp.status
    seconds = time.monotonic() - t0
    try:
        payload = json.loads(text) if text else None
    except ValueError:
        payload = text
    return status, payload, round(seconds, 4)


def gpu_memory_used_mib():
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            return sum(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).used
                       for i in range(pynvml.nvmlDeviceGetCount())) // (1 << 20)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML here: leave the memory out
        return None


def completion(base, model, tokens=16):
    body = {"model": model, "prompt": "the quick brown fox", "max_tokens": tokens, "ignore_eos": True,
            "temperature": 0}
    status, payload, seconds = call("POST", base + "/v1/completions", body)
    usage = (payload.get("usage") or {}) if isinstance(payload, dict) else {}
    return {"status": status, "seconds": seconds, "completion_tokens": usage.get("completion_tokens")}


def cycle(base, model, level):
    out = {"awake_request": completion(base, model), "memory_awake_mib": gpu_memory_used_mib()}
    status, _payload, out["sleep_s"] = call("POST", "%s/sleep?level=%d" % (base, level))
    out["sleep_status"] = status
    out["is_sleeping"] = call("GET", base + "/is_sleeping")[1]
    out["memory_asleep_mib"] = gpu_memory_used_mib()
    status, _payload, out["wake_s"] = call("POST", base + "/wake_up")
    out["wake_status"] = status
    out["is_sleeping_after_wake"] = call("GET", base + "/is_sleeping")[1]
    out["memory_woken_mib"] = gpu_memory_used_mib()
    out["first_request_after_wake"] = completion(base, model)
    out["wake_to_first_response_s"] = round(out["wake_s"] + out["first_request_after_wake"]["seconds"], 4)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base_url")
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--level", type=int, default=1, choices=[1, 2])
    args = parser.parse_args(argv)
    base = args.base_url.rstrip("/")
    cycles = [cycle(base, args.model, args.level) for _x in range(args.cycles)]
    result = {"base_url": base, "model": args.model, "level": args.level, "cycles": cycles,
              "sleep_s": [c["sleep_s"] for c in cycles], "wake_s": [c["wake_s"] for c in cycles],
              "wake_to_first_response_s": [c["wake_to_first_response_s"] for c in cycles]}
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "cycles"}, indent=1))
    print(json.dumps(cycles[0], indent=1))


if __name__ == "__main__":
    main()
