# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's parsers and report against REAL outputs of vLLM 0.26.0 (CUDA) on an NVIDIA H200,
recorded by tools/device/vllm_h200.sh on 2026-12-03 (tests/fixtures/nvidia/h200-vllm-*, docs/gpu-validation.md):
the benchmark record roles/benchmark wrote there, vLLM's own /metrics and `vllm bench serve` result files,
the units service_deploy rendered, and the start, sleep-mode and shard_verify results."""
from __future__ import annotations

import json
import os
import sys

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import bench_report as br
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_gate import parse_prometheus_counter

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
FIX = os.path.join(REPO, "tests", "fixtures", "nvidia")
sys.path.insert(0, os.path.join(REPO, "tools", "device"))

import unit_runner  # noqa: E402

LEVELS = [1, 8, 32, 128, 256, 512, 1024]
MAX_TOKENS = 128


def text(name):
    with open(os.path.join(FIX, name), encoding="utf-8") as handle:
        return handle.read()


def load(name):
    return json.loads(text(name))


@pytest.fixture(scope="module")
def record():
    return br.load_record(os.path.join(FIX, "h200-vllm-bench-record.json"))


def test_record_covers_every_level_with_power(record):
    assert record["schema"] == br.RECORD_SCHEMA and record["model"] == "h200-llama3-8b-random"
    assert [lv["concurrency"] for lv in record["levels"]] == LEVELS
    assert record["gpu_power"]["available"] and record["gpu_power"]["source"] == "nvml"
    for lv in record["levels"]:
        assert lv["failed"] == 0 and lv["completed"] == lv["requests"] == max(8, 4 * lv["concurrency"])
        assert lv["output_tokens"] == lv["requests"] * MAX_TOKENS
        # the server's generation counter moved by exactly the tokens the client counted
        assert lv["metrics_ratio"] == 1.0
        assert lv["power"]["samples"] >= 7 and 0 < lv["power"]["joules_per_token"] < 3
        assert lv["power"]["watts_max"] <= 710  # the H200's 700 W limit, NVML rounding
    assert br.summarize(record["levels"]) == record["summary"]
    assert record["summary"]["peak_concurrency"] == 512 and record["time_to_ready_s"] == 140.34


def test_vllm_bench_levels_side_by_side(record):
    bench = record["vllm_bench"]
    assert bench["error"] is None and [lv["concurrency"] for lv in bench["levels"]] == LEVELS
    for ours, theirs in zip(record["levels"], bench["levels"]):
        assert theirs["failed"] == 0 and theirs["output_tokens"] == ours["output_tokens"]
        # same server, same output length: the two clients agree on single-stream decode speed within 10 %
        if ours["concurrency"] == 1:
            assert abs(ours["tpot_s"]["p50"] - theirs["tpot_s"]["p50"]) / theirs["tpot_s"]["p50"] < 0.1


def test_metrics_counters_account_for_every_token_and_request(record):
    before, after = text("h200-vllm-metrics-before-bench.txt"), text("h200-vllm-metrics-after-bench.txt")
    assert parse_prometheus_counter(before, "vllm:generation_tokens_total") == 0.0
    warmup = record["settings"]["warmup_requests"]
    ours = sum(lv["output_tokens"] for lv in record["levels"])
    theirs = sum(lv["output_tokens"] for lv in record["vllm_bench"]["levels"])
    assert parse_prometheus_counter(after, "vllm:generation_tokens_total") == ours + theirs + warmup * MAX_TOKENS == 2009344
    requests = sum(lv["requests"] for lv in record["levels"] + record["vllm_bench"]["levels"]) + warmup
    # request_success_total has one sample per finished_reason (stop, length, abort, ...): the parser sums them
    assert parse_prometheus_counter(after, "vllm:request_success_total") == requests == 15698
    assert parse_prometheus_counter(after, "vllm:no_such_metric") is None


def test_vllm_bench_serve_result_file():
    raw = load("h200-vllm-bench-serve-c64.json")
    level = br.level_from_vllm_bench(raw)
    assert (level["concurrency"], level["requests"], level["failed"], level["output_tokens"]) == (64, 256, 0, 32768)
    assert level["output_tok_s"] == pytest.approx(8050.2, abs=0.1)
    assert level["ttft_s"]["p99"] == pytest.approx(0.2785, abs=1e-4)
    assert level["tpot_s"]["p50"] == pytest.approx(raw["median_tpot_ms"] / 1000.0)
    assert level["latency_s"]["mean"] == pytest.approx(1.0115, abs=1e-4)


def test_report_renders_the_recorded_levels(record):
    markdown = br.render_markdown(br.compare_records(record, None, "throughput_check"))
    device_report = text("h200-vllm-bench-report.md")
    for lv in record["levels"]:
        row = "| %d | %.1f |" % (lv["concurrency"], lv["output_tok_s"])
        assert row in markdown and row in device_report
    vllm_side = br.render_markdown(br.compare_records(record, None, "vllm_bench"))
    assert "| 1024 | %.1f |" % record["vllm_bench"]["levels"][-1]["output_tok_s"] in vllm_side


@pytest.mark.parametrize("label", ["cold", "sleep"])
def test_rendered_units_parse_to_the_command_that_ran(label):
    unit = unit_runner.parse_unit(text("h200-vllm-unit-%s.service" % label))
    ran = load("h200-vllm-ready-%s.json" % label)["start"]
    assert unit["argv"] == ran["argv"] == ran["state"]["argv"]
    assert unit["argv"][:3] == ["/opt/torch/.venv/bin/vllm", "serve", "/srv/models/h200-llama3-8b-random"]
    assert ("--enable-sleep-mode" in unit["argv"]) == (label == "sleep")
    env = unit_runner.environment_file(text("h200-vllm-unit-%s.env" % label))
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert env.get("VLLM_SERVER_DEV_MODE") == ("1" if label == "sleep" else None)
    # what the process got: systemd's base, Environment=, the EnvironmentFile, and the one passed-through variable
    expected = dict(env, HOME="/var/cache/llmfleet-vllm", XDG_CACHE_HOME="/var/cache/llmfleet-vllm", USER="vllm",
                    LOGNAME="vllm", SHELL="/usr/sbin/nologin", LANG="C.UTF-8", PATH=unit_runner.SYSTEMD_PATH,
                    LD_LIBRARY_PATH="/usr/local/nvidia/lib64:/usr/local/nvidia/lib")
    assert ran["environment"] == expected and ran["passed_env"] == ["LD_LIBRARY_PATH"]
    assert "PrivateTmp=true" in ran["ignored"] and unit["user"] == ran["user"] == "vllm"


def test_start_times_and_sleep_mode():
    ready = {label: load("h200-vllm-ready-%s.json" % label)["time_to_ready_s"] for label in ("cold", "warm", "sleep")}
    assert ready == {"cold": 140.34, "warm": 81.29, "sleep": 96.13}
    sleep = load("h200-vllm-sleep-wake.json")
    assert sleep["level"] == 1 and len(sleep["cycles"]) == 3
    for cycle in sleep["cycles"]:
        assert cycle["sleep_status"] == cycle["wake_status"] == 200
        assert cycle["is_sleeping"] == {"is_sleeping": True} and cycle["is_sleeping_after_wake"] == {"is_sleeping": False}
        assert cycle["memory_asleep_mib"] < 0.05 * cycle["memory_awake_mib"]
        assert cycle["first_request_after_wake"]["completion_tokens"] == 16
        assert cycle["wake_to_first_response_s"] < ready["warm"] / 50
    assert sleep["sleep_s"][0] > 10 * max(sleep["sleep_s"][1:])  # the first sleep allocates the pinned host copy


def test_shard_verify_on_the_generated_model():
    verify = load("h200-vllm-shard-verify.json")
    for mode in ("fast", "full"):
        result = verify[mode]
        assert not result["failed"] and not result["bad"] and not result["missing"] and not result["extra"]
        assert len(result["files"]) == 10 and {f["status"] for f in result["files"]} == {"ok"}
    full = verify["full"]
    assert full["bytes_hashed"] == full["total_bytes"] == 16063857103
    shards = [f for f in full["files"] if f["path"].endswith(".safetensors")]
    assert len(shards) == 4 and {f["hash_algorithm"] for f in shards} == {"sha256"}
    # the shards hold the 8.03e9 bf16 parameters plus one safetensors header each
    assert 0 < sum(f["size"] for f in shards) - 2 * 8030261248 < 4 * (1 << 20)
