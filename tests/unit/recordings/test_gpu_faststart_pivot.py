# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 45 on the systemd GPU host (2026-12-06, docs/gpu-validation.md "Fast start: the revision pivot before and
after"), read back from its recordings: new commits of B (the Llama-3.2-1B-shaped random model) pivoted
stop-then-start behind the gateway on the device tool's H100 80 GB (vLLM 0.26.0 CUDA), once with
`-e llmfleet_fast_start=false` (the old path) and once with fast start (armed beside the old B in the model's other
unit, served through the model's serving link), an `openai` client on the alias the whole time. Recordings:
tests/fixtures/nvidia/h100-pivot-faststart-* (tools/device/gpuhost_fixtures.py RES tests/fixtures/nvidia faststart
h100); the first lease's records (before the serving link, and the bug it found) in *-run1-records.json."""
from __future__ import annotations

import json
import pathlib

FIX = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "nvidia"
RECORDS = json.loads((FIX / "h100-pivot-faststart-records.json").read_text())
RUN1 = json.loads((FIX / "h100-pivot-faststart-run1-records.json").read_text())
CLIENT = json.loads((FIX / "h100-pivot-faststart-client.json").read_text())
FAST, SLOW = RECORDS["pivot-revfast-record.json"], RECORDS["pivot-revslow-record.json"]


def test_the_fast_revision_pivot_was_armed_in_the_models_other_unit_and_the_old_path_was_not():
    assert FAST["strategy"] == SLOW["strategy"] == "stop_start" and FAST["model"] == SLOW["model"] == "gpuhost-llama1b-b"
    assert FAST["unit"] == "vllm-gpuhost-llama1b-b-alt.service" and SLOW["unit"] == "vllm-gpuhost-llama1b-b.service"
    assert FAST["fast_start"]["held"] is True and FAST["fast_start"]["armed"]["prefetch_bytes"] == 3000271139
    assert FAST["fast_start"]["armed"]["cuda_initialised"] is False  # so vLLM could fork its engine
    assert SLOW["fast_start"] == {"enabled": False, "held": None, "armed": None}


def test_the_slot_was_down_half_as_long_and_the_phases_say_where_the_rest_went():
    assert (FAST["downtime_s"], SLOW["downtime_s"]) == (33.9, 70.6)
    assert FAST["downtime_s"] / SLOW["downtime_s"] < 0.5
    fast, slow = FAST["start_phases"]["phases"], SLOW["start_phases"]["phases"]
    # Imports ran while the old model served; the engine process inherited them (fork) instead of importing again.
    assert fast["imports"] is None and slow["imports"] == 12.0
    assert fast["config_and_engine_process"] == 2.0 and slow["config_and_engine_process"] == 12.0
    # The serving link: the new revision's compile came from the cache the same model's earlier start wrote.
    assert FAST["start_phases"]["reported"]["compilation_s"] == 3.3 and SLOW["start_phases"]["reported"]["compilation_s"] > 16
    # What holds the goal (15 s): the warm-up after the CUDA graphs, the same on both paths.
    assert fast["warmup"] == slow["warmup"] == 17.0
    assert max(fast, key=lambda name: fast[name] or 0) == "warmup"
    assert not FAST["start_phases"]["spawn_forced"] and not SLOW["start_phases"]["spawn_forced"]


def test_the_client_got_only_503_with_retry_after_and_fewer_of_them_on_the_fast_path():
    columns = CLIENT["columns"]
    rows = [dict(zip(columns, row)) for row in CLIENT["rows"]]
    failed = [r for r in rows if not r["ok"]]
    assert failed and all(r["status"] == 503 and r["retry_after"] == "5" for r in failed)

    def refused(record):
        return [r for r in failed if record["gateway_closed_at"] - 1 <= r["start"] <= record["gateway_opened_at"] + 1]

    assert len(refused(FAST)) + len(refused(SLOW)) == len(failed)  # no failure outside the two closed windows
    assert len(refused(FAST)) < 0.6 * len(refused(SLOW))
    # The gateway stays closed for the drain before the stop and the smoke test and gate after the start.
    closed = {name: r["gateway_opened_at"] - r["gateway_closed_at"] for name, r in (("fast", FAST), ("slow", SLOW))}
    assert 54 < closed["fast"] < 56 and 94 < closed["slow"] < 95, closed


def test_the_first_lease_before_the_serving_link_missed_the_compile_cache_and_found_the_record_bug():
    # Each revision has a directory of its own, and vLLM keys its compile cache on the model path: a miss each time.
    assert RUN1["pivot-revslow-record.json"]["downtime_s"] == 53.6 and RUN1["pivot-revfast-record.json"]["downtime_s"] == 35.0
    # The record written after the commit dropped the unit (fixed: host_slots keeps the slot's unit), so the next fast
    # pivot planned the unit that served and stopped it before the drain: the slot down 174.7 s.
    assert RUN1["pivot-revfast-record.json"]["unit"] == RUN1["pivot-revfast2-record.json"]["unit"]
    assert RUN1["pivot-revfast2-record.json"]["downtime_s"] == 174.7
