"""The metric contract (issue #31 item 5): built from the PromQL of the shipped dashboards and alert rules
(tools/observability/build.py, promql-parser), checked against what vLLM exports - 0.26.0 on the H200
(tests/fixtures/nvidia/h200-vllm-metrics-*.txt); 0.32 on the CPU test bed is checked live by
tests/integration/test_gateway.py. A metric the engine does not export is caught, naming its panels and rules."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import metric_contract as mc

REPO = pathlib.Path(__file__).resolve().parents[4]
FIX = REPO / "tests" / "fixtures" / "nvidia"
CONTRACT = json.loads((REPO / "roles" / "observability" / "files" / "metric-contract.json").read_text())
sys.path.insert(0, str(REPO / "tools" / "observability"))
import build  # noqa: E402  pylint: disable=wrong-import-position


def test_the_shipped_dashboards_and_contract_are_what_the_code_builds():
    result = subprocess.run([sys.executable, str(REPO / "tools" / "observability" / "build.py"), "--check"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("recording", ["h200-vllm-metrics-before-bench.txt", "h200-vllm-metrics-after-bench.txt"])
def test_vllm_0_26_on_the_h200_exports_every_metric_the_dashboards_and_rules_use(recording):
    text = (FIX / recording).read_text()
    assert "engine (v0.26.0)" in (FIX / "h200-vllm-server-log-excerpt.txt").read_text()  # the server that was scraped
    entries = mc.contract_entries(CONTRACT)
    checked = [e for e in entries if e["source"] == "vllm"]
    assert len(checked) >= 10
    assert mc.missing_metrics(entries, mc.exported_metrics(text)) == []


def test_a_metric_the_engine_no_longer_exports_fails_naming_every_panel_and_rule_that_uses_it():
    text = (FIX / "h200-vllm-metrics-after-bench.txt").read_text()
    renamed = "\n".join(line for line in text.splitlines() if not line.startswith("vllm:kv_cache_usage_perc"))
    missing = mc.missing_metrics(mc.contract_entries(CONTRACT), mc.exported_metrics(renamed))
    assert [e["metric"] for e in missing] == ["vllm:kv_cache_usage_perc"]
    said = mc.message(missing, "gpu-01 slot default (m, vLLM 0.26.0)")
    assert said.startswith("gpu-01 slot default (m, vLLM 0.26.0) does not export 1 metric(s)")
    for user in ('alert LlmfleetKvCacheFull', 'dashboard llmfleet-host.json panel "KV cache usage"',
                 'dashboard llmfleet-fleet.json panel "KV cache usage, fullest slot of each host"'):
        assert user in said, said


def test_a_dashboard_query_on_a_removed_metric_is_caught_where_it_is_used():
    """vLLM removed its TPOT histogram (vllm:time_per_output_token_seconds) in 0.13: a panel still asking for it is
    found by the contract built from the panel's PromQL."""
    expr = 'histogram_quantile(0.99, sum by (le) (rate(vllm:time_per_output_token_seconds_bucket{host=~"$host"}[$__rate_interval])))'
    board = {"panels": [{"title": "TPOT", "targets": [{"expr": expr}]}]}
    entries = build.contract({"mine.json": board}, {"groups": []})
    assert entries == [{"metric": "vllm:time_per_output_token_seconds_bucket", "source": "vllm",
                        "used_by": ['dashboard mine.json panel "TPOT"']}]
    text = (FIX / "h200-vllm-metrics-after-bench.txt").read_text()
    assert [e["metric"] for e in mc.missing_metrics(entries, mc.exported_metrics(text))] == \
        ["vllm:time_per_output_token_seconds_bucket"]


def test_metric_names_come_from_the_promql_not_from_its_strings():
    names = build.metric_names('sum(rate(vllm:a_total{job="vllm:not_a_metric"}[5m])) / on (x) group_left '
                               'label_replace(b == 1, "c", "$1", "d", "(.*)") unless d offset 5m')
    assert names == {"vllm:a_total", "b", "d"}


def test_extra_entries_are_checked_and_bad_ones_refused():
    entries = mc.contract_entries(CONTRACT, [{"metric": "vllm:mine_total", "used_by": ["my panel"]}])
    assert entries[-1] == {"metric": "vllm:mine_total", "source": "vllm", "used_by": ["my panel"]}
    with pytest.raises(ValueError, match=r"observability_contract_extra\[0\]"):
        mc.contract_entries(CONTRACT, ["vllm:x"])
