# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A real PyTorch process that leaves shared memory in /dev/shm, then waits to be killed.

python3 tools/device/shm_holder.py READY_FILE
 * torch.distributed.init_process_group("nccl", world_size=1) and an all_reduce on GPU 0
 * torch.multiprocessing (sharing strategy file_system, spawn): a CPU tensor handed to a child
   process through a queue -> /dev/shm/torch_* segments held by both processes
 * multiprocessing.shared_memory.SharedMemory("psm_h200_live") held open
Writes the /dev/shm listing to READY_FILE once everything is set up, then sleeps.
"""
from __future__ import annotations

import json
import os
import sys
import time
from multiprocessing import shared_memory

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp


def child(queue, done):
    t = queue.get()
    done.put(float(t.sum()))
    time.sleep(3600)


def main():
    ready = sys.argv[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    x = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    after_nccl = sorted(os.listdir("/dev/shm"))

    tmp.set_sharing_strategy("file_system")
    ctx = tmp.get_context("spawn")
    queue, done = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=child, args=(queue, done), daemon=True)
    proc.start()
    shared = torch.arange(1 << 22, dtype=torch.float32)  # 16 MiB
    queue.put(shared)
    got = done.get(timeout=120)

    shm = shared_memory.SharedMemory(name="psm_h200_live", create=True, size=1 << 20)
    shm.buf[:4] = b"live"
    info = {"pid": os.getpid(), "child_pid": proc.pid, "allreduce_first": float(x[0]),
            "child_sum": got, "dev_shm_after_nccl": after_nccl, "dev_shm": sorted(os.listdir("/dev/shm")),
            "sharing_strategy": tmp.get_sharing_strategy()}
    with open(ready + ".tmp", "w") as fh:
        json.dump(info, fh, indent=1)
    os.rename(ready + ".tmp", ready)
    time.sleep(3600)


if __name__ == "__main__":
    main()
