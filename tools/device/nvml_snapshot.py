# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One NVML reading of every GPU: memory used/total and the compute processes holding memory (JSON on stdout).
Used between the stop and the start of a unit on the same GPU (tools/device/gpuhost.sh restart)."""
import json
import time

import pynvml

pynvml.nvmlInit()
gpus = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
    procs = [{"pid": p.pid, "used_mib": (p.usedGpuMemory or 0) // 1048576} for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    gpus.append({"index": i, "uuid": pynvml.nvmlDeviceGetUUID(h), "name": pynvml.nvmlDeviceGetName(h),
                 "memory_used_mib": mem.used // 1048576, "memory_total_mib": mem.total // 1048576,
                 "compute_processes": procs})
print(json.dumps({"time": time.time(), "driver": pynvml.nvmlSystemGetDriverVersion(), "gpus": gpus}, indent=1))
