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


def _refused_inside(failed, record):
    """The client's failed requests that began while the pivot's gateway was closed (a second's slack each side)."""
    return [r for r in failed if record["gateway_closed_at"] - 1 <= r["start"] <= record["gateway_opened_at"] + 1]


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
        return _refused_inside(failed, record)

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


# The third lease (2026-12-06 07:50-08:18, the same H100 kind, a fresh machine): the code as landed, with item 0 (the
# unit names TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR in its cache directory), both paths in one sitting, and the
# two loaders of item 3 as serving profiles (tools/device/gpuhost-vars.yml). Recordings: h100-pivot-faststart-icache-*.
ICACHE = json.loads((FIX / "h100-pivot-faststart-icache-records.json").read_text())
ICACHE_CLIENT = json.loads((FIX / "h100-pivot-faststart-icache-client.json").read_text())


def _icache(name):
    return ICACHE["pivot-%s-record.json" % name]


def test_item_0_took_the_warm_up_from_17_s_to_1_s_on_every_start_after_the_first():
    # The first start on the machine compiled every Triton kernel (21 s); every later start found them.
    assert _icache("first")["start_phases"]["phases"]["warmup"] == 21.0
    for name in ("bluegreen", "revslow", "revfast", "revfast2", "revrunai", "revfastst", "revslow2", "revfast3"):
        assert _icache(name)["start_phases"]["phases"]["warmup"] == 1.0, name
    # Inductor writes its Triton kernels to TRITON_CACHE_DIR, else under its own /tmp directory, which the unit's
    # PrivateTmp= wiped at every start; its own (FX graph) directory stays empty because vLLM keeps its AOT artifacts.
    sizes = (FIX / "h100-pivot-faststart-icache-cache-sizes.txt").read_text()
    assert "0\t/var/cache/llmfleet-vllm/torchinductor" in sizes and "12764\t/var/cache/llmfleet-vllm/.triton" in sizes


def test_fast_start_takes_the_revision_pivot_from_65_s_to_21_to_23_s_down_and_the_record_names_what_is_left():
    slow = [_icache(n)["downtime_s"] for n in ("revslow", "revslow2")]
    fast = [_icache(n)["downtime_s"] for n in ("revfast", "revfast2", "revfast3")]
    assert slow == [65.3, 67.0] and fast == [23.3, 21.4, 23.0]
    assert max(fast) / min(slow) < 0.36
    for name in ("revfast", "revfast2", "revfast3"):
        record = _icache(name)
        assert record["fast_start"]["held"] is True and record["start_phases"]["phases"]["imports"] is None
        assert 18 < record["start_phases"]["from_go_s"] < 20
        phases = record["start_phases"]["phases"]
        # The goal (15 s) is missed by what only the GPU can do: the compile cache loaded and profiled, CUDA and the
        # weights, the graphs; no phase is above 6 s.
        assert max(phases.values(), key=lambda v: v or 0) <= 6.0 and phases["compile_and_profile"] == 6.0
    for name in ("revslow", "revslow2"):
        phases = _icache(name)["start_phases"]["phases"]
        assert phases["imports"] == 19.0 and phases["config_and_engine_process"] == 16.0
        # Without the serving link each revision's directory is a new compile key.
        assert _icache(name)["start_phases"]["reported"]["compilation_s"] > 14


def test_neither_loader_beats_the_default_one_for_a_model_in_the_page_cache():
    default = [_icache(n)["start_phases"]["reported"]["weights_load_s"] for n in ("revfast", "revfast2", "revfast3")]
    assert max(default) < 0.6
    assert _icache("revfastst")["start_phases"]["reported"]["weights_load_s"] == 2.15  # nogds: no /dev/nvidia-fs0
    assert _icache("revrunai")["downtime_s"] == 23.3 and _icache("revfastst")["downtime_s"] == 27.3
    journal = (FIX / "h100-pivot-faststart-icache-journal-vllm.txt").read_text()
    loading = [float(line.split(" and ")[1].split()[0]) for line in journal.splitlines() if "Model loading took" in line]
    assert 4.0 in [round(v, 1) for v in loading]  # the Run:ai streamer's start (4.02 s against 1.9-2.7 s by default)


def test_the_third_leases_client_failed_only_with_503_inside_the_closed_windows():
    rows = [dict(zip(ICACHE_CLIENT["columns"], row)) for row in ICACHE_CLIENT["rows"]]
    failed = [r for r in rows if not r["ok"]]
    assert all(r["status"] == 503 and r["retry_after"] == "5" for r in failed)

    def refused(name):
        return _refused_inside(failed, _icache(name))

    counts = {name: len(refused(name)) for name in ("revslow", "revfast", "revfast2", "revrunai", "revfastst")}
    assert sum(counts.values()) == len(failed) == 2222
    assert counts["revslow"] == 677 and counts["revfast"] == 372 and counts["revfast2"] == 384


# The fourth lease (2026-12-06 11:29-11:56, a fresh H100 80 GB): the code as landed; the old path once, fast start
# twice, the profile fewgraphs (9 CUDA graph sizes, item 4) three times, and item 2's premise by hand: the unit's JIT
# caches kept aside as "the fleet's", the host's emptied (revcold: a host that never compiled), then the copy laid in
# (revseed). Recordings: h100-pivot-faststart-seed-* (tools/device/gpuhost_fixtures.py RES tests/fixtures/nvidia
# faststart-seed h100).
SEED = json.loads((FIX / "h100-pivot-faststart-seed-records.json").read_text())
SEED_CLIENT = json.loads((FIX / "h100-pivot-faststart-seed-client.json").read_text())


def _seed(name):
    return SEED["pivot-%s-record.json" % name]


def test_a_host_given_the_fleets_jit_caches_starts_as_fast_as_a_warm_one_and_one_without_them_does_not():
    warm = [_seed(n)["downtime_s"] for n in ("revfast", "revfast2")]
    cold, seeded = _seed("revcold"), _seed("revseed")
    assert warm == [19.8, 16.4] and cold["downtime_s"] == 69.8 and seeded["downtime_s"] == 19.9
    # The goal: the first start given the fleet's cache within 1.2x the warm restart (here: their mean).
    assert seeded["downtime_s"] / (sum(warm) / len(warm)) < 1.11
    # What a host without the caches pays: vLLM's compile (18.6 s) and Triton's kernels (the warm-up, 20 s).
    assert cold["start_phases"]["reported"]["compilation_s"] > 18 and cold["start_phases"]["phases"]["warmup"] == 20.0
    assert seeded["start_phases"]["reported"]["compilation_s"] < 4 and seeded["start_phases"]["phases"]["warmup"] == 1.0
    for record in (cold, seeded):
        assert record["fast_start"]["held"] is True and record["strategy"] == "stop_start"
    # The copy: vLLM's compile cache and Triton's kernels, laid over an emptied cache directory.
    seed = (FIX / "h100-pivot-faststart-seed-cache-seed.txt").read_text()
    assert "56236\tvllm" in seed and "12764\t.triton" in seed


def test_fewer_cuda_graph_sizes_save_the_graphs_but_not_the_goal_and_compile_once_for_their_new_key():
    few = [_seed(n) for n in ("revfew", "revfew2", "revfew3")]
    assert [r["downtime_s"] for r in few] == [31.2, 20.4, 17.4]
    assert few[0]["start_phases"]["reported"]["compilation_s"] > 14  # the capture sizes are part of vLLM's compile key
    assert all(r["start_phases"]["reported"]["graphs_s"] == 1.0 for r in few)
    assert all(_seed(n)["start_phases"]["reported"]["graphs_s"] in (2.0, 3.0) for n in ("revfast", "revfast2"))
    # Within the spread of the default's two warm starts (16.4-19.8 s): 2 s of graphs is not what holds the 15 s.
    assert 16.4 <= few[2]["downtime_s"] <= 19.8 and few[1]["downtime_s"] > 19.8


def test_the_fourth_lease_saw_the_slot_down_16_4_s_from_53_3_s_and_503s_only_inside_the_closed_windows():
    assert _seed("revslow")["downtime_s"] == 53.3 and _seed("revfast2")["downtime_s"] == 16.4
    assert _seed("revfast2")["start_phases"]["from_go_s"] < 13.5  # go -> ready
    rows = [dict(zip(SEED_CLIENT["columns"], row)) for row in SEED_CLIENT["rows"]]
    failed = [r for r in rows if not r["ok"]]
    assert all(r["status"] == 503 and r["retry_after"] == "5" for r in failed)

    def refused(name):
        return _refused_inside(failed, _seed(name))

    names = ("revfast", "revfew", "revfew2", "revcold", "revseed", "revslow", "revfast2")
    counts = {name: len(refused(name)) for name in names}
    assert sum(counts.values()) == len(failed) == 3110
    assert (counts["revslow"], counts["revfast2"], counts["revcold"], counts["revseed"]) == (581, 304, 721, 364)


HANDOVER = json.loads((FIX / "h100-pivot-faststart-handover-records.json").read_text())
HANDOVER_CLIENT = json.loads((FIX / "h100-pivot-faststart-handover-client.json").read_text())


def _handover(name):
    return HANDOVER["pivot-%s-record.json" % name]


def _stop_to_go(record):
    """Seconds from the old unit's stop to the new start's go: the slot's downtime less the start's own."""
    return round(record["downtime_s"] - record["load_time_s"], 2)


def test_the_fifth_lease_with_the_hand_over_in_one_module_was_down_11_1_to_11_8_s_inside_the_15_s_goal():
    """Lease 5 (2026-12-06, H100 80 GB): llmfleet.vllm.hand_over stops the old unit, cleans /dev/shm, reads NVML and
    lets the held start go in one module run, where five tasks took about 3 s in lease 4."""
    fast = [_handover(n) for n in ("revfast", "revfast2", "revfast3")]
    slow = [_handover(n) for n in ("revslow", "revslow2")]
    assert [r["downtime_s"] for r in fast] == [11.8, 11.2, 11.1] and [r["downtime_s"] for r in slow] == [33.5, 34.2]
    assert all(r["downtime_s"] <= 15 and r["fast_start"]["held"] is True for r in fast)
    assert all(_stop_to_go(r) < 0.6 for r in fast) and all(_stop_to_go(r) < 1.2 for r in slow)
    assert all(r["gpu_memory_at_start"]["ok"] and r["gpu_memory_at_start"]["waited_s"] < 0.25 for r in fast + slow)
    # What is left is the GPU's part of the start, from the server's own log.
    for record in fast:
        phases = record["start_phases"]["phases"]
        assert phases["imports"] is None and phases["config_and_engine_process"] == 1.0 and phases["cuda_graphs"] <= 3.0
    # The gateway's closed window shrank with it (25 s, was 39-48 s in lease 4).
    assert all(r["gateway_opened_at"] - r["gateway_closed_at"] < 26 for r in fast)


def test_the_fifth_leases_client_failed_only_with_503_inside_the_five_closed_windows():
    rows = [dict(zip(HANDOVER_CLIENT["columns"], row)) for row in HANDOVER_CLIENT["rows"]]
    failed = [r for r in rows if not r["ok"]]
    assert all(r["status"] == 503 and r["retry_after"] == "5" for r in failed)
    counts = {n: len(_refused_inside(failed, _handover(n))) for n in ("revfast", "revfast2", "revslow", "revfast3", "revslow2")}
    assert sum(counts.values()) == len(failed) == HANDOVER_CLIENT["failed"] == 1310
    assert max(counts[n] for n in ("revfast", "revfast2", "revfast3")) < 200 < 360 < min(counts["revslow"], counts["revslow2"])


def test_a_seeded_host_starts_as_warm_from_the_go_and_a_stale_armed_file_cost_its_slot_6_s():
    """revseed (the host given the fleet's JIT caches by hand) served 11.48 s after its go, as the warm ones
    (10.74-11.29 s); revcold (caches emptied) 42.14 s. But its slot was down 17.9 s: the model's unit had last run
    without the launcher (revslow2), which keeps the launcher's directory of the start before; the arm's wait took that
    start's `armed` for its own, so the old model stopped 6.4 s before the new one had imported vLLM. wait-ready.py now
    wants the armed file's pid to be the unit's main process (tests/unit/roles/test_vllm_launch.py)."""
    seed, cold = _handover("revseed"), _handover("revcold")
    warm = [_handover(n)["load_time_s"] for n in ("revfast", "revfast2", "revfast3")]
    assert seed["load_time_s"] == 11.48 and seed["load_time_s"] / (sum(warm) / len(warm)) < 1.1
    assert cold["load_time_s"] == 42.14 and cold["start_phases"]["phases"]["warmup"] == 12.0
    assert _stop_to_go(seed) == 6.42 and seed["unit"] == "vllm-gpuhost-llama1b-b.service"
    # The record shows it: the armed file it read is revfast2's (the same unit, its pid, eight minutes before the go).
    go = seed["new_ready_at"] - seed["load_time_s"]
    assert seed["fast_start"]["armed"] == _handover("revfast2")["fast_start"]["armed"] and go - seed["fast_start"]["armed"]["armed_at"] > 60
