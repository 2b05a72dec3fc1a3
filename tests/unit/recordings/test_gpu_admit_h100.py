# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The window as short as the switch, on the H100 (issue 44 item 3, 2026-12-08, docs/gpu-validation.md run 7), read back
from its recordings.

The systemd GPU host of tools/device/gpuhost.sh, behind the host's gateway (HAProxy 2.6, the hold's Lua), vLLM 0.26.0's
CUDA engine on one H100, an `openai` client (4 workers, no retries, a 400 s timeout) on the alias `chat` from after the
first pivot to the end. Three stop-then-start pivots: A -> B admitted before the gate (the default), a new commit of B
with `-e pivot_admit_before_gate=false` (run 4's pivot, 653 refused on the H200), and A with a gate it cannot pass
(rolled back to B). Recordings tests/fixtures/nvidia/h100-pivot-admit-* (tools/device/gpuhost_fixtures.py)."""
from __future__ import annotations

import json
import pathlib
import re

FIX = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "nvidia"


def text(name):
    return (FIX / ("h100-pivot-admit-" + name)).read_text()


def records():
    return json.loads(text("records.json"))


def held_waits():
    return sorted(round(float(s), 1) for s in re.findall(r'hold:"held ([0-9.]+) s"', text("journal-gateway.txt")))


def test_no_request_failed_or_was_refused_through_the_three_windows():
    data = json.loads(text("client.json"))
    rows = [dict(zip(data["columns"], row)) for row in data["rows"]]
    assert data["requests"] == len(rows) == 2432 and data["failed"] == 0, data["errors"]
    assert all(row["ok"] and row["status"] == 200 for row in rows)
    journal = text("journal-gateway.txt")
    assert journal.startswith("# 2432 request lines in all\n")
    assert not re.search(r'" 503 | 503 [0-9]+ - ', journal) and 'hold:"refused' not in journal
    # The client's long requests are the held ones: each worker once per closing (the rollback closes twice).
    waited = sorted(round(row["end"] - row["start"], 1) for row in rows if row["end"] - row["start"] > 1)
    assert len(waited) == len(held_waits()) == 16 and all(abs(w - h) < 0.3 for w, h in zip(waited, held_waits()))


def test_the_gateway_counted_what_each_pivot_record_says():
    reload_back, revision = records()["pivot-reloadback-record.json"], records()["pivot-revision-record.json"]
    (rolled_back,) = [record for name, record in records().items() if name.endswith("-rolled-back.json")]
    for record in (reload_back, revision, rolled_back):
        assert record["strategy"] == "stop_start" and record["gateway_window"]["refused_requests"] == 0, record
    assert [r["gateway_window"]["held_requests"] for r in (reload_back, revision, rolled_back)] == [4, 4, 8]
    assert [r["gateway_window"]["held_wait_max_s"] for r in (reload_back, revision, rolled_back)] == [32.8, 40.2, 33.7]
    assert held_waits() == [25.9] * 4 + [32.8] * 4 + [33.7] * 4 + [40.2] * 4
    assert rolled_back["rollback"]["method"] == "restart" and rolled_back["closed_s"] == 70.6
    assert "pivot-gatefail: rc 2 in" in text("summaries.txt") and "Rolled back: gpuhost-llama1b-b@" in text("summaries.txt")


def test_admitting_before_the_gate_leaves_less_of_the_window_beyond_the_downtime():
    """Run 6 (gate first, before item 3): 28.7 and 26.5 s of the window beyond the downtime. Here the default order
    leaves 8.1 s, the gate-first order 22.1 s (its gate ran with no client, while the held requests waited)."""
    reload_back, revision = records()["pivot-reloadback-record.json"], records()["pivot-revision-record.json"]
    assert reload_back["gate_with_clients"] is True and revision["gate_with_clients"] is False
    assert [(r["closed_s"], r["downtime_s"]) for r in (reload_back, revision)] == [(34.7, 26.6), (41.7, 19.6)]
    for record in (reload_back, revision):
        assert record["closed_s"] == round(record["gateway_opened_at"] - record["gateway_closed_at"], 1), record
    assert round(reload_back["closed_s"] - reload_back["downtime_s"], 1) == 8.1
    assert round(revision["closed_s"] - revision["downtime_s"], 1) == 22.1
