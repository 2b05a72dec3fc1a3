# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unit tests of llmfleet.vllm.throughput_check: option checks, thresholds, docs vs argument spec."""
from __future__ import annotations

import json

import pytest
import yaml
from ansible.module_utils import basic
from ansible.module_utils.common.text.converters import to_bytes

from ansible_collections.llmfleet.vllm.plugins.module_utils import loadgen_gate as gate
from ansible_collections.llmfleet.vllm.plugins.modules import throughput_check as tc


def params(**kw):
    p = dict((k, v.get("default")) for k, v in tc.argument_spec().items())
    p.update(base_url="http://127.0.0.1:8000")
    p.update(kw)
    return p


def level(**kw):
    lv = {"concurrency": 8, "requests": 100, "completed": 100, "failed": 0, "error_rate": 0.0, "errors": {},
          "output_tok_s": 1000.0, "output_tokens": 32000, "duration_s": 32.0,
          "ttft_s": {"p50": 0.1, "p99": 0.5, "count": 100}, "tpot_s": {"p50": 0.01, "p99": 0.02, "count": 100},
          "server_generation_tokens": 32000.0}
    lv.update(kw)
    return lv


def test_defaults_validate():
    assert gate.validate_params(params()) == []


@pytest.mark.parametrize("kw, fragment", [
    ({"concurrency": []}, "concurrency must be a non-empty list"),
    ({"concurrency": [1, 0, -3]}, "concurrency values must be >= 1 (got 0, -3)"),
    ({"requests_per_level": 0}, "requests_per_level must be >= 1"),
    ({"duration_s": 0.0}, "duration_s must be > 0"),
    ({"timeout_s": -2.0}, "timeout_s must be > 0"),
    ({"prompt_tokens": 0}, "prompt_tokens must be >= 1"),
    ({"max_tokens": -1}, "max_tokens must be >= 1"),
    ({"warmup_requests": -1}, "warmup_requests must be >= 0"),
    ({"min_output_tok_s": -5.0}, "min_output_tok_s must be >= 0"),
    ({"max_ttft_p99_s": -1.0}, "max_ttft_p99_s must be >= 0"),
    ({"max_error_rate": 1.5}, "max_error_rate must be within 0..1"),
    ({"base_url": "127.0.0.1:8000"}, "base_url must start with http:// or https://"),
    ({"level_thresholds": [{"concurrency": 3, "min_output_tok_s": 1.0}]}, "level_thresholds[0].concurrency 3"),
    ({"level_thresholds": [{"concurrency": 1, "max_error_rate": -0.1}]}, "level_thresholds[0].max_error_rate"),
    ({"min_repeats": 0}, "min_repeats must be >= 1"),
    ({"min_repeats": 5, "max_repeats": 3}, "max_repeats 3 must be at least min_repeats 5"),
    ({"target_ci_rel": 0.0}, "target_ci_rel must be > 0"),
    ({"repeat_budget_s": -1.0}, "repeat_budget_s must be > 0"),
    ({"slo_ttft_s": 0.0}, "slo_ttft_s must be > 0"),
])
def test_validate_names_the_option(kw, fragment):
    problems = gate.validate_params(params(**kw))
    assert any(fragment in p for p in problems), problems


def test_check_level_passes():
    th = {"min_output_tok_s": 900, "max_error_rate": 0.0, "max_ttft_p99_s": 1, "max_tpot_p99_s": 0.05,
          "max_metrics_deviation": 0.02}
    assert gate.check_level(level(), th) == []


def test_check_level_each_threshold():
    lv = level(output_tok_s=812.4, output_tokens=25984, duration_s=31.98, failed=3, completed=97,
               error_rate=0.03, errors={"http_500": 2, "timeout": 1},
               ttft_s={"p50": 0.2, "p99": 2.5, "count": 97}, tpot_s={"p50": 0.02, "p99": 0.09, "count": 97},
               server_generation_tokens=30000.0)
    th = {"min_output_tok_s": 1000, "max_error_rate": 0.01, "max_ttft_p99_s": 2, "max_tpot_p99_s": 0.05,
          "max_metrics_deviation": 0.02}
    msgs = gate.check_level(lv, th)
    assert len(msgs) == 5
    assert msgs[0] == ("concurrency 8: error rate 3.0% (3 of 100 failed: http_500=2, timeout=1) is above "
                       "max_error_rate 1.0%")
    assert msgs[1] == ("concurrency 8: output 812.4 tok/s is below min_output_tok_s 1000 (25984 tokens in 31.98 s, "
                       "97/100 requests ok)")
    assert msgs[2].startswith("concurrency 8: TTFT p99 2.5 s is above max_ttft_p99_s 2 s")
    assert msgs[3].startswith("concurrency 8: TPOT p99 0.09 s is above max_tpot_p99_s 0.05 s")
    assert "deviation 13.39%" in msgs[4]


def test_check_level_boundaries_and_missing_samples():
    th = {"min_output_tok_s": 1000.0, "max_error_rate": 0.0, "max_ttft_p99_s": 0.5, "max_tpot_p99_s": None}
    assert gate.check_level(level(), th) == []            # equal values pass
    lv = level(ttft_s={"p50": None, "p99": None, "count": 0})
    assert gate.check_level(lv, th) == ["concurrency 8: no TTFT sample (no completed request with output) "
                                        "for max_ttft_p99_s 0.5"]
    assert gate.check_level(level(requests=0), th) == ["concurrency 8: no request was sent"]
    # no server metrics: deviation not checked
    assert gate.check_level(level(server_generation_tokens=None), {"max_metrics_deviation": 0.0}) == []


def test_min_output_tok_s_fails_a_level_in_rounds_only_when_its_whole_interval_is_below():
    th = {"min_output_tok_s": 1000.0}
    straddles = level(output_tok_s=990.0, output_tok_s_ci={"n": 5, "mean": 990.0, "low": 970.0, "high": 1010.0})
    assert gate.check_level(straddles, th) == []
    below = level(output_tok_s=950.0, output_tok_s_ci={"n": 5, "mean": 950.0, "low": 930.0, "high": 970.0})
    assert gate.check_level(below, th) == [
        "concurrency 8: output 950.0 tok/s (95% CI 930.0 to 970.0 over 5 rounds) is below min_output_tok_s 1000"]
    one_round = level(output_tok_s=990.0, output_tok_s_ci={"n": 1, "mean": 990.0, "low": None, "high": None})
    assert gate.check_level(one_round, th)[0].startswith("concurrency 8: output 990.0 tok/s is below")


def test_parse_prometheus_counter():
    text = ("# HELP vllm:generation_tokens_total x\n# TYPE vllm:generation_tokens_total counter\n"
            'vllm:generation_tokens_total{engine="0",model_name="a"} 120.0\n'
            'vllm:generation_tokens_total{engine="1",model_name="a"} 5\n'
            'vllm:generation_tokens_total_created{model_name="a"} 1.7e9\n'
            "vllm:prompt_tokens_total 9\n")
    assert gate.parse_prometheus_counter(text, "vllm:generation_tokens_total") == 125.0
    assert gate.parse_prometheus_counter(text, "vllm:prompt_tokens_total") == 9.0
    assert gate.parse_prometheus_counter(text, "nope") is None


def test_thresholds_for_level_override():
    p = params(concurrency=[1, 64], min_output_tok_s=500.0, max_ttft_p99_s=2.0,
               level_thresholds=[{"concurrency": 1, "min_output_tok_s": 40.0, "max_error_rate": None,
                                  "max_ttft_p99_s": None, "max_tpot_p99_s": 0.1}])
    assert tc.thresholds_for(p, 1) == {"min_output_tok_s": 40.0, "max_error_rate": 0.0, "max_ttft_p99_s": 2.0,
                                       "max_tpot_p99_s": 0.1, "max_metrics_deviation": None}
    assert tc.thresholds_for(p, 64)["min_output_tok_s"] == 500.0


def test_documentation_matches_argument_spec():
    doc = yaml.safe_load(tc.DOCUMENTATION)
    spec = tc.argument_spec()
    assert set(doc["options"]) == set(spec)
    for name, opt in spec.items():
        d = doc["options"][name]
        assert d.get("type", "str") == opt.get("type", "str"), name
        assert d.get("default") == opt.get("default"), name
        assert d.get("choices") == opt.get("choices"), name
    assert spec["api_key"]["no_log"] is True
    yaml.safe_load(tc.EXAMPLES)
    ret = yaml.safe_load(tc.RETURN)
    assert {"passed", "failures", "levels"} <= set(ret)


def _run_main(monkeypatch, capsys, args, check_mode=False):
    a = dict(args)
    if check_mode:
        a["_ansible_check_mode"] = True
    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": a})))
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy", raising=False)
    with pytest.raises(SystemExit):
        tc.main()
    return json.loads(capsys.readouterr().out)


def test_main_check_mode_sends_nothing(monkeypatch, capsys):
    # port 9 (discard) is not listening: any request would be a connection error
    r = _run_main(monkeypatch, capsys, {"base_url": "http://127.0.0.1:9", "concurrency": [4]}, check_mode=True)
    assert r.get("failed") is not True and r["skipped_load"] is True and "no load sent" in r["msg"]


def test_main_bad_option_message(monkeypatch, capsys):
    r = _run_main(monkeypatch, capsys, {"base_url": "http://127.0.0.1:9", "concurrency": [8, -1]})
    assert r["failed"] is True and r["msg"] == "invalid options: concurrency values must be >= 1 (got -1)"


def test_main_unreachable_server(monkeypatch, capsys):
    r = _run_main(monkeypatch, capsys, {"base_url": "http://127.0.0.1:9", "concurrency": [1]})
    assert r["failed"] is True and "could not run against http://127.0.0.1:9" in r["msg"]
    assert "/v1/models" in r["msg"]
