# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The hand-over of a stop-then-start switch: what happens between the old model's stop and the new one's start.

Every step here is downtime: the old units stop, the /dev/shm segments they left are removed, NVML is read until the
new model's GPUs have its share of memory free, and a held (fast) start is let go. As separate Ansible tasks these
were five module round trips, about 3 s of a 16 s revision pivot on the H100 (docs/gpu-validation.md); here they are
one. The steps stay in this order: the cleanup must not run before the old processes are gone, and the new engine must
not start before the memory is back (vLLM refuses to start below gpu_memory_utilization x total).
"""
from __future__ import annotations

import time

from ansible_collections.llmfleet.vllm.plugins.module_utils.fit_check import (
    VLLM_DEFAULT_GPU_MEMORY_UTILIZATION,
    gpu_memory_free,
)


class HandOverError(Exception):
    """A step failed; `result` holds what was done before it."""

    def __init__(self, message, result):
        super(HandOverError, self).__init__(message)
        self.result = result


def gpu_memory_wait(read_gpus, model, gpu_ids, utilization, wait_s, poll_s, clock, monotonic, sleep):
    """Read the GPUs until `gpu_ids` each have utilization x total free, or `wait_s` ran out.

    read_gpus() -> (facts, errors) as module_utils.nvidia.gather returns them. Returns gpu_memory_free's answer with
    `at` (epoch s), `waited_s` and `nvml_error` (why no GPU could be read at all, else empty)."""
    entry = {"name": model, "serving": {"gpu_memory_utilization": utilization or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION}}
    began = monotonic()
    while True:
        try:
            facts, errors = read_gpus()
        except Exception as exc:  # pylint: disable=broad-except  # NVML raising mid-reading: read again until wait_s
            facts, errors = {"source": "none", "gpus": []}, ["reading the GPUs failed: %s" % exc]
        check = gpu_memory_free(entry, facts, gpu_ids)
        waited = monotonic() - began
        if check["ok"] or waited >= wait_s:
            break
        sleep(min(poll_s, max(wait_s - waited, 0)))
    check.update(at=clock(), waited_s=round(waited, 2),
                 nvml_error="; ".join(errors) if facts.get("source") == "none" else "")
    return check


def hand_over(stop_units, stop_unit, clean_shm=None, gpu_wait=None, release=None, clock=time.time):
    """Stop `stop_units` in order, then clean /dev/shm, then wait for the GPUs' memory, then release a held start.

    stop_unit(unit) -> (was_active, error or ''); clean_shm() -> {removed: [...], bytes_freed} (OSError fails); gpu_wait() -> see
    gpu_memory_wait; release() -> whether a hold was there to remove. Each is skipped when None. A failed stop raises
    HandOverError (nothing after it runs); memory that stays short is returned with gpu_memory.ok false and the held
    start is not released: the caller decides (the pivot rolls back)."""
    result = {"began_at": clock(), "stopped": [], "shm": None, "gpu_memory": None, "released": False,
              "released_at": None}
    for unit in stop_units:
        was_active, error = stop_unit(unit)
        if error:
            raise HandOverError("stopping %s failed: %s" % (unit, error), result)
        result["stopped"].append({"unit": unit, "was_active": was_active, "stopped_at": clock()})
    if clean_shm is not None:
        try:
            result["shm"] = clean_shm()
        except OSError as exc:
            raise HandOverError("cleaning the shared memory failed: %s" % exc, result)
    if gpu_wait is not None:
        result["gpu_memory"] = gpu_wait()
        if not result["gpu_memory"]["ok"]:
            return result
    if release is not None:
        result["released"] = release()
        result["released_at"] = clock()
    return result


def changed(result):
    """Whether the hand-over changed the host: a unit that ran was stopped, a segment removed, a hold let go."""
    return (any(stop["was_active"] for stop in result["stopped"]) or bool((result["shm"] or {}).get("removed"))
            or result["released"])
