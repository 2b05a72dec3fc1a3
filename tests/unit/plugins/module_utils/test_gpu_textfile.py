"""The GPU textfile (issue #31: the dashboards' GPU panels): NVML readings as node_exporter textfile metrics. The NVML
calls are those recorded on the real H200 (tests/fixtures/nvidia/h200-nvml.json, replayed: no GPU here); the file is
linted by Debian's promtool, and the metric names are the ones the dashboards' GPU panels use."""
from __future__ import annotations

import json
import pathlib
import re
import subprocess

from nvml_replay import ReplayNvml

from ansible_collections.llmfleet.vllm.plugins.module_utils import gpu_textfile

FIX = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "nvidia"
CONTRACT = json.loads((pathlib.Path(__file__).resolve().parents[4] / "roles" / "observability" / "files"
                       / "metric-contract.json").read_text())


def test_the_h200_readings_become_metrics_that_promtool_accepts(prometheus_bin, tmp_path):
    recording = json.loads((FIX / "h200-nvml.json").read_text())
    calls = recording["calls"]
    nvml = ReplayNvml(recording)
    assert gpu_textfile.main(["--textfile-dir", str(tmp_path)], nvml=nvml) == 0
    text = (tmp_path / "llmfleet-gpu.prom").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["llmfleet-gpu.prom"]  # no temp file left
    check = subprocess.run([prometheus_bin + "/promtool", "check", "metrics"], input=text, capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr + text
    labels = 'gpu="0",uuid="%s",name="NVIDIA H200"' % calls["nvmlDeviceGetUUID(handle0)"]
    assert "llmfleet_gpu_power_watts{%s} %r\n" % (labels, calls["nvmlDeviceGetPowerUsage(handle0)"] / 1000.0) in text
    assert "llmfleet_gpu_power_limit_watts{%s} 700\n" % labels in text
    assert "llmfleet_gpu_memory_used_bytes{%s} %d\n" % (labels, calls["nvmlDeviceGetMemoryInfo(handle0)"]["used"]) in text
    assert "llmfleet_gpu_memory_total_bytes{%s} %d\n" % (labels, calls["nvmlDeviceGetMemoryInfo(handle0)"]["total"]) in text
    assert "nvmlShutdown()" in nvml.made
    # Every GPU metric a dashboard panel uses is one this file has.
    used = {e["metric"] for e in CONTRACT["metrics"] if e["source"] == "gpu_textfile"}
    written = set(re.findall(r"^(llmfleet_gpu_\w+)\{", text, re.M))
    assert used and used <= written, used - written
