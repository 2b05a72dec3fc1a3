# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 45's start facts (2026-12-06, docs/gpu-validation.md "Fast start: where a warm restart's minute goes"), read
back from their recordings and cut into phases by plugins/module_utils/vllm_start_phases.py.

On the device tool's H100 80 GB (vLLM 0.26.0 CUDA, torch 2.11.0+cu130, no systemd: tools/device/unit_runner.py runs the
unit service_deploy rendered) the Llama-3-8B-shaped random model of issue 17 was started 19 times: the unit as it is
(warm), with the JIT caches in the cache directory (icache), with vLLM's engine forked instead of spawned (fork), and
behind roles/service_deploy/files/vllm-launch.py (imports and prefetch first, then a go file). Recordings:
tests/fixtures/nvidia/h100-faststart-*, made by tools/device/faststart_fixtures.py. No GPU is needed here."""
from __future__ import annotations

import calendar
import json
import pathlib
import re
import statistics
import time

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import vllm_start_phases

FIX = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "nvidia"
STARTS = json.loads((FIX / "h100-faststart-starts.json").read_text())
QBENCH = json.loads((FIX / "h100-faststart-qbench.json").read_text())
LOG = (FIX / "h100-faststart-server-log.txt").read_text()


def marker_time(line):
    iso = re.search(r"\((\S+)Z\)", line).group(1)
    return calendar.timegm(time.strptime(iso, "%Y-%m-%dT%H:%M:%S"))


def phases_by_label():
    """Each recorded start's phases, its log lines found by the unit runner's start marker nearest its start."""
    markers = [line for line in LOG.splitlines() if line.startswith("-- start ")]
    chunks = vllm_start_phases.split_starts(LOG)
    assert len(markers) == len(chunks) == len(STARTS) + 1  # the one failed start wrote no ready record
    found = {}
    for start in STARTS:
        i = min(range(len(markers)), key=lambda k: abs(marker_time(markers[k]) - start["started_at"]))
        assert abs(marker_time(markers[i]) - start["started_at"]) < 2
        found[start["label"]] = vllm_start_phases.start_phases(chunks[i], start["started_at"], start["ready_at"])
    return found


PHASES = phases_by_label()
BEFORE = ("warm", "warm2", "warm3")
LAUNCHED = ("launchfork2", "launchfork3", "launchfork4")


def test_the_old_path_takes_about_a_minute_and_a_third_of_it_is_a_spawned_engine_importing_again():
    for label in BEFORE:
        start = PHASES[label]
        assert 45 < start["total_s"] < 60
        assert 13 <= start["phases"]["imports"] <= 17
        # vLLM's CLI sets VLLM_WORKER_MULTIPROC_METHOD=spawn when it is unset: no "must use spawn" warning, the engine
        # process simply imports everything again.
        assert start["phases"]["config_and_engine_process"] >= 13
        assert not start["spawn_forced"]


def test_forking_the_engine_removes_that_second_import():
    for label in ("fork1", "fork2", "plainfork1"):
        assert PHASES[label]["phases"]["config_and_engine_process"] <= 2
        assert 30 < PHASES[label]["total_s"] < 33
    assert statistics.median(PHASES[x]["total_s"] for x in ("fork1", "fork2", "plainfork1")) < 0.7 * min(
        PHASES[x]["total_s"] for x in BEFORE)


def test_behind_the_launcher_the_8b_serves_within_20_s_of_go():
    for label in LAUNCHED + ("launchfork1",):
        start = PHASES[label]
        assert start["launcher"]["cuda_initialised"] is False
        assert start["launcher"]["multiproc_method"] == "fork"
        assert start["from_go_s"] < 20, label
        assert start["phases"]["imports"] is None  # done before go
        assert 14 < start["launcher"]["import_s"] < 18
    # launchfork1 followed a dropped page cache: the launcher read 16 GB from disk before go, so the start after go
    # was as fast as with the weights cached.
    first = PHASES["launchfork1"]["launcher"]
    assert first["prefetch_bytes"] == 16063857103 and first["prefetch_s"] > 3 * PHASES["launchfork2"]["launcher"]["prefetch_s"]
    assert max(PHASES[x]["from_go_s"] for x in LAUNCHED) / min(PHASES[x]["total_s"] for x in BEFORE) < 0.4


def test_the_engine_in_the_server_process_is_slower_than_a_forked_one():
    # VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine's own imports (model, worker) come after go.
    inproc = PHASES["launchinproc1"]
    assert inproc["phases"]["config_and_engine_process"] >= 13
    assert inproc["from_go_s"] > 1.5 * statistics.median(PHASES[x]["from_go_s"] for x in LAUNCHED)


def test_preloading_the_gpu_worker_before_a_fork_broke_the_engine():
    # The first launcher (it also imported vllm.v1.worker.*) crashed its forked engine in a Triton launch.
    failed = vllm_start_phases.split_starts(LOG)[6]
    assert any("cannot be accessed from Triton" in line for line in failed)
    result = vllm_start_phases.start_phases(failed, marker_time(LOG.splitlines()[0]))
    assert "engine_ready" not in result["landmarks"]


def test_the_twelve_second_warmup_is_triton_compiling_once_per_cache_directory():
    warmup = {label: PHASES[label]["phases"]["warmup"] for label in PHASES}
    # Paid by the first start of each Triton cache directory that loads compiled graphs ...
    for label in ("warm", "icache1", "warm2"):
        assert warmup[label] >= 10, label
    # ... and not again by later starts that keep it (TRITON_CACHE_DIR, or HOME's .triton for warm3/plainfork1),
    # nor by a host given another host's cache directories (launchforkseed1).
    for label in ("icache2", "fork1", "plainfork1", "warm3", "launchforkseed1") + LAUNCHED:
        assert warmup[label] <= 1.5, label


def test_a_host_given_the_fleets_cache_starts_within_1_2_times_the_warm_restart():
    seeded = PHASES["launchforkseed1"]["from_go_s"]
    assert seeded <= 1.2 * statistics.median(PHASES[x]["from_go_s"] for x in LAUNCHED)
    assert PHASES["launchforkseed1"]["reported"]["compilation_s"] < 5  # loaded, not compiled again
    sizes = dict(line.split("\t")[::-1] for line in (FIX / "h100-faststart-jit-cache-sizes.txt").read_text().split("\n") if line)
    assert int(sizes["vllm"]) > 0 and int(sizes["triton"]) > 0
    assert sizes["torchinductor"] == "0"  # vLLM 0.26 keeps its AOT artifacts under its own cache directory


@pytest.mark.parametrize("profile, label, c1_ratio, c256_ratio", [
    ("eager", "launchforkeager1", (0.4, 0.55), (0.7, 0.85)),
    ("fewgraphs", "launchforkfewgraphs1", (0.98, 1.02), (0.97, 1.03)),
])
def test_graphs_and_compile_against_throughput(profile, label, c1_ratio, c256_ratio):
    default = "launchforkseed1"
    ratio_c1 = QBENCH[label + "-c1"]["output_throughput"] / QBENCH[default + "-c1"]["output_throughput"]
    ratio_c256 = QBENCH[label + "-c256"]["output_throughput"] / QBENCH[default + "-c256"]["output_throughput"]
    assert c1_ratio[0] <= ratio_c1 <= c1_ratio[1]
    assert c256_ratio[0] <= ratio_c256 <= c256_ratio[1]
    assert all(QBENCH[k]["completed"] in (16, 1024) for k in QBENCH)
    if profile == "eager":
        assert PHASES[label]["from_go_s"] < 10 and PHASES[label]["phases"]["cuda_graphs"] is None
    else:
        # Ten capture sizes: graphs in about a second; the first start compiled anew (a new cache key).
        assert PHASES["launchforkfewgraphs2"]["phases"]["cuda_graphs"] <= 1.5
        assert PHASES["launchforkfewgraphs2"]["from_go_s"] < min(PHASES[x]["from_go_s"] for x in LAUNCHED)
        assert PHASES[label]["reported"]["compilation_s"] > 10
