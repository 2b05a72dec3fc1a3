# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load on every given vLLM server at once through the openai client, with NVML power sampled the whole time:
    python3 gpuhost_load.py SECONDS CONCURRENCY OUT.json MODEL=PORT...
Counts ok/failed requests and completion tokens per model; energy from NVML's counter and the mean power;
J/token over all models. Used with two engines sharing the one H200 (tools/device/gpuhost.sh)."""
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pynvml

secs, conc, out = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
targets = dict(a.split("=") for a in sys.argv[4:])
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
samples, stop = [], threading.Event()


def sample():
    while not stop.is_set():
        samples.append((time.time(), pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0))
        time.sleep(0.2)


stats = {m: {"ok": 0, "failed": 0, "tokens": 0, "errors": []} for m in targets}
lock = threading.Lock()


def worker(model, port, deadline):
    client = openai.OpenAI(base_url="http://127.0.0.1:%s/v1" % port, api_key="none", timeout=120, max_retries=0)
    while time.time() < deadline:
        try:
            r = client.completions.create(model=model, prompt="the GPU host serves", max_tokens=128, temperature=1.0,
                                          extra_body={"ignore_eos": True})
            with lock:
                stats[model]["ok"] += 1
                stats[model]["tokens"] += r.usage.completion_tokens
        except Exception as exc:  # noqa: BLE001 - every failure is counted and kept
            with lock:
                stats[model]["failed"] += 1
                stats[model]["errors"] = (stats[model]["errors"] + [repr(exc)[:200]])[-5:]


t = threading.Thread(target=sample)
t.start()
e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
t0 = time.time()
deadline = t0 + secs
with ThreadPoolExecutor(conc * len(targets)) as pool:
    for model, port in targets.items():
        for _ in range(conc):
            pool.submit(worker, model, port, deadline)
elapsed = time.time() - t0
e1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
stop.set()
t.join()
mem = pynvml.nvmlDeviceGetMemoryInfo(h)
procs = [{"pid": p.pid, "used_mib": (p.usedGpuMemory or 0) // 1048576} for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
tokens = sum(s["tokens"] for s in stats.values())
joules = (e1 - e0) / 1000.0
result = {"seconds": round(elapsed, 2), "concurrency_per_model": conc, "models": stats, "tokens": tokens,
          "tokens_per_s": round(tokens / elapsed, 1), "energy_j_counter": round(joules, 1),
          "power_w_mean": round(sum(p for _t, p in samples) / len(samples), 1), "power_w_max": max(p for _t, p in samples),
          "samples": len(samples), "j_per_token": round(joules / tokens, 4) if tokens else None,
          "gpu_memory_used_mib": mem.used // 1048576, "gpu_memory_total_mib": mem.total // 1048576,
          "compute_processes": procs, "openai_version": openai.__version__}
json.dump(result, open(out, "w"), indent=1)
print(json.dumps(result, indent=1))
