# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpu_facts: parsing of REAL outputs recorded on an NVIDIA H200 (tests/fixtures/nvidia/h200-*),
of hand-written synthetic fixtures (8x RTX PRO 6000 Blackwell PCIe-only, 4x NVLink; labelled
as such in the files), and the module itself through `ansible` on this GPU-less host.

No GPU exists here, so the NVML path is tested with ReplayNvml, a test double that answers each
NVML call with the result recorded from the real H200 (tools/device/nvml_record.py), and the
nvidia-smi path with a fake nvidia-smi script that prints the recorded files.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import pynvml

from ansible_collections.llmfleet.vllm.plugins.module_utils import nvidia
from nvml_replay import ReplayNvml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
FIX = os.path.join(REPO, "tests", "fixtures", "nvidia")
ANSIBLE = os.path.join(os.path.dirname(sys.executable), "ansible")
QUERY_ARG = "--query-gpu=" + ",".join(nvidia.QUERY_FIELDS)


def fixture(name):
    """Fixture text; hand-written fixtures' leading '#' label lines are stripped."""
    with open(os.path.join(FIX, name)) as fh:
        text = fh.read()
    if name.startswith("synthetic-"):
        text = "".join(line for line in text.splitlines(True) if not line.startswith("#"))
    return text


def smi_runner(query, topo, plain, calls=None):
    """nvidia-smi stand-in serving fixture files by argument (no GPU here)."""
    def run(args):
        if calls is not None:
            calls.append(list(args))
        if args and args[0] == "topo":
            return 0, fixture(topo), ""
        if args and args[0].startswith("--query-gpu="):
            return 0, fixture(query), ""
        if not args:
            return 0, fixture(plain), ""
        return 2, "", "unexpected args %r" % (args,)
    return run


@pytest.fixture
def h200_recording():
    with open(os.path.join(FIX, "h200-nvml.json")) as fh:
        return json.load(fh)


# ---------------------------------------------------------------- nvidia-smi parsing, real H200

def test_h200_query_csv_recorded():
    gpus, driver = nvidia.parse_query_csv(fixture("h200-query-gpu.txt"))
    assert driver == "580.159.04"
    assert gpus == [{
        "index": 0, "name": "NVIDIA H200", "uuid": "GPU-f017d2fb-cb2e-7106-d9c6-7c2e6e6a584a",
        "memory_total_mib": 143771, "memory_used_mib": 0, "compute_capability": "9.0",
        "power_draw_w": 78.08, "power_limit_w": 700.0, "utilization_gpu_pct": 0,
        "pci_bus_id": "00000000:00:06.0", "persistence_mode": True, "nvlink_active_links": None,
    }]


def test_h200_cuda_version_from_plain_and_q_output():
    assert nvidia.parse_cuda_version(fixture("h200-nvidia-smi.txt")) == "13.0"
    assert nvidia.parse_cuda_version(fixture("h200-nvidia-smi-q.txt")) == "13.0"
    assert nvidia.parse_cuda_version("no version here") is None


def test_h200_topo_single_gpu_with_ansi_header():
    text = fixture("h200-topo-m.txt")
    assert "\x1b[4m" in text  # the real recording carries the underline escape the parser must strip
    topo = nvidia.parse_topo_matrix(text)
    assert topo == {"matrix": {"GPU0": {}}, "nvlink": False, "gpus": 1}


def test_h200_gather_nvidia_smi_path_matches_playbook_run():
    facts, errors = nvidia.gather(nvml=None, smi_run=smi_runner("h200-query-gpu.txt", "h200-topo-m.txt",
                                                                "h200-nvidia-smi.txt"))
    assert facts["source"] == "nvidia-smi"
    assert facts["gpu_count"] == 1 and facts["cuda_version"] == "13.0"
    assert facts["topology"] == {"nvlink": False, "interconnect": "single", "matrix": {"GPU0": {}}}
    assert errors == ["nvml: python module pynvml (nvidia-ml-py) not importable"]
    # the same parser ran inside ansible-playbook on the H200; its facts differ only in live readings
    with open(os.path.join(FIX, "h200-gpu-facts-playbook.json")) as fh:
        played = json.load(fh)["smi"]["ansible_facts"]["llmfleet_gpu_smi"]
    live = ("power_draw_w", "memory_used_mib", "utilization_gpu_pct")
    strip = [{k: v for k, v in g.items() if k not in live} for g in facts["gpus"]]
    assert strip == [{k: v for k, v in g.items() if k not in live} for g in played["gpus"]]


# ---------------------------------------------------------------- NVML path, replayed H200

def test_h200_nvml_replay_reproduces_recorded_facts(h200_recording):
    nvml = ReplayNvml(h200_recording)
    facts = nvidia.facts_from_nvml(nvml)
    assert facts == h200_recording["facts"]
    gpu = facts["gpus"][0]
    assert gpu["compute_capability"] == "9.0" and gpu["power_limit_w"] == 700.0
    assert gpu["nvlink_active_links"] == 0 and facts["topology"]["interconnect"] == "single"
    assert nvml.made[-1] == "nvmlShutdown()"


def test_h200_nvml_and_nvidia_smi_agree(h200_recording):
    via_nvml = nvidia.facts_from_nvml(ReplayNvml(h200_recording))
    via_smi = nvidia.facts_from_nvidia_smi(smi_runner("h200-query-gpu.txt", "h200-topo-m.txt", "h200-nvidia-smi.txt"))
    for key in ("gpu_count", "driver_version", "cuda_version"):
        assert via_nvml[key] == via_smi[key]
    for key in ("name", "uuid", "memory_total_mib", "compute_capability", "power_limit_w", "pci_bus_id",
                "persistence_mode"):
        assert via_nvml["gpus"][0][key] == via_smi["gpus"][0][key], key


def test_nvml_active_nvlinks_counted(h200_recording):
    override = {"nvmlDeviceGetNvLinkState(handle0,%d)" % i: pynvml.NVML_FEATURE_ENABLED for i in range(4)}
    override["nvmlDeviceGetNvLinkState(handle0,4)"] = pynvml.NVML_FEATURE_DISABLED
    facts = nvidia.facts_from_nvml(ReplayNvml(h200_recording, override))
    assert facts["gpus"][0]["nvlink_active_links"] == 4
    assert facts["topology"]["nvlink"] is True


def test_nvml_unsupported_readings_become_none(h200_recording):
    override = {"nvmlDeviceGetPowerUsage(handle0)": {"__error__": pynvml.NVML_ERROR_NOT_SUPPORTED},
                "nvmlDeviceGetEnforcedPowerLimit(handle0)": {"__error__": pynvml.NVML_ERROR_NOT_SUPPORTED},
                "nvmlDeviceGetPowerManagementLimit(handle0)": 450000}
    gpu = nvidia.facts_from_nvml(ReplayNvml(h200_recording, override))["gpus"][0]
    assert gpu["power_draw_w"] is None
    assert gpu["power_limit_w"] == 450.0


def test_nvml_init_failure_falls_back_to_nvidia_smi(h200_recording):
    broken = ReplayNvml(h200_recording, {"nvmlInit()": {"__error__": pynvml.NVML_ERROR_DRIVER_NOT_LOADED}})
    facts, errors = nvidia.gather(nvml=broken, smi_run=smi_runner("h200-query-gpu.txt", "h200-topo-m.txt",
                                                                  "h200-nvidia-smi.txt"))
    assert facts["source"] == "nvidia-smi" and facts["gpu_count"] == 1
    assert errors and errors[0].startswith("nvml: NVML init failed: Driver Not Loaded")


def test_source_nvml_only_does_not_fall_back(h200_recording):
    broken = ReplayNvml(h200_recording, {"nvmlInit()": {"__error__": pynvml.NVML_ERROR_LIBRARY_NOT_FOUND}})
    calls = []
    facts, errors = nvidia.gather(nvml=broken, smi_run=smi_runner("h200-query-gpu.txt", "h200-topo-m.txt",
                                                                  "h200-nvidia-smi.txt", calls), source="nvml")
    assert facts == nvidia.empty_facts("none")
    assert calls == []


# ---------------------------------------------------------------- synthetic (hand-written) fixtures

def test_synthetic_8x_rtxpro6000_pcie_only():
    """Hand-written fixture (see tests/fixtures/nvidia/README.md), not a recording."""
    assert open(os.path.join(FIX, "synthetic-8x-rtxpro6000-query-gpu.txt")).read().startswith("# HAND-WRITTEN")
    facts, errors = nvidia.gather(smi_run=smi_runner("synthetic-8x-rtxpro6000-query-gpu.txt",
                                                     "synthetic-8x-rtxpro6000-topo-m.txt",
                                                     "synthetic-8x-rtxpro6000-nvidia-smi.txt"))
    assert facts["gpu_count"] == 8
    assert {g["compute_capability"] for g in facts["gpus"]} == {"12.0"}
    assert [g["index"] for g in facts["gpus"]] == list(range(8))
    assert facts["gpus"][5]["power_draw_w"] is None  # [N/A]
    assert facts["gpus"][0]["memory_used_mib"] == 94210 and facts["gpus"][0]["utilization_gpu_pct"] == 97
    assert facts["topology"]["nvlink"] is False
    assert facts["topology"]["interconnect"] == "pcie"
    matrix = facts["topology"]["matrix"]
    assert sorted(matrix) == ["GPU%d" % i for i in range(8)]
    assert matrix["GPU0"]["GPU3"] == "NODE" and matrix["GPU0"]["GPU7"] == "SYS"
    assert "NIC0" not in matrix["GPU0"] and "GPU0" not in matrix["GPU0"]
    assert facts["cuda_version"] == "13.0" and facts["driver_version"] == "580.95.05"


def test_synthetic_nvlink_topology_detected():
    topo = nvidia.parse_topo_matrix(fixture("synthetic-4x-nvlink-topo-m.txt"))
    assert topo["nvlink"] is True and topo["gpus"] == 4
    assert topo["matrix"]["GPU2"] == {"GPU0": "NV18", "GPU1": "NV18", "GPU3": "NV18"}
    facts, _x = nvidia.gather(smi_run=smi_runner("synthetic-8x-rtxpro6000-query-gpu.txt",
                                                 "synthetic-4x-nvlink-topo-m.txt",
                                                 "synthetic-8x-rtxpro6000-nvidia-smi.txt"))
    assert facts["topology"]["interconnect"] == "nvlink"


def test_no_driver_is_gpu_count_zero_not_failure():
    message = fixture("synthetic-no-driver-nvidia-smi.txt")
    facts, errors = nvidia.gather(smi_run=lambda args: (9, message, ""))
    assert facts["gpu_count"] == 0 and facts["source"] == "none"
    assert "couldn't communicate with the NVIDIA driver" in errors[-1]


def test_legacy_driver_without_compute_cap_field_is_retried():
    calls = []

    def run(args):
        calls.append(args)
        if args and args[0] == QUERY_ARG:
            return 2, 'Field "compute_cap" is not a valid field to query.\n', ""
        if args and args[0].startswith("--query-gpu="):
            line = fixture("h200-query-gpu.txt").replace(", 9.0,", ",")
            return 0, line, ""
        return 0, fixture("h200-nvidia-smi.txt"), ""
    facts = nvidia.facts_from_nvidia_smi(run)
    assert facts["gpus"][0]["compute_capability"] is None
    assert facts["gpus"][0]["uuid"] == "GPU-f017d2fb-cb2e-7106-d9c6-7c2e6e6a584a"
    assert calls[1][0] == "--query-gpu=" + ",".join(nvidia.QUERY_FIELDS_LEGACY)


def test_truncated_csv_row_is_an_error():
    with pytest.raises(nvidia.NvidiaError):
        nvidia.parse_query_csv("0, NVIDIA H200, GPU-x, 143771\n")


def test_topo_without_header_is_an_error():
    with pytest.raises(nvidia.NvidiaError):
        nvidia.parse_topo_matrix("garbage\n")


# ---------------------------------------------------------------- the module through ansible

def _ansible(args, env_extra=None):
    env = dict(os.environ, ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_INVENTORY_UNPARSED_WARNING="0",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default", ANSIBLE_CALLBACK_RESULT_FORMAT="json",
               ANSIBLE_NOCOLOR="1")
    env.update(env_extra or {})
    proc = subprocess.run([ANSIBLE, "localhost", "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=" + sys.executable] + args,
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # "localhost | SUCCESS => {...json...}"
    return json.loads(proc.stdout.split("=>", 1)[1])


def test_module_on_this_gpu_less_host_returns_zero():
    """Real: this machine has no GPU, no libnvidia-ml and no nvidia-smi."""
    result = _ansible(["-m", "llmfleet.vllm.gpu_facts"])
    facts = result["ansible_facts"]["llmfleet_gpu"]
    assert facts["gpu_count"] == 0 and facts["source"] == "none"
    assert not result.get("failed") and result["changed"] is False


def test_module_parses_fake_nvidia_smi_with_recorded_outputs(tmp_path):
    """nvidia-smi test double (shell script printing the H200 recordings): no GPU here."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    'case "$1" in\n'
                    '  topo) cat %s/h200-topo-m.txt ;;\n'
                    '  --query-gpu=*) cat %s/h200-query-gpu.txt ;;\n'
                    '  "") cat %s/h200-nvidia-smi.txt ;;\n'
                    '  *) echo "bad args $*" >&2; exit 2 ;;\n'
                    'esac\n' % (FIX, FIX, FIX))
    fake.chmod(0o755)
    result = _ansible(["-m", "llmfleet.vllm.gpu_facts", "-a", "nvidia_smi_path=%s fact_name=gpu" % fake],
                      {"PATH": os.environ.get("PATH", "")})
    facts = result["ansible_facts"]["gpu"]
    assert facts["source"] == "nvidia-smi"  # NVML cannot load here, so auto fell back
    assert facts["gpus"][0]["name"] == "NVIDIA H200"
    assert facts["topology"]["interconnect"] == "single"
    assert any(e.startswith("nvml:") for e in result["errors"])
