# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""llmfleet.vllm.throughput_check through real ansible-playbook runs.

Endpoints: tests/fixtures/token_stream_server.py (a TEST FIXTURE stand-in server
run as its own process, with fault injection) and, for test_real_vllm_*, a real
vLLM OpenAI server (CPU engine) given by the ``vllm_server`` fixture.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import bench_stats
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_workload import vocabulary_prompts

# The requests that size the random prompts (every word once, in prompts of at most prompt_tokens words; default 32).
SIZING = len(vocabulary_prompts(32))

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK_BIN = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
# The module runs on the target with its system python (stdlib only): use the host's.
TARGET_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


# `stream_server` (tests/integration/conftest.py) starts the token-stream fixture endpoint.


def run_module(tmp_path, args, check=False, timeout=300, extra_env=None):
    """Run the module in a one-task playbook (connection: local); returns (rc, result dict, output)."""
    out = tmp_path / "result.json"
    play = [{
        "name": "throughput_check",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars": {"ansible_python_interpreter": TARGET_PYTHON},
        "tasks": [
            {"name": "Gate", "llmfleet.vllm.throughput_check": args, "register": "tc", "ignore_errors": True},
            {"name": "Save", "ansible.builtin.copy": {"content": "{{ tc | to_json }}", "dest": str(out)},
             "check_mode": False},
            {"name": "Propagate failure", "ansible.builtin.fail": {"msg": "{{ tc.msg }}"}, "when": "tc is failed"},
        ],
    }]
    pb = tmp_path / "play.yml"
    pb.write_text(json.dumps(play))
    cmd = [PLAYBOOK_BIN, "-i", "localhost,", str(pb)]
    if check:
        cmd.append("--check")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env.update(extra_env or {})
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                       check=False)
    result = json.loads(out.read_text()) if out.exists() else None
    return p.returncode, result, p.stdout + p.stderr


def test_passes_and_counts_match_server(stream_server, tmp_path):
    srv = stream_server()
    results = tmp_path / "out" / "tput.json"
    rc, r, out = run_module(tmp_path, {
        "base_url": srv.base_url + "/v1", "concurrency": [1, 8, 32], "requests_per_level": 64,
        "max_tokens": 32, "warmup_requests": 2, "min_output_tok_s": 100, "max_ttft_p99_s": 5,
        "max_tpot_p99_s": 1, "max_metrics_deviation": 0.0, "results_path": str(results)})
    assert rc == 0, out
    assert r["passed"] is True and r["failures"] == [] and r["changed"] is False
    assert r["model"] == "fixture-model"          # discovered from /v1/models
    assert r["warmup"] == {"completed": 2, "failed": 0}
    assert [lv["concurrency"] for lv in r["levels"]] == [1, 8, 32]
    for lv in r["levels"]:
        assert lv["completed"] == 64 and lv["failed"] == 0
        assert lv["output_tokens"] == lv["output_tokens_usage"] == lv["output_chunks"] == 64 * 32
        assert lv["server_generation_tokens"] == 64 * 32     # warm-up excluded
        assert lv["metrics_ratio"] == 1.0
        assert lv["output_tok_s"] > 100
        assert lv["ttft_s"]["count"] == 64 and lv["tpot_s"]["count"] == 64
        assert lv["ttft_s"]["p50"] <= lv["ttft_s"]["p99"]
    saved = json.loads(results.read_text())
    assert saved["levels"][2]["output_tokens"] == 64 * 32
    # SIZING requests sized the prompts (this fixture counts a word as a token), two warmed up, then the levels.
    sizing = {k: r["prompt"].pop(k) for k in ("sizing_seconds", "sizing_prompt_tokens")}
    assert r["prompt"] == {"tokens": 32, "words": 32, "tokens_per_word": 1.0, "tokens_per_request": 0.0, "sizing_requests": SIZING}
    assert sizing["sizing_prompt_tokens"] == 2 * 108 and sizing["sizing_seconds"] > 0
    assert srv.metric("fixture_posts_total") == SIZING + 2 + 3 * 64


def test_prompts_are_sized_in_the_servers_tokens(stream_server, tmp_path):
    """Issue 46: a tokenizer that makes two tokens of each word (as the test models' nearly does) gets half the words,
    so that prompt_tokens are the server's tokens, as vllm bench serve's random prompts are; no usage, no sizing."""
    srv = stream_server("--prompt-tokens-per-word", "2")
    rc, r, out = run_module(tmp_path, {"base_url": srv.base_url, "concurrency": [4], "requests_per_level": 8,
                                       "max_tokens": 4, "prompt_tokens": 40, "warmup_requests": 1})
    assert rc == 0, out
    prompt = dict(r["prompt"], sizing_seconds=None)
    assert prompt == {"tokens": 40, "words": 20, "tokens_per_word": 2.0, "tokens_per_request": 0.0, "sizing_requests": 7,
                      "sizing_prompt_tokens": 2 * 2 * 108, "sizing_seconds": None}, r["prompt"]
    # Every word twice (in 3 prompts of at most 40 words, then in 4), then the warm-up's and the level's 20 words each:
    # 40 tokens a request.
    assert srv.metric("vllm:prompt_tokens_total") == 2 * 2 * 108 + 40 * (1 + 8) and r["levels"][0]["prompt_tokens"] == 8 * 40
    mute = stream_server("--prompt-tokens-per-word", "2", "--no-usage")
    rc, r, out = run_module(tmp_path, {"base_url": mute.base_url, "concurrency": [2], "requests_per_level": 2,
                                       "max_tokens": 4, "prompt_tokens": 40, "warmup_requests": 0})
    assert rc == 0 and r["prompt"]["words"] == 40 and r["prompt"]["tokens_per_word"] is None, (out, r.get("prompt"))
    assert any("the prompts were not sized in the server's tokens (0 of 7 sizing requests failed, or no usage came back)"
               in warning for warning in r.get("warnings", [])), r.get("warnings")


def test_chat_endpoint_without_usage_counts_chunks(stream_server, tmp_path):
    srv = stream_server("--no-usage", "--tokens", "9")
    rc, r, out = run_module(tmp_path, {"base_url": srv.base_url, "endpoint": "chat", "model": "fixture-model",
                                       "concurrency": [4], "requests_per_level": 12, "warmup_requests": 0})
    assert rc == 0, out
    lv = r["levels"][0]
    assert lv["output_tokens_usage"] == 0 and lv["requests_with_usage"] == 0
    assert lv["output_tokens"] == lv["output_chunks"] == 12 * 9   # role-only first chunk not counted
    assert lv["server_generation_tokens"] == 12 * 9


def test_fails_when_min_output_tok_s_not_met(stream_server, tmp_path):
    srv = stream_server("--token-delay", "0.01")
    rc, r, out = run_module(tmp_path, {"base_url": srv.base_url, "concurrency": [2, 4], "requests_per_level": 4,
                                       "max_tokens": 10, "min_output_tok_s": 1000000,
                                       "level_thresholds": [{"concurrency": 2, "min_output_tok_s": 1}]})
    assert rc != 0
    assert r["failed"] is True and r["passed"] is False
    assert len(r["failures"]) == 1       # the level-2 override passes, level 4 fails
    msg = r["failures"][0]
    assert msg.startswith("concurrency 4: output ") and "below min_output_tok_s 1e+06" in msg
    assert "40 tokens in" in msg
    assert "concurrency 4" in r["msg"]
    assert r["levels"][0]["passed"] is True and r["levels"][1]["passed"] is False


def test_fail_on_threshold_false_reports_only(stream_server, tmp_path):
    srv = stream_server()
    rc, r, out = run_module(tmp_path, {"base_url": srv.base_url, "concurrency": [2], "requests_per_level": 4,
                                       "min_output_tok_s": 1e12, "fail_on_threshold": False})
    assert rc == 0, out
    assert r["passed"] is False and len(r["failures"]) == 1
    assert not r.get("failed") and "below thresholds" in r["msg"]


def test_injected_500s_give_error_rate(stream_server, tmp_path):
    srv = stream_server("--fail-every", "5")
    rc, r, out = run_module(tmp_path, {"base_url": srv.base_url, "model": "fixture-model", "concurrency": [4],
                                       "requests_per_level": 40, "warmup_requests": 0, "max_tokens": 8,
                                       "max_error_rate": 0.1})
    assert rc != 0
    lv = r["levels"][0]
    assert lv["errors"] == {"http_500": 8} and lv["failed"] == 8 and lv["completed"] == 32
    assert lv["error_rate"] == pytest.approx(0.2)
    assert "injected failure" in lv["error_samples"][0]
    assert "error rate 20.0% (8 of 40 failed: http_500=8) is above max_error_rate 10.0%" in r["failures"][0]
    assert lv["output_tokens"] == 32 * 8


def test_dropped_streams_counted(stream_server, tmp_path):
    srv = stream_server("--drop-every", "4")
    rc, r, out = run_module(tmp_path, {"base_url": srv.base_url, "model": "fixture-model", "concurrency": [3],
                                       "requests_per_level": 24, "warmup_requests": 0, "max_tokens": 20,
                                       "max_error_rate": 0.5})
    assert rc == 0, out
    lv = r["levels"][0]
    assert lv["errors"] == {"stream_cut": 6} and lv["completed"] == 18
    assert lv["partial_output_tokens"] == 6 * 10
    assert lv["server_generation_tokens"] == 18 * 20 + 6 * 10
    # And every 4th of the requests that sized the prompts before (their failures only leave them out of the sizing).
    assert srv.metric("fixture_requests_dropped_total") == 6 + SIZING // 4


def test_several_events_per_read_counted_exactly(stream_server, tmp_path):
    # The fixture writes 7 SSE events (each its own HTTP chunk) per socket write: the client gets
    # several events, and chunk boundaries, inside one read.
    srv = stream_server("--tokens-per-write", "7", "--drop-every", "4")
    rc, r, out = run_module(tmp_path, {"base_url": srv.base_url, "model": "fixture-model", "concurrency": [5],
                                       "requests_per_level": 40, "warmup_requests": 0, "max_tokens": 20,
                                       "max_error_rate": 0.5})
    assert rc == 0, out
    lv = r["levels"][0]
    assert lv["errors"] == {"stream_cut": 10} and lv["completed"] == 30
    assert lv["output_tokens"] == lv["output_tokens_usage"] == 30 * 20
    assert lv["partial_output_tokens"] == 10 * 10
    assert lv["server_generation_tokens"] == 30 * 20 + 10 * 10


def test_timeout(stream_server, tmp_path):
    srv = stream_server("--ttft-delay", "3")
    rc, r, out = run_module(tmp_path, {"base_url": srv.base_url, "model": "fixture-model", "concurrency": [2],
                                       "requests_per_level": 2, "warmup_requests": 0, "timeout_s": 0.5})
    assert rc != 0
    lv = r["levels"][0]
    assert lv["errors"] == {"timeout": 2}
    assert lv["duration_s"] < 2.5
    assert "timeout=2" in r["failures"][0]


def test_server_down_is_connection_error(tmp_path):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    rc, r, out = run_module(tmp_path, {"base_url": "http://127.0.0.1:%d" % port, "model": "m", "concurrency": [2],
                                       "requests_per_level": 4, "warmup_requests": 0, "check_metrics": False})
    assert rc != 0
    assert r["levels"][0]["errors"] == {"connection": 4}


def test_metrics_deviation_and_missing_metrics(stream_server, tmp_path):
    srv = stream_server("--metrics-scale", "1.1")
    rc, r, out = run_module(tmp_path, {"base_url": srv.base_url, "concurrency": [4], "requests_per_level": 8,
                                       "max_tokens": 10, "max_metrics_deviation": 0.02})
    assert rc != 0
    assert r["levels"][0]["server_generation_tokens"] == pytest.approx(88.0)
    assert "client counted 80 output tokens" in r["failures"][0] and "deviation 9.09%" in r["failures"][0]

    srv2 = stream_server("--no-metrics")
    rc, r, out = run_module(tmp_path, {"base_url": srv2.base_url, "concurrency": [4], "requests_per_level": 8,
                                       "max_metrics_deviation": 0.02})
    assert rc == 0, out
    assert r["metrics_available"] is False and "HTTP 404" in r["metrics_error"]
    assert r["levels"][0]["server_generation_tokens"] is None


def test_check_mode_sends_no_load(stream_server, tmp_path):
    srv = stream_server()
    rc, r, out = run_module(tmp_path, {"base_url": srv.base_url, "concurrency": [4]}, check=True)
    assert rc == 0, out
    assert r["skipped_load"] is True and r["levels"] == []
    assert srv.metric("fixture_posts_total") == 0


def test_api_key_from_env_is_not_logged(stream_server, tmp_path):
    srv = stream_server()
    rc, r, out = run_module(tmp_path, {"base_url": srv.base_url, "concurrency": [1], "requests_per_level": 2},
                            extra_env={"VLLM_API_KEY": "sekrit-token-123"})
    assert rc == 0, out
    assert "sekrit-token-123" not in json.dumps(r)


@pytest.mark.parametrize("args, fragment", [
    ({"concurrency": []}, "concurrency must be a non-empty list"),
    ({"concurrency": [4, -2]}, "concurrency values must be >= 1 (got -2)"),
    ({"concurrency": [1], "max_tokens": 0}, "max_tokens must be >= 1 (got 0)"),
    ({"concurrency": [1], "timeout_s": -1}, "timeout_s must be > 0 (got -1.0)"),
    ({"concurrency": [1], "max_error_rate": 2}, "max_error_rate must be within 0..1"),
    ({"concurrency": [1], "requests_per_level": -5}, "requests_per_level must be >= 1 (got -5)"),
    ({"concurrency": [1], "requests_per_level": 5, "duration_s": 3}, "mutually exclusive: requests_per_level|duration_s"),
    ({"concurrency": [1], "level_thresholds": [{"concurrency": 9, "min_output_tok_s": 1}]},
     "level_thresholds[0].concurrency 9 is not one of concurrency [1]"),
    ({"concurrency": [1], "endpoint": "embeddings"}, "value of endpoint must be one of"),
    ({"concurrency": [1], "peer": {"base_url": "localhost:8000"}}, "peer.base_url must start with http:// or https://"),
])
def test_bad_options(stream_server, tmp_path, args, fragment):
    srv = stream_server()
    rc, r, out = run_module(tmp_path, dict({"base_url": srv.base_url}, **args))
    assert rc != 0
    assert fragment in r["msg"], r["msg"]
    assert srv.metric("fixture_posts_total") == 0


def test_duration_mode(stream_server, tmp_path):
    srv = stream_server("--token-delay", "0.002")
    rc, r, out = run_module(tmp_path, {"base_url": srv.base_url, "concurrency": [8], "duration_s": 1.0,
                                       "max_tokens": 16, "warmup_requests": 0})
    assert rc == 0, out
    lv = r["levels"][0]
    assert lv["requests"] > 8 and lv["failed"] == 0
    assert 1.0 <= lv["duration_s"] < 3.0
    assert lv["server_generation_tokens"] == lv["output_tokens"] == 16 * lv["requests"]


def test_rounds_until_the_interval_is_narrow_enough(stream_server, tmp_path):
    srv = stream_server("--token-delay", "0.002")
    rc, r, out = run_module(tmp_path, {"base_url": srv.base_url, "concurrency": [2, 4], "requests_per_level": 8,
                                       "max_tokens": 16, "warmup_requests": 0, "min_repeats": 3, "max_repeats": 30,
                                       "target_ci_rel": 0.5})
    assert rc == 0, out
    # Three rounds on a quiet box; a loaded one (CI's two cores run two suites) may need a few more to converge.
    for lv in r["levels"]:
        ci, samples = lv["output_tok_s_ci"], lv["samples"]
        rounds = len(samples)
        assert ci["stop"] == "converged" and ci["n"] == rounds and 3 <= rounds < 30, ci
        assert ci["low"] < ci["mean"] < ci["high"] and ci["rel_half_width"] <= 0.5
        assert [s["round"] for s in samples] == list(range(1, rounds + 1)) and all(s["completed"] == 8 for s in samples)
        assert lv["requests"] == 8 * rounds and lv["output_tokens"] == 8 * rounds * 16  # the level pools its rounds
        assert lv["server_generation_tokens"] == 8 * rounds * 16
        assert lv["goodput"] is None
    assert srv.metric("fixture_posts_total") == SIZING + sum(lv["requests"] for lv in r["levels"])
    assert "± " in r["msg"] and re.search(r"\((\d+) rounds\)", r["msg"])


def test_rounds_stop_at_max_repeats_or_the_time_budget(stream_server, tmp_path):
    srv = stream_server("--token-delay", "0.002")
    common = {"base_url": srv.base_url, "concurrency": [2], "requests_per_level": 4, "max_tokens": 8,
              "warmup_requests": 0, "min_repeats": 2, "target_ci_rel": 1e-9}
    rc, r, out = run_module(tmp_path, dict(common, max_repeats=4))
    assert rc == 0, out
    assert r["levels"][0]["output_tok_s_ci"]["stop"] == "max_repeats" and len(r["levels"][0]["samples"]) == 4
    rc, r, out = run_module(tmp_path, dict(common, max_repeats=100000, repeat_budget_s=1.0))
    assert rc == 0, out
    lv = r["levels"][0]
    assert lv["output_tok_s_ci"]["stop"] == "budget" and 2 <= len(lv["samples"]) < 100000
    assert lv["duration_s"] <= 1.5, lv["duration_s"]


def test_interleaved_rounds_cancel_the_drift_that_back_to_back_runs_read_as_a_difference(stream_server, tmp_path):
    """A server that slows down 4x after 32 requests: two back-to-back runs against it read 'slower' although nothing
    but the machine changed; the same endpoint as its own peer, rounds alternating A B B A, reads no significant
    difference; a peer that really is slower is called so, and each server gets exactly its own rounds."""
    common = {"concurrency": [2], "requests_per_level": 8, "max_tokens": 16, "warmup_requests": 0, "min_repeats": 4,
              "max_repeats": 4}
    # The slowdown comes after the first run's 32 requests and those that sized its prompts.
    drifting = stream_server("--token-delay", "0.003", "--slow-after", str(SIZING + 32), "--slow-factor", "4")
    runs = []
    for _run in range(2):
        rc, r, out = run_module(tmp_path, dict(common, base_url=drifting.base_url))
        assert rc == 0, out
        runs.append(r["levels"][0]["output_tok_s_ci"])
    assert bench_stats.compare(runs[1], runs[0]) == "slower", runs

    # ... and here after each side's sizing and the first two rounds of each.
    drifting = stream_server("--token-delay", "0.003", "--slow-after", str(2 * SIZING + 32), "--slow-factor", "4")
    rc, r, out = run_module(tmp_path, dict(common, base_url=drifting.base_url, peer={"base_url": drifting.base_url}))
    assert rc == 0, out
    a, b = r["levels"][0], r["peer"]["levels"][0]
    assert len(a["samples"]) == len(b["samples"]) == 4 and a["requests"] == b["requests"] == 32, (a, b)
    # A B B A A B B A: each side had two rounds before the slowdown and two after.
    order = sorted([(s["start_s"], "A") for s in a["samples"]] + [(s["start_s"], "B") for s in b["samples"]])
    assert "".join(side for _start, side in order) == "ABBAABBA", order
    assert [s["output_tok_s"] > a["output_tok_s_ci"]["mean"] for s in a["samples"]] == [True, True, False, False], a["samples"]
    assert [s["output_tok_s"] > b["output_tok_s_ci"]["mean"] for s in b["samples"]] == [True, True, False, False], b["samples"]
    assert bench_stats.compare(a["output_tok_s_ci"], b["output_tok_s_ci"]) == bench_stats.NO_DIFFERENCE, (a, b)
    assert r["levels"][0]["server_generation_tokens"] is None  # one server behind both sides: no counter check
    assert drifting.metric("fixture_posts_total") == 2 * SIZING + 64

    fast, slow = stream_server("--token-delay", "0.002"), stream_server("--token-delay", "0.008", "--model-name", "peer-model")
    rc, r, out = run_module(tmp_path, dict(common, base_url=fast.base_url, peer={"base_url": slow.base_url + "/v1"},
                                           warmup_requests=1))
    assert rc == 0, out
    assert r["peer"]["model"] == "peer-model" and r["peer"]["base_url"] == slow.base_url + "/v1"
    assert bench_stats.compare(r["levels"][0]["output_tok_s_ci"], r["peer"]["levels"][0]["output_tok_s_ci"]) == "faster", r
    assert fast.metric("fixture_posts_total") == slow.metric("fixture_posts_total") == SIZING + 1 + 32  # and the warm-up
    assert "interleaved with peer-model" in r["msg"], r["msg"]


@pytest.mark.parametrize("peer, min_repeats, max_repeats, order", [
    (False, 3, 10, "AAA"),            # one side: as few rounds as the rule allows
    (True, 3, 10, "ABBAABBA"),        # two: whole A B B A blocks, 4 rounds a side
    (True, 3, 3, "ABBAAB"),           # ... unless max_repeats comes first
    (True, 1, 1, "AB"),
])
def test_interleaved_rounds_end_after_whole_abba_blocks(stream_server, tmp_path, peer, min_repeats, max_repeats, order):
    """A target so wide (±1000 %) that every level converges as soon as it has an interval: only the stop rule decides
    how many rounds each side gets, and the rounds' start times give their order."""
    srv = stream_server("--token-delay", "0.001")
    args = {"base_url": srv.base_url, "concurrency": [2], "requests_per_level": 4, "max_tokens": 4, "warmup_requests": 0,
            "min_repeats": min_repeats, "max_repeats": max_repeats, "target_ci_rel": 10.0}
    if peer:
        args["peer"] = {"base_url": srv.base_url}
    rc, r, out = run_module(tmp_path, args)
    assert rc == 0, out
    sides = [("A", r["levels"][0])] + ([("B", r["peer"]["levels"][0])] if peer else [])
    starts = sorted((sample["start_s"], name) for name, level in sides for sample in level["samples"])
    assert "".join(name for _start, name in starts) == order, starts
    assert srv.metric("fixture_posts_total") == 4 * len(order) + SIZING * len(sides)  # and each side's sizing


def test_goodput_counts_the_requests_within_the_slos(stream_server, tmp_path):
    srv = stream_server("--ttft-delay", "0.05", "--token-delay", "0.001")
    common = {"base_url": srv.base_url, "concurrency": [2], "requests_per_level": 6, "max_tokens": 8, "warmup_requests": 0}
    rc, r, out = run_module(tmp_path, dict(common, slo_ttft_s=0.01, slo_tpot_s=1.0))
    assert rc == 0, out
    assert r["levels"][0]["goodput"]["requests_met"] == 0 and r["levels"][0]["goodput"]["output_tok_s"] == 0
    rc, r, out = run_module(tmp_path, dict(common, slo_ttft_s=5.0, slo_tpot_s=1.0))
    assert rc == 0, out
    good = r["levels"][0]["goodput"]
    assert good["requests_met"] == 6 and good["output_tok_s"] == pytest.approx(r["levels"][0]["output_tok_s"])


# --------------------------------------------------------------------------------------------
# Real vLLM: the `vllm_server` fixture (tests/integration/conftest.py) serves tiny-llama-a with
# vLLM's CPU engine inside a systemd test host.
# --------------------------------------------------------------------------------------------


def test_real_vllm_tok_s_matches_server_metrics(vllm_server, tmp_path):
    results = tmp_path / "vllm.json"
    args = {"base_url": vllm_server.base_url, "concurrency": [1, 4], "requests_per_level": 8,
            "max_tokens": 32, "prompt_tokens": 16, "warmup_requests": 1, "timeout_s": 120,
            "max_error_rate": 0, "max_metrics_deviation": 0.02, "results_path": str(results)}
    if getattr(vllm_server, "model", None):
        args["model"] = vllm_server.model
    rc, r, out = run_module(tmp_path, args, timeout=600)
    assert rc == 0, out
    assert r["metrics_available"] is True
    for lv in r["levels"]:
        assert lv["completed"] == 8 and lv["failed"] == 0
        assert lv["requests_with_usage"] == 8
        assert lv["output_tokens"] == 8 * 32            # ignore_eos: exactly max_tokens each
        assert lv["server_generation_tokens"] > 0
        assert abs(lv["metrics_ratio"] - 1.0) <= 0.02
        assert abs(lv["output_tok_s"] / lv["server_output_tok_s"] - 1.0) <= 0.02
        assert lv["ttft_s"]["p99"] is not None and lv["tpot_s"]["p99"] is not None
    print("REAL_VLLM_FIGURES " + json.dumps([{k: lv[k] for k in (
        "concurrency", "output_tok_s", "server_output_tok_s", "output_tokens", "server_generation_tokens",
        "metrics_ratio", "request_s")} for lv in r["levels"]]))


def test_real_vllm_threshold_failure(vllm_server, tmp_path):
    args = {"base_url": vllm_server.base_url, "concurrency": [2], "requests_per_level": 2, "max_tokens": 8,
            "warmup_requests": 0, "timeout_s": 120, "min_output_tok_s": 1e9}
    if getattr(vllm_server, "model", None):
        args["model"] = vllm_server.model
    rc, r, out = run_module(tmp_path, args, timeout=600)
    assert rc != 0
    assert r["failures"][0].startswith("concurrency 2: output ") and "min_output_tok_s 1e+09" in r["failures"][0]
