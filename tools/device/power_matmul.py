# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Sample GPU power with module_utils.gpu_power while a bf16 matmul loop runs on GPU 0.

python3 tools/device/power_matmul.py OUT.json [load_seconds]
Phases: 3 s idle, load_seconds of 8192^3 bf16 matmuls, 3 s idle. Two samplers run at once:
NVML every 50 ms and the nvidia-smi fallback every 250 ms; NVML's energy counter is read too.
"""
from __future__ import annotations

import json
import sys
import time

import torch

from ansible_collections.llmfleet.vllm.plugins.module_utils.gpu_power import (
    NvidiaSmiPowerReader, NvmlPowerReader, PowerSampler, energy_per_token, trapezoid_joules)


def phase_stats(samples, t0, t1):
    sel = [(t, sum(w)) for t, w in samples if t0 <= t <= t1]
    if len(sel) < 2:
        return None
    j = trapezoid_joules(sel)
    return {"samples": len(sel), "duration_s": round(sel[-1][0] - sel[0][0], 3), "joules": round(j, 2),
            "watts_mean": round(j / (sel[-1][0] - sel[0][0]), 2), "watts_max": round(max(w for _x, w in sel), 2)}


def main():
    out = sys.argv[1]
    load_s = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _x in range(3):
        a @ b
    torch.cuda.synchronize()
    nvml_reader = NvmlPowerReader([0])
    smi_reader = NvidiaSmiPowerReader([0])
    s_nvml = PowerSampler(interval_s=0.05, reader=nvml_reader)
    s_smi = PowerSampler(interval_s=0.25, reader=smi_reader)
    s_nvml.start()
    s_smi.start()
    time.sleep(3.0)
    t_load0 = time.monotonic()
    iters = 0
    while time.monotonic() - t_load0 < load_s:
        for _x in range(20):
            a @ b
        torch.cuda.synchronize()
        iters += 20
    t_load1 = time.monotonic()
    time.sleep(3.0)
    sum_nvml = s_nvml.stop()
    sum_smi = s_smi.stop()
    nvml_reader.close()
    flops = 2.0 * n ** 3 * iters
    load = phase_stats(s_nvml.samples, t_load0, t_load1)
    idle = phase_stats(s_nvml.samples, 0, t_load0)
    result = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "matmul": {"n": n, "dtype": "bfloat16", "iterations": iters, "seconds": round(t_load1 - t_load0, 3),
                   "tflops": round(flops / (t_load1 - t_load0) / 1e12, 1)},
        "nvml_sampler": sum_nvml,
        "nvidia_smi_sampler": sum_smi,
        "phase_idle_before_load": idle,
        "phase_load": load,
        "joules_per_tflop_load": round(load["joules"] / (flops / 1e12), 4) if load else None,
        "energy_per_token_example": {
            "note": "no LLM ran: tokens = matmul iterations, only to exercise energy_per_token()",
            "joules_per_iteration": round(energy_per_token(load["joules"], iters), 3) if load else None},
        "load_window_s": [round(t_load0 - s_nvml.started_at, 3), round(t_load1 - s_nvml.started_at, 3)],
        "nvml_samples": [[round(t - s_nvml.started_at, 4), w] for t, w in s_nvml.samples],
        "nvidia_smi_samples": [[round(t - s_nvml.started_at, 4), w] for t, w in s_smi.samples],
    }
    with open(out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps({k: result[k] for k in ("matmul", "phase_idle_before_load", "phase_load",
                                             "joules_per_tflop_load")}, indent=1))
    print("nvml:", json.dumps(sum_nvml))
    print("smi:", json.dumps(sum_smi))


if __name__ == "__main__":
    main()
