# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Rollback by wake for real (issue 33, 2026-12-05, docs/gpu-validation.md "Rollback by wake"), read back from its recordings.

On the systemd GPU host of tools/device/gpuhost.sh (the device tool lent an H100 80 GB that day), vLLM 0.26.0's CUDA
engine, HAProxy in front and an `openai` client on the alias `chat` the whole time, playbooks/pivot.yml ran six times
(phases pivot-sfirst ... pivot-reloadback): A with sleep mode; B with an impossible gate, rolled back by waking A; B
again without sleep, rolled back by restarting A; B passing, A asleep; A again, a wake (B asleep, a 60 s timer); B once
that timer had stopped it, a reload. No GPU is needed here: the recordings (tests/fixtures/nvidia/h100-pivot-wake-*,
made by tools/device/gpuhost_fixtures.py) are checked for what the docs claim."""
from __future__ import annotations

import datetime
import json
import pathlib
import re

FIX = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "nvidia"


def text(name):
    return (FIX / ("h100-pivot-wake-" + name)).read_text()


RECORDS = json.loads(text("records.json"))
ROLLED_BACK = sorted(name for name in RECORDS if name.endswith("-rolled-back.json"))


def requests():
    data = json.loads(text("client.json"))
    return sorted((dict(zip(data["columns"], row)) for row in data["rows"]), key=lambda r: r["start"])


def first_ok_after(rows, t):
    return min(r["end"] for r in rows if r["ok"] and r["start"] >= t) - t


def test_rollback_by_wake_answers_through_the_gateway_in_seconds_where_a_restart_takes_a_minute():
    by_wake, by_restart = (RECORDS[name] for name in ROLLED_BACK)
    assert (by_wake["strategy"], by_wake["rollback"]["method"]) == ("sleep", "wake")
    assert (by_restart["strategy"], by_restart["rollback"]["method"]) == ("stop_start", "restart")
    assert "throughput check failed" in by_wake["error"] and "throughput check failed" in by_restart["error"]
    # The woken model answered the parity probes as it did before it slept, on a GPU whose memory NVML showed free.
    assert by_wake["rollback"]["answers_after_wake"] == "matched"
    reading = by_wake["rollback"]["gpu_memory_before_wake"]
    assert reading["ok"] and all(g["free_mib"] >= g["needed_mib"] for g in reading["checked"])
    # From the failed gate to the first good answer an independent client got through the gateway.
    rows = requests()
    wake_s = first_ok_after(rows, by_wake["rollback"]["started_at"])
    restart_s = first_ok_after(rows, by_restart["rollback"]["started_at"])
    assert wake_s < 10 and restart_s > 60 and restart_s / wake_s > 8, (wake_s, restart_s)
    assert by_wake["rollback"]["seconds"] < 10 < 60 < by_restart["rollback"]["seconds"]


def recorded_windows():
    """(name, closed, opened) of every pivot after the client started, in order, from the pivot records: the gateway's
    closed and reopened times where the record has them; a rolled-back record has only the rollback's serving_at, so
    its window opens after the window before it (or the first pivot's reopening) and closes no later than that."""
    phases = ("sgatefail", "rgatefail", "sleep", "wakeback", "reloadback")
    rolled_back = dict(zip(("sgatefail", "rgatefail"), (RECORDS[name] for name in ROLLED_BACK)))
    windows, after = [], RECORDS["pivot-sfirst-record.json"]["gateway_opened_at"]
    for phase in phases:
        if phase in rolled_back:
            windows.append((phase, after, rolled_back[phase]["rollback"]["serving_at"]))
        else:
            record = RECORDS["pivot-%s-record.json" % phase]
            windows.append((phase, record["gateway_closed_at"], record["gateway_opened_at"]))
        after = windows[-1][2]
    return windows


def test_the_client_failed_only_with_503_and_retry_after_inside_the_closed_windows():
    rows = requests()
    failed_rows = [r for r in rows if not r["ok"]]
    assert len(failed_rows) == json.loads(text("client.json"))["failed"] == 3307
    # Each failure is the gateway's 503 with Retry-After (gateway_retry_after_s 5), inside a window the records give.
    assert all(r["status"] == 503 and r["retry_after"] == "5" for r in failed_rows), \
        [r for r in failed_rows if r["status"] != 503 or r["retry_after"] != "5"][:3]
    windows = recorded_windows()
    inside, outside = {name: [] for name, _c, _o in windows}, []
    for row in failed_rows:
        name = next((name for name, closed, opened in windows if closed - 0.5 <= row["start"] and row["end"] <= opened + 1.0),
                    None)
        (inside[name] if name else outside).append(row)
    assert outside == [] and all(inside.values()), (outside[:3], {name: len(rs) for name, rs in inside.items()})
    # The client saw as closed what the records say was closed: its failures span all but a second or two at each end
    # of each recorded window (the first 503 after the close, the last before the reload that reopens the slot).
    for name, closed, opened in windows[2:]:
        span = max(r["end"] for r in inside[name]) - min(r["start"] for r in inside[name])
        assert opened - closed - 4 <= span <= opened - closed + 1, (name, span, opened - closed)
    failed = [len(inside[name]) for name, _c, _o in windows]
    seconds = [opened - closed for _name, closed, opened in windows]
    # Pivot back by wake closes the slot for less than half as long as the reload, and fails fewer than half the requests.
    assert seconds[3] * 2 < seconds[4] and failed[3] * 2 < failed[4], (seconds, failed)
    # Rolling back by wake fails fewer requests than rolling back by restart, the new model's load included.
    assert failed[0] < failed[1], failed


def test_pivot_back_by_wake_against_by_reload():
    sleep, wake, reload = (RECORDS["pivot-%s-record.json" % n] for n in ("sleep", "wakeback", "reloadback"))
    assert (sleep["strategy"], wake["strategy"], reload["strategy"]) == ("sleep", "wake", "stop_start")
    assert sleep["sleep"]["previous_asleep"] and wake["sleep"]["previous_asleep"] and reload["sleep"] is None
    assert wake["downtime_s"] * 3 < reload["downtime_s"], (wake["downtime_s"], reload["downtime_s"])
    assert (wake["downtime_source"], reload["downtime_source"]) == ("controller", "journal")


def test_the_slot_record_keeps_the_sleeping_model_and_the_timer_on_the_host_stops_it():
    blocks = dict(re.findall(r"^--- (\w+)\n(.*?)(?=^--- |\Z)", text("slots-after.txt"), re.S | re.M))
    after_sleep = json.loads(blocks["sleep"][:blocks["sleep"].rindex("}") + 1])["slots"]["default"]
    assert (after_sleep["model"], after_sleep["port"], after_sleep["standby_port"]) == ("gpuhost-llama1b-b", 8001, 8000)
    asleep = after_sleep["asleep"]
    assert (asleep["model"], asleep["port"], asleep["unit"]) == ("gpuhost-llama1b-a", 8000, "vllm-gpuhost-llama1b-a.service")
    assert round(asleep["until"] - asleep["since"]) == 900 and after_sleep["sleep_mode"] is True
    assert "llmfleet-asleep-vllm-gpuhost-llama1b-a.timer loaded active waiting" in blocks["sleep"]
    after_wake = json.loads(blocks["wakeback"][:blocks["wakeback"].rindex("}") + 1])["slots"]["default"]
    assert (after_wake["model"], after_wake["port"], after_wake["asleep"]["model"]) == ("gpuhost-llama1b-a", 8000, "gpuhost-llama1b-b")
    after_reload = json.loads(blocks["reloadback"][:blocks["reloadback"].rindex("}") + 1])["slots"]["default"]
    assert after_reload["model"] == "gpuhost-llama1b-b" and "asleep" not in after_reload
    # The 60 s timer of the wake-back pivot stopped B by itself.
    expiry = text("expiry.txt")
    started = re.search(r"^(\S+) .*Started llmfleet-asleep-vllm-gpuhost-llama1b-b\.timer", expiry, re.M).group(1)
    stopping = re.search(r"^(\S+) .*Stopping vllm-gpuhost-llama1b-b\.service", expiry, re.M).group(1)
    waited = (datetime.datetime.fromisoformat(stopping) - datetime.datetime.fromisoformat(started)).total_seconds()
    assert 59 <= waited <= 62 and expiry.startswith("vllm-gpuhost-llama1b-b.service: inactive")


def test_vllm_slept_and_woke_as_the_docs_say():
    journal = text("journal-vllm.txt")
    asleep = [float(s) for s in re.findall(r"It took ([0-9.]+) seconds to fall asleep", journal)]
    woke = [float(s) for s in re.findall(r"It took ([0-9.]+) seconds to wake up", journal)]
    freed = [float(s) for s in re.findall(r"sleep freed ([0-9.]+) GiB memory in total", journal)]
    backed = [float(s) for s in re.findall(r"of which ([0-9.]+) GiB is backed up in CPU", journal)]
    assert len(asleep) == 3 and max(asleep) < 3 and len(woke) == 2 and max(woke) < 0.5
    assert freed and min(freed) > 30 and all(2.5 < b < 3.5 for b in backed)  # 3.0 GB of bf16 weights to host RAM
