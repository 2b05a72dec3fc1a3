# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Requests held through stop-then-start pivots on the H100 (issue 44, 2026-12-07, docs/gpu-validation.md run 6), read
back from its recordings.

On the systemd GPU host of tools/device/gpuhost.sh, behind the host's gateway (HAProxy 2.6, the hold's Lua), with
vLLM 0.26.0's CUDA engine on one H100 and an `openai` client (4 workers, no retries, a 400 s timeout) on the alias
`chat` the whole time: A first; then three pivots that stop the old model before the new one starts - B
(`pivot_blue_green=false`), a new commit of B, and A again with a gate it cannot pass (rolled back to B). Runs 4 and 5
on the H200 refused 653 and 878 requests in the new commit's window alone. No GPU is needed here: the recordings
(tests/fixtures/nvidia/h100-pivot-hold-*, made by tools/device/gpuhost_fixtures.py) are checked for what the docs claim."""
from __future__ import annotations

import json
import pathlib
import re

FIX = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "nvidia"


def text(name):
    return (FIX / ("h100-pivot-hold-" + name)).read_text()


def requests():
    data = json.loads(text("client.json"))
    return data, [dict(zip(data["columns"], row)) for row in data["rows"]]


def records():
    return json.loads(text("records.json"))


def test_no_request_failed_through_three_stop_then_start_windows():
    data, rows = requests()
    assert data["requests"] == len(rows) == 2100 and data["failed"] == 0, data["runs"]
    assert all(row["ok"] and row["status"] == 200 for row in rows)
    journal = text("journal-gateway.txt")
    assert journal.startswith("# 2100 request lines in all\n")
    assert not re.search(r'" 503 | 503 [0-9]+ - ', journal) and 'hold:"refused' not in journal


def test_each_window_held_the_clients_requests_until_the_next_model_answered():
    """The four workers each wait once per window (their request held), for about the window less its start."""
    _data, rows = requests()
    held = sorted(round(float(s), 1) for s in re.findall(r'hold:"held ([0-9.]+) s"', text("journal-gateway.txt")))
    assert held == [32.1] * 4 + [47.8] * 4 + [56.2] * 4, held
    waited = sorted(round(row["end"] - row["start"], 1) for row in rows if row["end"] - row["start"] > 1)
    assert len(waited) == 12 and all(abs(w - h) < 0.3 for w, h in zip(waited, held)), (waited, held)
    # Two of the windows are committed pivots, each record with its closed window and its downtime: every held request
    # lies in its window, and the window is longer than the downtime (what fills it is issue 44 item 3).
    windows = []
    for name in ("pivot-reloadback-record.json", "pivot-revision-record.json"):
        record = records()[name]
        assert record["strategy"] == "stop_start", record
        closed, opened = record["gateway_closed_at"], record["gateway_opened_at"]
        assert 0 < record["downtime_s"] < opened - closed, record
        windows.append((closed, opened))
    assert [round(o - c, 1) for c, o in windows] == [59.4, 42.5]
    in_windows = [row for row in rows if row["end"] - row["start"] > 1 and any(c <= row["start"] <= o for c, o in windows)]
    assert len(in_windows) == 8 and all(row["end"] <= o + 1 for row in in_windows for c, o in windows if c <= row["start"] <= o)


def test_the_rolled_back_pivot_restarted_the_old_model_and_its_window_failed_none():
    rolled_back = [record for name, record in records().items() if name.endswith("-rolled-back.json")]
    assert len(rolled_back) == 1 and rolled_back[0]["strategy"] == "stop_start", rolled_back
    assert rolled_back[0]["rollback"]["method"] == "restart" and rolled_back[0]["rollback"]["seconds"] > 0
    assert "pivot-gatefail: rc 2 in" in text("summaries.txt") and "Rolled back: gpuhost-llama1b-b@" in text("summaries.txt")
