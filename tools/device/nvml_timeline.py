# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU 0's memory and compute processes every 0.25 s until STOP_FILE exists, one JSON line per reading (a run cut
short keeps what it read):   python3 nvml_timeline.py OUT.jsonl STOP_FILE
Run beside the pivots on the systemd GPU host (tools/device/gpuhost.sh client-start): between a stop and a start on
the same GPU it shows whether the old engine's processes and memory were gone before the new engine allocated."""
import json
import os
import sys
import time

import pynvml

out, stop_file = sys.argv[1], sys.argv[2]
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
with open(out, "a") as log:
    while not os.path.exists(stop_file):
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        procs = [{"pid": p.pid, "used_mib": (p.usedGpuMemory or 0) // 1048576}
                 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        log.write(json.dumps({"t": round(time.time(), 3), "used_mib": memory.used // 1048576,
                              "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, "procs": procs}) + "\n")
        log.flush()
        time.sleep(0.25)
