# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Observability on a GPU for real (issue 31, 2026-12-05, docs/gpu-validation.md "Observability"), read back from its
recordings. On the systemd GPU host of tools/device/gpuhost.sh (an H100 80 GB that day), vLLM 0.26.0's CUDA engine
behind the gateway: playbooks/observability.yml after a pivot to A and after a blue/green pivot to B (phase observe)
installed the NVML timer, wrote the textfile and the targets and ran the metric contract against the live server.
No GPU is needed here: the recordings (tests/fixtures/nvidia/h100-observe-*) are checked for what the docs claim."""
from __future__ import annotations

import json
import pathlib
import re
import subprocess

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import metric_contract as mc

REPO = pathlib.Path(__file__).resolve().parents[3]
FIX = REPO / "tests" / "fixtures" / "nvidia"
CONTRACT = json.loads((REPO / "roles" / "observability" / "files" / "metric-contract.json").read_text())
RECORDS = json.loads((FIX / "h100-observe-records.json").read_text())
# Series the textfile has only in some states: during a pivot, with a fleet revision lock.
STATE_DEPENDENT = {"llmfleet_slot_pivot_started_timestamp_seconds", "llmfleet_slot_revision_locked"}


def text(name):
    return (FIX / ("h100-observe-" + name)).read_text()


def value(exposition, metric, **labels):
    found = []
    for line in exposition.splitlines():
        match = re.match(r"^%s\{(.*)\} (\S+)$" % re.escape(metric), line)
        if match and all('%s="%s"' % item in match.group(1) for item in labels.items()):
            found.append(float(match.group(2)))
    assert len(found) == 1, (metric, labels, found)
    return found[0]


@pytest.mark.parametrize("source, recording", [("vllm", "slot-metrics-a.txt"), ("haproxy", "haproxy-metrics-a.txt"),
                                               ("gpu_textfile", "gpu-a.prom"), ("textfile", "textfile-b.prom")])
def test_every_metric_a_panel_or_rule_uses_is_exported_on_the_gpu_host(source, recording):
    """vLLM 0.26.0 CUDA through the gateway's metrics listener, HAProxy 2.6's exporter, the NVML timer's file and the
    pivot's textfile hold every metric the shipped dashboards and rules use (the GPU panels included)."""
    entries = [e for e in mc.contract_entries(CONTRACT) if e["metric"] not in STATE_DEPENDENT]
    assert [e for e in entries if e["source"] == source]
    missing = mc.missing_metrics(entries, mc.exported_metrics(text(recording)), sources=(source,))
    assert missing == [], missing
    if source == "vllm":
        assert "# TYPE vllm:kv_cache_usage_perc gauge" in text(recording)
        assert 'engine="0"' in text(recording)  # a CUDA engine's series (the CPU bed's are checked live)


def test_the_contract_ran_against_the_live_server_and_passed():
    play = text("play.txt")
    assert play.count("TASK [llmfleet.vllm.observability : Check each slot's metrics against the dashboards and alert rules]") == 2
    assert re.findall(r"^gpuhost +: ok=\d+ +changed=\d+ +unreachable=0 +failed=0", play, re.M)
    assert len(re.findall(r"^gpuhost +: .*failed=0", play, re.M)) == 2


def test_the_targets_follow_the_pivot_with_the_slots_labels():
    a, b = (json.loads(text("targets-%s.json" % n)) for n in "ab")
    slots = [[g["labels"] for g in groups if g["labels"]["job"] == "llmfleet_vllm"] for groups in (a, b)]
    assert [(s[0]["model"], s[0]["revision"]) for s in slots] == [
        ("gpuhost-llama1b-a", RECORDS["pivot-first-record.json"]["revision"]),
        ("gpuhost-llama1b-b", RECORDS["pivot-bluegreen-record.json"]["revision"])]
    for labels in (s[0] for s in slots):
        assert (labels["__metrics_path__"], labels["gpu_ids"], labels["engine_version"], labels["alias"]) == \
            ("/slot/default/metrics", "0", "0.26.0", "chat")
    # node_exporter does not run on that host: no target for it.
    assert {g["labels"]["job"] for g in b} == {"llmfleet_vllm", "llmfleet_gateway"}


def test_the_textfile_says_what_the_blue_green_pivot_record_says(prometheus_bin):
    record, exposition = RECORDS["pivot-bluegreen-record.json"], text("textfile-b.prom")
    for name in ("textfile-a.prom", "textfile-b.prom", "gpu-a.prom", "gpu-b.prom"):
        check = subprocess.run([prometheus_bin + "/promtool", "check", "metrics"], input=text(name), capture_output=True,
                               text=True, check=False)
        assert check.returncode == 0, (name, check.stdout + check.stderr)
    assert value(exposition, "llmfleet_pivot_last_info", model="gpuhost-llama1b-b", previous_model="gpuhost-llama1b-a",
                 strategy="blue_green", result="passed") == 1
    assert value(exposition, "llmfleet_pivot_last_downtime_seconds") == record["downtime_s"] == 0
    assert value(exposition, "llmfleet_pivot_last_load_seconds") == record["load_time_s"]
    assert value(exposition, "llmfleet_pivot_last_timestamp_seconds") == record["new_ready_at"]
    for level in record["gate"]:
        at = {"concurrency": str(level["concurrency"])}
        assert value(exposition, "llmfleet_pivot_last_gate_output_tokens_per_second", **at) == level["output_tok_s"]
        assert value(exposition, "llmfleet_pivot_last_gate_output_tokens_per_second_ci_high", **at) == \
            level["output_tok_s_ci"]["high"]
    assert value(exposition, "llmfleet_slot_info", model="gpuhost-llama1b-b", gpu_ids="0", port="8001") == 1


@pytest.mark.parametrize("model", "ab")
def test_the_gpu_file_reads_the_h100_as_nvml_does(model):
    """The timer's NVML readings agree with a separate NVML snapshot taken after the pivot (tools/device/nvml_snapshot.py):
    the H100 80 GB, its 700 W limit, the memory vLLM holds (the same model served, to the MiB); it draws power."""
    exposition = text("gpu-%s.prom" % model)
    snapshot = json.loads(text("nvml-after-%s.json" % model))["gpus"][0]
    labels = {"gpu": "0", "uuid": snapshot["uuid"], "name": snapshot["name"]}
    assert snapshot["name"] == "NVIDIA H100 80GB HBM3"
    assert value(exposition, "llmfleet_gpu_power_limit_watts", **labels) == 700
    assert 50 < value(exposition, "llmfleet_gpu_power_watts", **labels) < 700
    assert value(exposition, "llmfleet_gpu_memory_used_bytes", **labels) // 2 ** 20 == snapshot["memory_used_mib"]
    assert value(exposition, "llmfleet_gpu_memory_total_bytes", **labels) // 2 ** 20 == snapshot["memory_total_mib"]
