"""plugins/module_utils/hand_over.py (issue 45): the stop-then-start switch's downtime in one step, in its order: the
old units stop, then /dev/shm is cleaned, then the GPUs' memory is waited for, then a held start goes; a failed stop
or memory that stays short never lets the new start go."""
from __future__ import annotations

import os
import subprocess

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import hand_over as ho
from ansible_collections.llmfleet.vllm.plugins.module_utils.shm_segments import DEFAULT_PATTERNS, clean

TOTAL = 81559


class Clock(object):
    """Time that moves only when the code sleeps."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps = []

    def time(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def _facts(used_mib):
    return {"source": "nvml", "gpus": [{"index": 0, "memory_total_mib": TOTAL, "memory_used_mib": used}
                                       for used in used_mib]}


def _reader(readings):
    """read_gpus() giving each reading in turn, then the last one again."""
    readings = list(readings)

    def read_gpus():
        return (readings.pop(0) if len(readings) > 1 else readings[0]), []
    return read_gpus


def _wait(clock, readings, wait_s=10, util=0.4):
    return lambda: ho.gpu_memory_wait(_reader(readings), "llama-b", [0], util, wait_s, 0.25, clock.time, clock.time,
                                      clock.sleep)


def test_the_steps_run_in_order_and_the_hold_goes_last():
    calls = []
    clock = Clock()
    result = ho.hand_over(
        ["vllm-a.service", "vllm-b.service"],
        lambda unit: (calls.append("stop " + unit), (True, ""))[1],
        clean_shm=lambda: (calls.append("shm"), {"removed": [{"name": "nccl-1", "size": 4}], "bytes_freed": 4})[1],
        gpu_wait=lambda: (calls.append("gpu"), {"ok": True, "errors": [], "checked": []})[1],
        release=lambda: (calls.append("release"), True)[1],
        clock=clock.time)
    assert calls == ["stop vllm-a.service", "stop vllm-b.service", "shm", "gpu", "release"]
    assert [s["unit"] for s in result["stopped"]] == ["vllm-a.service", "vllm-b.service"]
    assert result["released"] is True and result["released_at"] == clock.now
    assert ho.changed(result)


def test_a_failed_stop_lets_nothing_after_it_run():
    calls = []

    def stop_unit(unit):
        calls.append(unit)
        return True, ("Job for %s canceled." % unit if unit == "vllm-b.service" else "")
    with pytest.raises(ho.HandOverError) as failed:
        ho.hand_over(["vllm-a.service", "vllm-b.service", "vllm-c.service"], stop_unit,
                     clean_shm=lambda: pytest.fail("cleaned after a failed stop"),
                     gpu_wait=lambda: pytest.fail("waited after a failed stop"),
                     release=lambda: pytest.fail("released after a failed stop"))
    assert calls == ["vllm-a.service", "vllm-b.service"]
    assert "stopping vllm-b.service failed: Job for vllm-b.service canceled." == str(failed.value)
    assert [s["unit"] for s in failed.value.result["stopped"]] == ["vllm-a.service"]


def test_the_memory_is_read_until_it_is_back_then_the_start_goes():
    clock = Clock()
    # The old engine's memory (65 GiB) takes three readings to come back; the new one needs 0.4 x 81559 MiB.
    result = ho.hand_over([], lambda unit: (True, ""), gpu_wait=_wait(clock, [_facts([66000])] * 3 + [_facts([600])]),
                          release=lambda: True, clock=clock.time)
    memory = result["gpu_memory"]
    assert memory["ok"] and memory["checked"] == [{"index": 0, "free_mib": TOTAL - 600, "needed_mib": int(TOTAL * 0.4)}]
    assert clock.sleeps == [0.25, 0.25, 0.25] and memory["waited_s"] == 0.75
    assert result["released"] and result["released_at"] == clock.now


def test_memory_that_stays_short_keeps_the_start_held_and_says_why():
    clock = Clock()
    released = []
    result = ho.hand_over([], lambda unit: (True, ""), gpu_wait=_wait(clock, [_facts([66000])], wait_s=2),
                          release=lambda: released.append(1) or True, clock=clock.time)
    memory = result["gpu_memory"]
    assert not memory["ok"] and memory["waited_s"] == 2.0 and sum(clock.sleeps) == 2.0
    assert "GPU 0 has 15559 MiB free, llama-b needs 32623 MiB (gpu_memory_utilization 0.4" in memory["errors"][0]
    assert released == [] and result["released"] is False and result["released_at"] is None


def test_no_gpu_to_read_is_said_as_such():
    clock = Clock()
    memory = ho.gpu_memory_wait(lambda: ({"source": "none", "gpus": []}, ["nvml: libnvidia-ml.so.1 not found"]),
                                "llama-b", [0], None, 0, 0.25, clock.time, clock.time, clock.sleep)
    assert not memory["ok"] and memory["nvml_error"] == "nvml: libnvidia-ml.so.1 not found"
    assert memory["errors"] == ["GPU 0 is not on this host"] and clock.sleeps == []


def test_a_hand_over_that_found_nothing_to_do_changed_nothing():
    result = ho.hand_over(["vllm-gone.service"], lambda unit: (False, ""),
                          clean_shm=lambda: {"removed": [], "bytes_freed": 0}, release=lambda: False)
    assert not ho.changed(result)
    assert result["stopped"][0]["was_active"] is False


def test_an_unreadable_shm_directory_fails_after_the_stops(tmp_path):
    def clean_shm():
        raise PermissionError(13, "Permission denied", str(tmp_path))
    with pytest.raises(ho.HandOverError) as failed:
        ho.hand_over(["vllm-a.service"], lambda unit: (True, ""), clean_shm=clean_shm,
                     release=lambda: pytest.fail("released after a failed cleanup"))
    assert "cleaning the shared memory failed" in str(failed.value)
    assert failed.value.result["stopped"][0]["unit"] == "vllm-a.service"


def test_the_cleanup_removes_what_no_process_holds_and_keeps_what_one_does(tmp_path):
    (tmp_path / "nccl-left-by-a-killed-run").write_bytes(b"x" * 64)
    (tmp_path / "not-ours").write_bytes(b"y")
    held = tmp_path / "psm_held"
    held.write_bytes(b"z")
    with open(held, "rb") as segment:
        holder = subprocess.Popen(["sleep", "30"], stdin=segment)
    try:
        removed, keep, listing, scan = clean(str(tmp_path), list(DEFAULT_PATTERNS))
    finally:
        holder.kill()
        holder.wait()
    assert [e["name"] for e in removed] == ["nccl-left-by-a-killed-run"]
    assert {e["name"]: e["reason"] for e in keep} == {"not-ours": "not_matching", "psm_held": "in_use"}
    assert sorted(os.listdir(tmp_path)) == ["not-ours", "psm_held"]


def test_nvml_raising_mid_reading_is_read_again_until_the_memory_is_back():
    clock = Clock()
    readings = [RuntimeError("NVML_ERROR_GPU_IS_LOST"), _facts([600])]

    def read_gpus():
        reading = readings.pop(0)
        if isinstance(reading, Exception):
            raise reading
        return reading, []
    memory = ho.gpu_memory_wait(read_gpus, "llama-b", [0], 0.4, 10, 0.25, clock.time, clock.time, clock.sleep)
    assert memory["ok"] and memory["waited_s"] == 0.25 and memory["nvml_error"] == ""
