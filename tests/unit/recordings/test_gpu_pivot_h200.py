# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pivot for real on the H200 (issue 28, 2026-12-05, docs/gpu-validation.md), read back from its recordings.

On the systemd GPU host of tools/device/gpuhost.sh, playbooks/pivot.yml ran four times behind the host's gateway
(HAProxy 2.6) with vLLM 0.26.0's CUDA engine on the one H200, while an `openai` client sent requests to the alias
`chat` through the gateway and NVML was read every 0.25 s: A first; B blue/green on the same GPU; A again with a gate
it cannot pass (rolled back); a new commit of B (stop-then-start). Run 5 (the same day, after the tooling and the pivot's
GPU-memory record changed) ran the first, blue/green and new-commit pivots again and kept each pivot's record. No GPU
is needed here: the recordings (tests/fixtures/nvidia/h200-pivot-* and h200-pivot-run5-*, made by
tools/device/gpuhost_fixtures.py) are checked for what the docs claim."""
from __future__ import annotations

import json
import pathlib
import re

import pytest

FIX = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "nvidia"
H200_MIB = 143771
SHARE_MIB = int(H200_MIB * 0.40)  # the catalog entries' gpu_memory_utilization


RUNS = ("", "run5-")


def text(name, run=""):
    return (FIX / ("h200-pivot-" + run + name)).read_text()


def load(name, run=""):
    return json.loads(text(name, run))


def client(run=""):
    data = load("client.json", run)
    return data, [dict(zip(data["columns"], row)) for row in data["rows"]]


def timeline(run=""):
    data = load("nvml-timeline.json", run)
    return [dict(zip(data["columns"], row)) for row in data["rows"]]


def spans(rows, processes):
    """(first, last) reading times of each run of consecutive readings with this many compute processes."""
    found, start, last = [], None, None
    for row in rows:
        if row["compute_processes"] == processes:
            start = row["t"] if start is None else start
            last = row["t"]
        elif start is not None:
            found.append((start, last))
            start = None
    if start is not None:
        found.append((start, last))
    return found


def slots_after():
    blocks = re.split(r"^--- (\w+)\n", text("slots-after.txt"), flags=re.M)[1:]
    return {name: json.loads(body[:body.rindex("}") + 1])["slots"]["default"] for name, body in zip(blocks[::2], blocks[1::2])}


def test_each_pivot_ended_as_expected_and_the_slot_kept_its_promises():
    results = dict(re.findall(r"^pivot-(\w+): rc (\d+) in \d+ s", text("summaries.txt"), re.M))
    assert results == {"first": "0", "bluegreen": "0", "gatefail": "2", "revision": "0"}
    slots = slots_after()
    assert [slots[n]["model"] for n in ("first", "bluegreen", "gatefail", "revision")] == [
        "gpuhost-llama1b-a", "gpuhost-llama1b-b", "gpuhost-llama1b-b", "gpuhost-llama1b-b"]
    for slot in slots.values():  # one GPU, behind the gateway, the same alias throughout
        assert (slot["gpu_ids"], slot["gateway"], slot["alias"]) == ([0], True, "chat")
    # Blue/green moved the slot to its standby port; a failed gate left it as it was; the revision kept the port.
    assert (slots["first"]["port"], slots["bluegreen"]["port"], slots["revision"]["port"]) == (8000, 8001, 8001)
    assert slots["gatefail"] == slots["bluegreen"]
    assert slots["revision"]["revision"] != slots["bluegreen"]["revision"]
    assert slots["revision"]["model_dir"] == "/srv/models/gpuhost-llama1b-b--" + slots["revision"]["revision"][:12]
    summaries = text("summaries.txt")
    assert "slot default: alias chat (given), gateway on (given)" in summaries
    assert summaries.count("slot default: alias chat (kept), gateway on (kept)") == 3
    assert 'failed at "Gate on throughput and errors"' in summaries
    assert "Rolled back: gpuhost-llama1b-b kept serving on port 8001 behind the gateway (it never stopped)" in summaries


def test_blue_green_and_the_failed_gate_shared_the_gpu_and_no_request_failed():
    data, requests = client()
    rows = timeline()
    two = spans(rows, 2)
    assert len(two) == 2  # B beside A (blue/green), then A beside B (the gate that failed)
    for start, end in two:
        assert end - start > 30
        beside = [r for r in rows if start <= r["t"] <= end]
        assert max(r["used_mib"] for r in beside) > 2 * SHARE_MIB  # two engines, each with its 0.40 share
        assert max(r["used_mib"] for r in beside) < H200_MIB
        during = [r for r in requests if r["start"] <= end + 1 and r["end"] >= start - 1]
        assert len(during) > 100 and all(r["ok"] for r in during)
    # The client ran through both pivots without one failure: every failure came later (the stop-then-start).
    first_failure = data["first_failure_at"]
    assert all(r["ok"] for r in requests if r["end"] < first_failure) and two[-1][1] < first_failure
    assert data["requests"] > 3000 and data["ok"] > 2500
    journal = text("journal-vllm.txt")
    assert re.search(r"vllm-gpuhost-llama1b-b\[\d+\]: .*Free memory on device \(82\.\d+/139\.8 GiB\) on startup\. "
                     r"Desired GPU memory utilization is \(0\.4,", journal)


@pytest.mark.parametrize("run", RUNS)
def test_stop_then_start_failed_only_as_503_with_retry_after_inside_the_closed_window(run):
    data, requests = client(run)
    record = load("records.json", run)["gpuhost-llama1b-b-latest.json"]
    assert record["strategy"] == "stop_start" and record["previous_model"] == record["model"] == "gpuhost-llama1b-b"
    failed = [r for r in requests if not r["ok"]]
    assert len(failed) == data["failed"] > 0
    assert {(r["status"], r["retry_after"]) for r in failed} == {(503, "5")}
    assert record["gateway_closed_at"] <= min(r["start"] for r in failed)
    assert max(r["end"] for r in failed) <= record["gateway_opened_at"]
    assert all(r["ok"] for r in requests if r["start"] > record["gateway_opened_at"])
    assert 0 < record["downtime_s"] < record["gateway_opened_at"] - record["gateway_closed_at"]


@pytest.mark.parametrize("run", RUNS)
def test_between_the_stop_and_the_start_the_gpu_was_free_before_the_new_engine_allocated(run):
    record = load("records.json", run)["gpuhost-llama1b-b-latest.json"]
    rows = timeline(run)
    (start, end), = spans(rows, 0)  # the only time no engine held the GPU
    idle = [r for r in rows if start <= r["t"] <= end]
    assert max(r["used_mib"] for r in idle) < 1024  # the driver's own reservation: nothing of the old engine left
    assert start - 1 <= record["old_stopped_at"] <= start
    # The pivot's own NVML check ran inside that window, with the whole share free, before vLLM allocated.
    memory = record["gpu_memory_at_start"]
    assert start <= memory["at"] <= end and memory["ok"] and memory["waited_s"] == 0
    (gpu,) = memory["checked"]
    assert gpu["index"] == 0 and gpu["needed_mib"] == SHARE_MIB and gpu["free_mib"] > H200_MIB - 1024
    after = next(r for r in rows if r["t"] > end)
    assert after["compute_processes"] == 1 and after["used_mib"] < SHARE_MIB  # the new engine starting to allocate


def test_the_records_and_journal_show_the_cuda_engine_on_the_slots_gpu():
    records = load("records.json")
    first = records["gpuhost-llama1b-a-latest.json"]
    assert (first["strategy"], first["gpu_ids"], first["previous_model"]) == ("new", [0], None)
    assert first["gpu_memory_at_start"]["checked"][0]["free_mib"] > H200_MIB - 1024
    journal = text("journal-vllm.txt")
    assert "version 0.26.0" in journal and "backend=nccl" in journal
    assert re.search(r"\[cuda\.py:\d+\] Using FLASH_ATTN attention backend", journal)
    inspect = load("inspect-b.json")
    assert inspect["security"]["exposure"] <= 4.0
    assert inspect["unit_props"]["User"] == "vllm" and inspect["unit_props"]["DevicePolicy"] == "closed"
    assert inspect["openai_requests"]["failed"] == 0 and "chat" in inspect["openai_requests"]["models"]


def test_run5_blue_green_record_shares_gpu0_after_reading_its_memory_beside_the_old_engine():
    records = load("records.json", "run5-")
    green = records["pivot-bluegreen-record.json"]
    expected = ("blue_green", "gpuhost-llama1b-a", "gpuhost-llama1b-b")
    assert (green["strategy"], green["previous_model"], green["model"]) == expected
    assert green["gpu_ids"] == [0] and green["downtime_s"] == 0.0
    memory = green["gpu_memory_at_start"]
    assert memory["ok"] and memory["shared_gpu_ids"] == [0]
    (gpu,) = memory["checked"]
    # Read with the old engine holding its 0.40: free was short of the whole GPU by about that share, and held the new one.
    assert SHARE_MIB <= gpu["free_mib"] < H200_MIB - SHARE_MIB + 2048 and gpu["needed_mib"] == SHARE_MIB
    # Two engines on GPU 0 from right after that reading until the old one stopped, and no client request failed then.
    rows = timeline("run5-")
    (start, end), = spans(rows, 2)
    assert memory["at"] <= start and end - start > 30
    data, requests = client("run5-")
    assert all(r["ok"] for r in requests if r["end"] < data["first_failure_at"]) and end < data["first_failure_at"]
    first = records["pivot-first-record.json"]
    assert (first["strategy"], first["gpu_memory_at_start"]["shared_gpu_ids"]) == ("new", [])
    revision = records["pivot-revision-record.json"]
    assert revision == records["gpuhost-llama1b-b-latest.json"] and revision["strategy"] == "stop_start"
