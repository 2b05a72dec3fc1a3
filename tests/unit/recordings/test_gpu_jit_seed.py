# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Issue 45 item 2 as built, on the systemd GPU host (2026-12-06, H100 80 GB, vLLM 0.26.0 CUDA; docs/gpu-validation.md
"Lease 6"): a revision pivot of B records its unit's JIT caches after the gate and fetches their tar (the part a
rollout's canary plays, `-e pivot_jit_cache_archive=`); the host's caches are emptied (a host that never compiled);
the next revision pivot is given the tar by `pivot_jit_cache_seed` and lays it in, checked file by file, before its
start; a last one runs with the caches emptied and nothing given. Recordings: tests/fixtures/nvidia/h100-pivot-jitseed-*
(the pivot records, the fleet manifest's key and sizes, the play summaries)."""
from __future__ import annotations

import json
import pathlib

FIX = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "nvidia"
RECORDS = json.loads((FIX / "h100-pivot-jitseed-records.json").read_text())
MANIFEST = json.loads((FIX / "h100-pivot-jitseed-fleet-manifest.json").read_text())
SUMMARIES = (FIX / "h100-pivot-jitseed-summaries.txt").read_text()
REC, SEEDED, COLD = (RECORDS["pivot-%s-record.json" % name] for name in ("revrec", "revseedm", "revcold"))


def test_the_canarys_caches_were_recorded_under_the_units_key_as_vllm_and_triton_files():
    recorded = REC["jit_cache"]["recorded"]
    assert (recorded["files"], recorded["bytes"]) == (MANIFEST["files"], MANIFEST["bytes"]) == (419, 50433885)
    assert recorded["key_id"] == recorded["unit_key_id"] == MANIFEST["key_id"]
    assert MANIFEST["key"]["device"] == "NVIDIA H100 80GB HBM3 sm_90" and MANIFEST["key"]["vllm_version"] == "0.26.0"
    # What a CUDA start keeps: vLLM's compile cache and Triton's kernels; no link, FIFO or device among them (the
    # module refuses those), and nothing of the driver's .nv cache.
    assert set(MANIFEST["per_directory"]) == {"vllm", ".triton"} and MANIFEST["per_directory"][".triton"]["files"] == 348


def test_a_host_given_the_fleets_caches_starts_as_warm_as_the_canary_and_one_without_them_compiles_again():
    seeded = SEEDED["jit_cache"]["seeded"]
    assert (seeded["seeded"], seeded["key_matches"], seeded["problems"], seeded["files"]) == (True, True, [], 419)
    assert SEEDED["jit_cache"]["verified"]["files"] == 0  # the host's own caches were emptied before
    assert SEEDED["strategy"] == REC["strategy"] == COLD["strategy"] == "stop_start"
    # Slot down: seeded 11.8 s, the canary's warm start 12.4 s, emptied and not given 42.8 s (compile and Triton again).
    assert (SEEDED["downtime_s"], REC["downtime_s"], COLD["downtime_s"]) == (11.8, 12.4, 42.8)
    assert SEEDED["load_time_s"] / REC["load_time_s"] < 1.0 < 1.2 and COLD["load_time_s"] > 3 * SEEDED["load_time_s"]
    assert SEEDED["start_phases"]["phases"]["warmup"] == 1.0 and COLD["start_phases"]["phases"]["warmup"] == 12.0
    assert "JIT caches: seeded from the fleet's copy (419 files)" in SUMMARIES


def test_the_module_run_as_root_in_the_users_cache_was_refused_and_the_start_went_on():
    # The device host's inventory had ansible_become: false (overriding the task's become_user): the check refused to
    # run as root in the service user's directory, and the pivot went on and built its own caches. (This record's
    # jit_cache predates the fix that reports a failed step as a fault only, not as 0 files.)
    assert "belongs to uid 996: run jit_cache as that user (become_user), not as root" in COLD["jit_cache"]["fault"]
    assert COLD["result"] == "success" and COLD["load_time_s"] == 42.21
