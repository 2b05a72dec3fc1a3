# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvidia_driver on a host whose driver is already loaded (issue 28): the detection script the role runs on the host
(roles/nvidia_driver/files/nvidia_driver_state.py), the UVM device node script its unit runs, the unit, and the
ordering the vLLM units take on it.

No GPU here: the detection runs against a directory laid out like a host's /proc, /sys, /dev and dpkg status, with
real files (and real character device nodes where the test may create them); the texts of /proc are those read on
the H200 machine (tests/fixtures/nvidia/h200-systemd-driver-unit.txt)."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]
ROLE = REPO / "roles" / "nvidia_driver"
FIXTURES = REPO / "tests" / "fixtures" / "nvidia"
SCRIPT = ROLE / "files" / "llmfleet-nvidia-uvm-nodes"

spec = importlib.util.spec_from_file_location("nvidia_driver_state", ROLE / "files" / "nvidia_driver_state.py")
state_mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(state_mod)

H200_VERSION = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \n"
                "GCC version:  gcc version 15.3.0 (GCC) \n")
PROPRIETARY_VERSION = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
H200_DEVICES = ("Character devices:\n  1 mem\n  4 tty\n195 nvidia\n195 nvidiactl\n238 nvidia-uvm\n239 nvidia-nvswitch\n"
                "240 nvidia-nvlink\n241 nvidia-caps\n242 nvidia-caps-imex-channels\n\nBlock devices:\n254 virtblk\n")
DPKG_PACKAGED = ("Package: bash\nStatus: install ok installed\n\n"
                 "Package: nvidia-open-kernel-dkms\nStatus: install ok installed\nVersion: 535.261.03-1\n\n"
                 "Package: nvidia-driver\nStatus: deinstall ok config-files\n")
IS_ROOT = os.geteuid() == 0


def host(tmp_path, version=H200_VERSION, devices=H200_DEVICES, modules=("nvidia", "nvidia_uvm"), loadable=True,
         dpkg="Package: bash\nStatus: install ok installed\n"):
    """A host root as files: /proc/driver/nvidia/version, /proc/devices, /sys/module/*, dpkg status."""
    root = tmp_path / "root"
    (root / "proc/driver/nvidia").mkdir(parents=True)
    if version is not None:
        (root / "proc/driver/nvidia/version").write_text(version)
    (root / "proc/devices").write_text(devices)
    for name in modules:
        (root / "sys/module" / name / "parameters").mkdir(parents=True)
        if loadable:
            (root / "sys/module" / name / "initstate").write_text("live\n")
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(dpkg)
    (root / "dev").mkdir()
    return root


def test_version_lines_of_both_module_flavours():
    assert state_mod.loaded_version(H200_VERSION) == "580.159.04"
    assert state_mod.loaded_version(PROPRIETARY_VERSION) == "535.104.05"
    assert state_mod.loaded_version("") == ""


def test_the_recorded_h200_proc_texts_parse():
    text = (FIXTURES / "h200-systemd-driver-unit.txt").read_text()
    version = text.split("--- /proc/driver/nvidia/version\n", 1)[1]
    assert state_mod.loaded_version(version) == "580.159.04"
    devices = "Character devices:\n" + re.search(r"--- /proc/devices nvidia\n((?:\d+ \S+\n)+)", text).group(1)
    assert state_mod.char_devices(devices)["nvidia-uvm"] == 238


def test_char_devices_ignores_block_devices():
    devices = state_mod.char_devices(H200_DEVICES + "250 nvidia-fake-block\n")
    assert devices == {"nvidia": 195, "nvidiactl": 195, "nvidia-uvm": 238, "nvidia-nvswitch": 239,
                       "nvidia-nvlink": 240, "nvidia-caps": 241, "nvidia-caps-imex-channels": 242}


def test_loaded_unpackaged_driver_is_left_alone(tmp_path):
    state = state_mod.read_state(str(host(tmp_path)), "auto", kernel="6.18.44")
    assert state["use_loaded"] is True
    assert state["loaded_version"] == "580.159.04"
    assert state["modules"] == {"nvidia": "module", "nvidia_uvm": "module", "nvidia_modeset": "absent"}
    assert state["reason"] == "driver 580.159.04 is loaded and not from a package: left alone"


def test_built_in_driver_is_left_alone(tmp_path):
    root = host(tmp_path, loadable=False)
    state = state_mod.read_state(str(root), "auto", kernel="6.18.44")
    assert state["use_loaded"] is True
    assert state["modules"]["nvidia"] == "builtin"
    assert "built into the kernel" in state["reason"]


def test_built_in_uvm_seen_through_modules_builtin_or_proc_devices(tmp_path):
    root = host(tmp_path, modules=("nvidia",), loadable=False)
    (root / "lib/modules/6.18.44").mkdir(parents=True)
    (root / "lib/modules/6.18.44/modules.builtin").write_text("kernel/drivers/video/nvidia-uvm.ko\n")
    assert state_mod.read_state(str(root), "auto", kernel="6.18.44")["modules"]["nvidia_uvm"] == "builtin"
    root2 = host(tmp_path / "2", modules=("nvidia",), loadable=False)
    assert state_mod.read_state(str(root2), "auto", kernel="6.18.44")["modules"]["nvidia_uvm"] == "builtin"


def test_packaged_driver_is_managed(tmp_path):
    state = state_mod.read_state(str(host(tmp_path, dpkg=DPKG_PACKAGED)), "auto", kernel="6.1.0")
    assert state["driver_packages"] == ["nvidia-open-kernel-dkms"]  # config-files only: not installed
    assert state["use_loaded"] is False
    assert "packaged (nvidia-open-kernel-dkms)" in state["reason"]


@pytest.mark.parametrize("name", ["nvidia-driver-580-server-open", "nvidia-open-580", "cuda-drivers-580",
                                  "linux-modules-nvidia-580-server-open-6.8.0-60-generic", "nvidia-dkms-580-open",
                                  "nvidia-kernel-open-dkms", "nvidia-driver"])
def test_kernel_module_packages_recognised(name):
    assert state_mod.driver_packages("Package: %s\nStatus: install ok installed\n" % name) == [name]


@pytest.mark.parametrize("name", ["nvidia-container-toolkit", "libnvidia-compute-580", "nvidia-persistenced",
                                  "nvidia-fabricmanager-580"])
def test_other_nvidia_packages_do_not_count(name):
    assert state_mod.driver_packages("Package: %s\nStatus: install ok installed\n" % name) == []


def test_use_loaded_true_and_false(tmp_path):
    root = str(host(tmp_path, dpkg=DPKG_PACKAGED))
    assert state_mod.read_state(root, "true", kernel="6.1.0")["use_loaded"] is True
    assert state_mod.read_state(str(host(tmp_path / "b")), "false", kernel="6.1.0")["use_loaded"] is False
    missing = state_mod.read_state(str(host(tmp_path / "c", version=None, devices="Character devices:\n")), "true")
    assert missing["use_loaded"] is False
    assert "no NVIDIA driver is loaded" in missing["reason"]


def test_no_driver_means_install(tmp_path):
    state = state_mod.read_state(str(host(tmp_path, version=None, modules=(), devices="Character devices:\n")), "auto")
    assert state["use_loaded"] is False
    assert state["uvm_nodes"] == {"nvidia-uvm": "missing", "nvidia-uvm-tools": "missing"}


def test_main_prints_json_and_refuses_a_bad_mode(tmp_path, capsys):
    root = str(host(tmp_path))
    assert state_mod.main(["x", "auto", root]) == 0
    assert '"use_loaded": true' in capsys.readouterr().out
    assert state_mod.main(["x", "maybe", root]) == 2


def _uvm(tmp_path, devices=H200_DEVICES):
    (tmp_path / "devices").write_text(devices)
    (tmp_path / "dev").mkdir(exist_ok=True)
    env = {"LLMFLEET_PROC_DEVICES": str(tmp_path / "devices"), "LLMFLEET_DEV_DIR": str(tmp_path / "dev"),
           "PATH": "/usr/bin:/bin"}  # no modprobe, no nvidia-modprobe: only the mknod path runs
    return subprocess.run(["sh", str(SCRIPT)], env=env, capture_output=True, text=True, check=False)


@pytest.mark.skipif(not IS_ROOT, reason="mknod needs root")
def test_uvm_script_creates_the_nodes_once(tmp_path):
    first = _uvm(tmp_path)
    assert first.returncode == 0, first.stderr
    assert "nvidia-uvm: created (c 238:0)" in first.stdout and "nvidia-uvm-tools: created (c 238:1)" in first.stdout
    st = os.stat(tmp_path / "dev" / "nvidia-uvm-tools")
    assert (os.major(st.st_rdev), os.minor(st.st_rdev), st.st_mode & 0o777) == (238, 1, 0o666)
    second = _uvm(tmp_path)
    assert second.returncode == 0 and second.stdout.count("present") == 2
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    os.link(tmp_path / "dev" / "nvidia-uvm", root / "dev" / "nvidia-uvm")
    assert state_mod.uvm_nodes(str(root), 238) == {"nvidia-uvm": "ok", "nvidia-uvm-tools": "missing"}
    assert state_mod.uvm_nodes(str(root), 239)["nvidia-uvm"] == "wrong"


@pytest.mark.skipif(not IS_ROOT, reason="mknod needs root")
def test_uvm_script_replaces_a_wrong_node(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia-uvm").write_text("not a device")
    result = _uvm(tmp_path)
    assert result.returncode == 0 and "nvidia-uvm: created" in result.stdout
    assert os.major(os.stat(tmp_path / "dev" / "nvidia-uvm").st_rdev) == 238


def test_uvm_script_fails_without_the_uvm_driver(tmp_path):
    result = _uvm(tmp_path, devices="Character devices:\n195 nvidia\n\nBlock devices:\n238 nvidia-uvm\n")
    assert result.returncode == 1
    assert "the NVIDIA UVM driver is not loaded" in result.stderr
    assert not (tmp_path / "dev" / "nvidia-uvm").exists()


def test_uvm_unit_template():
    text = (ROLE / "templates" / "nvidia-uvm-nodes.service.j2").read_text()
    for line in ("Type=oneshot", "RemainAfterExit=yes", "ExecStart={{ nvidia_driver_uvm_nodes_script }}",
                 "WantedBy=multi-user.target", "Before=multi-user.target", "ConditionPathExists=/proc/driver/nvidia/version"):
        assert line in text.splitlines()
    defaults = (ROLE / "defaults" / "main.yml").read_text()
    assert "nvidia_driver_use_loaded: auto" in defaults and "nvidia_driver_uvm_nodes: true" in defaults


@pytest.mark.parametrize("unit, cuda", [("vllm-kimi-k25-int4.service", True), ("vllm-glm5-nvfp4.service", True),
                                        ("vllm-minimax-m25.service", True), ("vllm-tiny-llama-a.service", False)])
def test_vllm_units_order_after_the_uvm_unit_only_for_cuda(unit, cuda):
    """The golden units (kept equal to the template by test_service_unit.py): cuda units start after the UVM unit."""
    lines = (REPO / "tests" / "golden" / unit).read_text().splitlines()
    unit_section = lines[:lines.index("[Service]")]
    assert ("After=nvidia-uvm-nodes.service" in unit_section) is cuda
    assert ("Wants=nvidia-uvm-nodes.service" in unit_section) is cuda
    assert "Requires=nvidia-uvm-nodes.service" not in lines
