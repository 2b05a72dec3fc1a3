# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the systemd GPU host run on the H200 (issue 28, 2026-12-04, docs/gpu-validation.md) recorded, read back.

tools/device/gpuhost.sh booted Debian 12's systemd 252 as PID 1 of a container over the H200 machine's own root,
ran roles/nvidia_driver, roles/vllm_install (wheelhouse) and roles/service_deploy there with the controller inside,
and inspected the live hardened units. No GPU is needed here: these are the recordings
(tests/fixtures/nvidia/h200-systemd-*), checked for what docs/gpu-validation.md claims from them."""
from __future__ import annotations

import json
import pathlib
import re

import pytest

FIX = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "nvidia"
REPO = FIX.parents[2]


def text(name):
    return (FIX / ("h200-systemd-" + name)).read_text()


def load(name):
    return json.loads(text(name))


def test_systemd_booted_as_pid1_over_the_machine_root():
    boot = text("boot.txt").splitlines()
    assert boot[0] == "is-system-running: running"
    assert boot[1].startswith("systemd 252 (252.39-1~deb12u2)")
    assert boot[2] == "systemd"  # /proc/1/comm inside the container
    assert 'PRETTY_NAME="Ubuntu 24.04.3 LTS"' in boot  # the machine's own userland
    assert "torch 2.11.0+cu130 True" in boot
    assert any(line.startswith("GPU 0: NVIDIA H200 (UUID: GPU-") for line in boot)
    for node in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        assert any(line.startswith("crw-rw-rw-") and line.endswith(node) for line in boot)
    # The first haproxy lacked two libraries; they were carried in the next call (extralibs).
    assert "libopentracing-c-wrapper.so.0" in boot[-1]
    assert text("haproxy-vv.txt").startswith("HAProxy version 2.6.12-1+deb12u4")
    added = text("layer-libs.txt")
    assert "libsystemd-shared-252.so" in added and "libsystemd-core-252.so" in added and "liblua5.3.so.0" in added


def test_nvidia_driver_left_the_loaded_driver_alone():
    driver = load("driver.json")
    assert driver["nvidia_driver_preinstalled"] is True and driver["nvidia_driver_loaded"] is True
    assert driver["nvidia_driver_loaded_version"] == driver["driver_version"] == "580.159.04"
    assert driver["nvidia_driver_packages"] == [] and driver["nvidia_driver_reboot_required"] is False
    state = driver["state"]
    assert state["use_loaded"] is True and state["driver_packages"] == []
    assert state["reason"] == "driver 580.159.04 is loaded and not from a package: left alone"
    # Found on the machine: loadable modules (initstate present), not built in as the notes had it.
    assert state["modules"] == {"nvidia": "module", "nvidia_modeset": "absent", "nvidia_uvm": "module"}
    assert state["char_devices"]["nvidia-uvm"] == 238
    assert state["uvm_nodes"] == {"nvidia-uvm": "ok", "nvidia-uvm-tools": "ok"}
    assert driver["gpu_count"] == driver["nvidia_driver_gpu_count_pci"] == 1
    play = text("driver-play.log")
    for skipped in ("Configure the package source", "Install the driver packages", "Blacklist nouveau",
                    "Load the NVIDIA module", "Pin the driver branch"):
        assert skipped not in play
    assert re.search(r"Enable and start the UVM device node unit\] \*+\nchanged", play)
    assert re.search(r"Check the driver version against the pin\] \*+\nok", play)
    assert "failed=0" in play


def test_uvm_unit_enabled_active_and_ordered_before_the_vllm_units():
    unit = text("driver-unit.txt")
    assert "--- is-enabled: enabled" in unit
    for prop in ("ActiveState=active", "SubState=exited", "Result=success", "WantedBy=multi-user.target",
                 "Before=multi-user.target shutdown.target"):
        assert prop in unit.splitlines()
    assert "llmfleet-nvidia-uvm-nodes[617]: /dev/nvidia-uvm: present (c 238:0)" in unit
    assert "/dev/nvidia-uvm-tools: present (c 238:1)" in unit
    assert "llmfleet-nvidia-uvm.conf" in unit  # boot-time load of the (loadable) nvidia_uvm module
    for model in ("a", "b"):
        props = load("inspect-%s.json" % model)["unit_props"]
        assert "nvidia-uvm-nodes.service" in props["After"].split()
        assert "nvidia-uvm-nodes.service" in props["Wants"].split()
    deps = text("unit-after-deps-b.txt")
    assert "nvidia-uvm-nodes.service" in deps


def test_vllm_0_26_0_from_the_wheelhouse_with_no_index():
    install = load("install.json")
    assert install["vllm_version"] == "0.26.0" and install["vllm_install_facts"]["version"] == "0.26.0"
    assert install["vllm_install_facts"]["venv"] == "/opt/torch/.venv"
    assert install["wheelhouse"] == "/root/carry/wheelhouse"
    play = text("install-play.log")
    assert re.search(r"Fail when the wheelhouse lacks the pinned engine wheel\] \*+\nok", play)
    assert re.search(r"Install the pinned engine package with pip\] \*+\nchanged", play)
    assert re.search(r"Verify vLLM reports the pinned version\] \*+\nok", play)
    assert "gpuhost_install.yml: 96 s" in play


@pytest.mark.parametrize("model", ["a", "b"])
def test_hardened_unit_runs_the_cuda_engine(model):
    inspect = load("inspect-%s.json" % model)
    assert inspect["security"]["exposure"] <= 4.0
    assert inspect["security"] == {"exposure": 1.8, "rating": "OK"}
    props = inspect["unit_props"]
    assert props["ActiveState"] == "active" and props["SubState"] == "running" and props["NRestarts"] == "0"
    assert props["User"] == "vllm" and props["DevicePolicy"] == "closed" and props["DeviceAllow"] == "char-nvidia* rw"
    assert props["NoNewPrivileges"] == "yes" and props["ProtectSystem"] == "strict" and props["CapabilityBoundingSet"] == ""
    assert props["LimitNOFILE"] == "20000"  # the VM's hard cap; 65536 would fail the unit with 205/LIMITS
    assert inspect["env_cuda_visible_devices"].startswith('CUDA_VISIBLE_DEVICES="0"')
    assert "600 root" in inspect["env_cuda_visible_devices"]
    procs = inspect["processes"]
    assert len(procs) == 3
    for proc in procs:  # API server, resource tracker, engine core: all as the kernel applied the sandbox
        assert proc["Uid"].split()[0] != "0"
        assert proc["NoNewPrivs"] == "1" and proc["CapBnd"] == "0000000000000000" and proc["CapEff"] == "0000000000000000"
        assert proc["Seccomp"] == "2" and int(proc["Seccomp_filters"]) >= 1
    engine = next(p for p in procs if p["cmdline"].startswith("VLLM::EngineCore"))
    assert engine["maps_libcuda"] is True
    assert engine["maps_nvidia_dev"] == ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"]
    requests = inspect["openai_requests"]
    assert requests["ok"] == 16 and requests["failed"] == 0 and requests["openai_version"] == "3.57.0"
    assert requests["models"] == ["gpuhost-llama1b-%s" % model]


@pytest.mark.parametrize("model", ["a", "b"])
def test_journal_shows_the_cuda_engine(model):
    journal = text("journal-%s.txt" % model)
    assert "Initializing a V1 LLM engine (v0.26.0)" in journal
    assert "device_config=cuda" in journal
    assert "[cuda.py:482] Using FLASH_ATTN attention backend" in journal or "Using FlashAttention version 3" in journal
    assert "GPU KV cache size: 1,715,168 tokens" in journal
    assert "Desired GPU memory utilization is (0.4, 55.92 GiB)" in journal
    assert "device_config=cpu" not in journal


def test_second_engine_started_beside_the_first_on_the_same_gpu():
    assert "Free memory on device (139.29/139.8 GiB) on startup" in text("journal-a.txt")
    assert "Free memory on device (82.61/139.8 GiB) on startup" in text("journal-b.txt")  # A held its 0.40 share
    two = load("nvml-two-engines.json")["gpus"][0]
    assert len(two["compute_processes"]) == 2
    for proc in two["compute_processes"]:
        assert proc["used_mib"] < 0.45 * two["memory_total_mib"]
    assert sum(p["used_mib"] for p in two["compute_processes"]) <= two["memory_used_mib"] <= two["memory_total_mib"]
    for name in ("serve-start-a.json", "serve-start-b.json", "serve-restart-a.json"):
        assert load(name)["gpu_ids"] == [0] and load(name)["state"] == "started"


def test_both_engines_served_the_openai_client_at_once_with_power():
    load_run = load("load-two-engines.json")
    models = load_run["models"]
    assert set(models) == {"gpuhost-llama1b-a", "gpuhost-llama1b-b"}
    assert all(m["failed"] == 0 and m["ok"] > 5000 for m in models.values())
    assert load_run["tokens"] == sum(m["tokens"] for m in models.values()) == 1395072
    assert load_run["tokens"] == 128 * sum(m["ok"] for m in models.values())  # ignore_eos: 128 tokens each
    assert load_run["j_per_token"] == pytest.approx(load_run["energy_j_counter"] / load_run["tokens"], abs=1e-4)
    assert load_run["tokens_per_s"] == pytest.approx(load_run["tokens"] / load_run["seconds"], rel=1e-3)
    assert 300 < load_run["power_w_mean"] < load_run["power_w_max"] <= 700


def test_stop_freed_the_gpu_before_the_start():
    stopped = load("nvml-between-stop-start.json")["gpus"][0]
    assert stopped["compute_processes"] == [] and stopped["memory_used_mib"] == 615  # the idle driver reservation
    after_stop = dict(line.split("=", 1) for line in text("unit-after-stop.txt").split())
    assert after_stop == {"MainPID": "0", "ExecMainStatus": "0", "ActiveState": "inactive"}
    restarted = load("nvml-after-restart.json")["gpus"][0]
    assert len(restarted["compute_processes"]) == 1 and restarted["memory_used_mib"] > 50000
    assert load("serve-stop-a.json")["state"] == "stopped"
    journal = text("journal-units.txt")
    assert "vllm-gpuhost-llama1b-a.service: Deactivated successfully." in journal
    assert "SIGKILL" not in journal and "Killing process" not in journal
    ready = re.findall(r"T(\d\d):(\d\d):(\d\d)\+0000 vm vllm-gpuhost-llama1b-a\[\d+\]: .*Application startup complete", journal)
    assert len(ready) == 2


NEGATIVE = {
    "ProtectSystem=strict": ("refused", "wrote"),
    "ProtectHome=true": ("hidden", "visible"),
    "PrivateTmp=true": ("private", "shared"),
    "NoNewPrivileges=true": ("NoNewPrivs:\t1", "NoNewPrivs:\t0"),
    "CapabilityBoundingSet=": ("CapBnd:\t0000000000000000", "CapBnd:\t000001fffeffffff"),
    "SystemCallFilter=~@mount...": ("refused", "mounted"),
    "RestrictAddressFamilies=": ("refused", "opened"),
}


@pytest.mark.parametrize("model", ["a", "b"])
def test_negative_controls(model):
    rows = {r["setting"]: r for r in load("inspect-%s.json" % model)["negative_controls"]}
    for setting, (with_, without) in NEGATIVE.items():
        assert (rows[setting]["with"], rows[setting]["without"], rows[setting]["enforced"]) == (with_, without, True)
    # Not shown on this host: the device policy is not enforced (the NVIDIA node and, under strict, /dev/null open
    # either way), and the namespace probe (unshare -U) was refused even without RestrictNamespaces=.
    for setting in ("DevicePolicy=closed (no DeviceAllow)", "DevicePolicy=strict (/dev/null)"):
        assert (rows[setting]["with"], rows[setting]["without"], rows[setting]["enforced"]) == ("opened", "opened", False)
    assert (rows["RestrictNamespaces=true"]["with"], rows["RestrictNamespaces=true"]["without"]) == ("refused", "refused")


def test_live_namespace_probe_of_this_run_is_not_evidence():
    """nsenter -m without -r landed outside the container's root (nspawn enters it by chroot): the recorded
    'wrote' and /root listing are from the wrong root. The tool now passes -r; this run's figures do not count."""
    live = load("inspect-a.json")["live_namespace"]
    assert live["write_venv"] == "wrote" and "No such file or directory" in live["write_cache_dir"]
    assert '"nsenter", "-t", mainpid, "-m", "-r"' in (REPO / "tools" / "device" / "gpuhost_inspect.py").read_text()


def test_security_report_of_the_live_unit():
    report = text("security-b.txt")
    assert "Overall exposure level for vllm-gpuhost-llama1b-b.service: 1.8 OK" in report
    assert "char-nvidia*:rw" in report
    unit = text("unit-b.txt")
    assert "After=nvidia-uvm-nodes.service" in unit and "Wants=nvidia-uvm-nodes.service" in unit
    assert "LimitNOFILE=20000" in unit and "DevicePolicy=closed" in unit


def test_models_written_on_the_gpu():
    log = text("model-weights.log")
    for repo in ("gpuhost-llama1b-a", "gpuhost-llama1b-b"):
        assert "/srv/models/%s" % repo in log
    assert log.count('"params": 1498482688') == 2


# --- Run 2 (fresh machine, 16:04-16:08 UTC): the fixed live-namespace probe and roles/benchmark with NVML power ---

def test_run2_repeated_boot_driver_and_install_on_a_fresh_machine():
    assert text("run2-boot.txt").startswith("is-system-running: running")
    assert load("run2-driver.json")["state"]["use_loaded"] is True
    play = text("run2-install-play.log")
    assert re.search(r"Install the pinned engine package with pip\] \*+\nchanged", play)
    assert "gpuhost_install.yml: 61 s" in play
    assert load("run2-serve-start-a.json")["time_to_ready_s"] == 87.64


def test_run2_live_unit_namespace():
    """Inside the live vLLM unit's own mount namespace and root (nsenter -m -r): the OS is read-only, the cache
    directory writable, /root empty."""
    inspect = load("run2-inspect-a.json")
    live = inspect["live_namespace"]
    assert live["write_venv"].startswith("touch: cannot touch '/opt/torch/.venv/.llmfleet-probe': Read-only file system")
    assert live["write_cache_dir"].startswith("wrote")
    assert live["list_root_home"].startswith("end")
    assert inspect["security"] == {"exposure": 1.8, "rating": "OK"}
    rows = {r["setting"]: r for r in inspect["negative_controls"]}
    assert (rows["RestrictNamespaces=true"]["with"], rows["RestrictNamespaces=true"]["without"]) == ("refused", "created")
    assert rows["RestrictNamespaces=true"]["enforced"] is True
    assert [r["setting"] for r in inspect["negative_controls"] if not r["enforced"]] == [
        "DevicePolicy=closed (no DeviceAllow)", "DevicePolicy=strict (/dev/null)"]


def test_run2_benchmark_role_with_power():
    record = load("run2-bench-record.json")
    assert record["model"] == "gpuhost-llama1b-a" and record["gpu_power"]["source"] == "nvml"
    levels = {level["concurrency"]: level for level in record["levels"]}
    assert sorted(levels) == [1, 16, 64, 256]
    for level in levels.values():
        assert level["failed"] == 0 and level["completed"] == level["requests"] and level["metrics_ratio"] == 1.0
        power = level["power"]
        assert power["joules_per_token"] == pytest.approx(power["joules"] / level["output_tokens"], rel=1e-3)
    assert levels[256]["power"]["joules_per_token"] == record["summary"]["min_joules_per_token"] == 0.018083
    assert round(levels[1]["output_tok_s"], 1) == 533.4 and round(levels[256]["output_tok_s"], 1) == 16046.5
    window = record["gpu_power"]["summary"]
    assert window["joules"] == pytest.approx(window["joules_counter"], rel=0.01)  # trapezoid vs NVML's counter
    report = text("run2-bench-report.md")
    assert "| 256 | 16046.5 |" in report and "0.018 J/token (best)" in report


# --- Run 3 (fresh machine, 16:12-16:18 UTC): no UVM nodes bound in; a reboot of the host creates them at boot ---

def test_run3_host_booted_without_uvm_nodes():
    boot = text("run3-boot.txt")
    assert "ls: cannot access '/dev/nvidia-uvm': No such file or directory" in boot
    assert "ls: cannot access '/dev/nvidia-uvm-tools': No such file or directory" in boot
    assert "torch" not in boot  # CUDA not tried before the unit exists
    assert load("run3-driver.json")["state"]["use_loaded"] is True
    assert load("run3-serve-start-a.json")["time_to_ready_s"] == 83.64


def _show(block):
    return dict(line.split("=", 1) for line in block.splitlines() if re.match(r"^[A-Za-z]+=", line))


def test_run3_uvm_unit_creates_the_nodes_at_boot_before_vllm_starts():
    reboot = text("run3-reboot.txt")
    assert reboot.startswith("boot -> /health: 52 s, status 200")
    assert "crw-rw-rw- 1 root root 238, 0 " in reboot and "crw-rw-rw- 1 root root 238, 1 " in reboot
    journal = reboot.split("--- journal of this boot\n", 1)[1].splitlines()
    created = [i for i, line in enumerate(journal) if "llmfleet-nvidia-uvm-nodes" in line and ": created (c 238:" in line]
    finished = next(i for i, line in enumerate(journal) if "Finished nvidia-uvm-nodes.service" in line)
    starting = next(i for i, line in enumerate(journal) if "Starting vllm-gpuhost-llama1b-a.service" in line)
    assert len(created) == 2 and max(created) < finished < starting
    mono = [float(re.match(r"\[\s*([0-9.]+)\]", journal[i]).group(1)) for i in (finished, starting)]
    assert mono[0] <= mono[1]
    head = reboot.split("--- critical-chain", 1)[0]
    uvm_exit = int(re.search(r"ExecMainExitTimestampMonotonic=(\d+)", head).group(1))
    vllm_start = int(re.search(r"ExecMainStartTimestampMonotonic=(\d+)", head).group(1))
    vllm_leave_inactive = int(re.search(r"InactiveExitTimestampMonotonic=(\d+)", head).group(1))
    assert uvm_exit < vllm_leave_inactive < vllm_start
    assert "UnitFileState=enabled" in head  # started by the boot, not by a playbook
    chain = reboot.split("--- critical-chain", 1)[1]
    assert re.search(r"vllm-gpuhost-llama1b-a\.service .*\n└─nvidia-uvm-nodes\.service @", chain)


def test_run3_cuda_on_the_nodes_the_unit_made():
    inspect = load("run3-inspect-a.json")
    assert inspect["unit_props"]["ExecMainStartTimestamp"] == "Fri 2026-12-04 16:17:31 UTC"
    assert inspect["security"]["exposure"] == 1.8
    engine = next(p for p in inspect["processes"] if p["cmdline"].startswith("VLLM::EngineCore"))
    assert engine["maps_nvidia_dev"] == ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"]
    assert inspect["openai_requests"]["ok"] == 16 and inspect["openai_requests"]["failed"] == 0
    assert inspect["live_namespace"]["write_venv"].startswith("touch: cannot touch '/opt/torch/.venv/.llmfleet-probe': Read-only")
