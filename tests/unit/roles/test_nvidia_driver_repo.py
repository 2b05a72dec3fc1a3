# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The nvidia_driver role's computed plan: CUDA repository URL, package names, apt pin, GPU/NVSwitch
detection and the version check.

NVIDIA's CUDA repository is not reachable from the test machines and they have no GPU, so these
values are checked here by rendering the role's real defaults/main.yml and vars/main.yml with
ansible's Templar against host facts (no mocks of the role: the same Jinja the role runs).
"""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.filter.nvidia_driver_plan import nvidia_driver_plan
from role_vars import render as render_vars
from role_vars import role_variables, trusted

ROLE_VARIABLES = role_variables("nvidia_driver")

DEBIAN12 = {"os_family": "Debian", "distribution": "Debian", "distribution_major_version": "12",
            "distribution_version": "12.11", "distribution_release": "bookworm", "architecture": "x86_64",
            "kernel": "6.1.0-37-amd64"}
DEBIAN13_ARM = dict(DEBIAN12, distribution_major_version="13", distribution_version="13.1",
                    distribution_release="trixie", architecture="aarch64", kernel="6.12.41+deb13-arm64")
UBUNTU2404 = {"os_family": "Debian", "distribution": "Ubuntu", "distribution_major_version": "24",
              "distribution_version": "24.04", "distribution_release": "noble", "architecture": "x86_64",
              "kernel": "6.8.0-60-generic"}
UBUNTU2204_ARM = dict(UBUNTU2404, distribution_major_version="22", distribution_version="22.04",
                      distribution_release="jammy", architecture="aarch64")
ROCKY9 = {"os_family": "RedHat", "distribution": "Rocky", "distribution_major_version": "9",
          "distribution_version": "9.5", "distribution_release": "Blue Onyx", "architecture": "x86_64",
          "kernel": "5.14.0-503.el9.x86_64"}

# PCI scan lines as tasks/detect.yml prints them: 8x RTX PRO 6000 Blackwell (0x2bb1, 3D controller) ...
RTX_PRO_6000_X8 = ["0000:%02x:00.0 0x030200 0x2bb1" % bus for bus in (0x17, 0x2a, 0x3d, 0x63, 0x9b, 0xab, 0xbd, 0xe3)]
# ... an HGX H100 with 8 GPUs (0x2330) and 4 NVSwitches (bridge class 0x068000) ...
HGX_H100 = ["0000:%02x:00.0 0x030200 0x2330" % bus for bus in range(0x18, 0x20)] + \
           ["0000:%02x:00.0 0x068000 0x22a3" % bus for bus in range(0x05, 0x09)]
# ... and an L40S (Ada, 0x26b9) with its audio function (0x040300), which is no GPU.
L40S = ["0000:41:00.0 0x030200 0x26b9", "0000:41:00.1 0x040300 0x22ba"]


def render(expr, facts=None, pci=(), **overrides):
    """expr rendered as the role would: its settings typed by the role's vars (Jinja, -e strings included), its plan
    by the filter nvidia_driver_plan on them (the filter is a collection plugin, which this Templar does not load)."""
    facts = DEBIAN12 if facts is None else facts
    variables = dict(ROLE_VARIABLES)
    variables.update(trusted(overrides))
    variables["ansible_facts"] = facts
    variables["nvidia_driver__pci_scan"] = {"stdout_lines": list(pci)}
    variables["nvidia_driver__plan"] = nvidia_driver_plan(
        facts, render_vars(variables, "nvidia_driver__settings"), list(pci), overrides.get("nvidia_driver__debian_open_version", ""),
        facts.get("llmfleet_gpu", {}), overrides.get("nvidia_driver__loaded_version", ""))
    return render_vars(variables, expr)


def test_the_role_hands_the_filter_the_plans_inputs():
    """The role's one call of the filter, as vars/main.yml spells it (what render() above does in Python)."""
    call = ROLE_VARIABLES["nvidia_driver__plan"]
    assert "llmfleet.vllm.nvidia_driver_plan(nvidia_driver__settings, nvidia_driver__pci_scan.stdout_lines" in call
    assert "nvidia_driver__debian_open_version | default('')" in call and "ansible_facts['llmfleet_gpu']" in call
    assert "nvidia_driver__loaded_version | default('')" in call
    with pytest.raises(AnsibleFilterError, match="settings lack branch"):
        nvidia_driver_plan(DEBIAN12, {"source": "cuda_repo"})


# --- cuda_repo: repository path and keyring ----------------------------------------------------

@pytest.mark.parametrize("facts, distro, arch", [
    (DEBIAN12, "debian12", "x86_64"),
    (DEBIAN13_ARM, "debian13", "sbsa"),
    (UBUNTU2404, "ubuntu2404", "x86_64"),
    (UBUNTU2204_ARM, "ubuntu2204", "sbsa"),
    (ROCKY9, "rhel9", "x86_64"),
])
def test_cuda_repo_url_from_facts(facts, distro, arch):
    url = "https://developer.download.nvidia.com/compute/cuda/repos/%s/%s/" % (distro, arch)
    assert render("nvidia_driver__plan.cuda_repo.distro", facts) == distro
    assert render("nvidia_driver__plan.cuda_repo.arch", facts) == arch
    assert render("nvidia_driver__plan.cuda_repo.url", facts) == url
    assert render("nvidia_driver__plan.cuda_repo.keyring_url", facts) == url + "cuda-keyring_1.1-1_all.deb"


def test_cuda_repo_overrides():
    url = render("nvidia_driver__plan.cuda_repo.keyring_url", UBUNTU2404,
                 nvidia_driver_cuda_repo_base_url="http://mirror.local/cuda/repos/",
                 nvidia_driver_cuda_repo_distro="ubuntu2204", nvidia_driver_cuda_keyring_version="1.1-2")
    assert url == "http://mirror.local/cuda/repos/ubuntu2204/x86_64/cuda-keyring_1.1-2_all.deb"


def test_unknown_arch_is_flagged():
    assert render("nvidia_driver__plan.cuda_repo.arch", dict(DEBIAN12, architecture="ppc64le")) == "unsupported"


def test_supported_list_covers_the_computed_distros():
    supported = render("nvidia_driver_cuda_repo_supported")
    for facts in (DEBIAN12, DEBIAN13_ARM, UBUNTU2404, UBUNTU2204_ARM):
        assert render("nvidia_driver__plan.cuda_repo.distro", facts) in supported


# --- packages ----------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, expected", [
    ({}, ["nvidia-open", "nvidia-persistenced", "linux-headers-6.1.0-37-amd64"]),
    ({"nvidia_driver_branch": "580"}, ["nvidia-open-580", "nvidia-persistenced", "linux-headers-6.1.0-37-amd64"]),
    ({"nvidia_driver_branch": "580", "nvidia_driver_open_kernel": False},
     ["cuda-drivers-580", "nvidia-persistenced", "linux-headers-6.1.0-37-amd64"]),
    ({"nvidia_driver_open_kernel": False, "nvidia_driver_persistence": False,
      "nvidia_driver_extra_packages": ["nvidia-container-toolkit"]},
     ["cuda-drivers", "linux-headers-6.1.0-37-amd64", "nvidia-container-toolkit"]),
])
def test_cuda_repo_packages(overrides, expected):
    assert render("nvidia_driver__plan.packages", DEBIAN12, nvidia_driver_source="cuda_repo", **overrides) == expected


def test_debian_distro_packages():
    assert render("nvidia_driver__plan.packages", DEBIAN12, nvidia_driver_source="distro",
                  nvidia_driver_kernel_headers_packages=[]) == \
        ["nvidia-open-kernel-dkms", "nvidia-driver", "nvidia-persistenced"]
    assert render("nvidia_driver__plan.packages[:2]", DEBIAN12, nvidia_driver_source="distro",
                  nvidia_driver_open_kernel=False) == ["nvidia-kernel-dkms", "nvidia-driver"]


@pytest.mark.parametrize("server, open_kernel, package", [
    (True, True, "nvidia-driver-580-server-open"),
    (False, True, "nvidia-driver-580-open"),
    (True, False, "nvidia-driver-580-server"),
    (False, False, "nvidia-driver-580"),
])
def test_ubuntu_distro_packages(server, open_kernel, package):
    packages = render("nvidia_driver__plan.packages", UBUNTU2404, nvidia_driver_source="distro", nvidia_driver_branch="580",
                      nvidia_driver_ubuntu_server_flavour=server, nvidia_driver_open_kernel=open_kernel)
    # nvidia-persistenced comes with Ubuntu's nvidia-compute-utils-<branch>, not as its own package
    assert packages == [package, "linux-headers-6.8.0-60-generic"]


def test_ubuntu_cuda_repo_still_installs_persistenced():
    assert "nvidia-persistenced" in render("nvidia_driver__plan.packages", UBUNTU2404, nvidia_driver_source="cuda_repo")


# --- apt pin and version check -----------------------------------------------------------------

def test_apt_pin():
    assert render("nvidia_driver__plan.apt_pin") == ""
    assert render("nvidia_driver__plan.apt_pin", nvidia_driver_branch="580") == "580.*"
    assert render("nvidia_driver__plan.apt_pin", nvidia_driver_branch="580", nvidia_driver_version="580.95.05") == "580.95.05-*"
    # Debian distro + open modules: the role found nvidia-open-kernel-dkms at this version
    assert render("nvidia_driver__plan.apt_pin", nvidia_driver_branch="535",
                  nvidia_driver__debian_open_version="535.261.03") == "535.261.03-*"


def test_apt_pin_packages_regex():
    import re
    pattern = re.compile(render("nvidia_driver__plan.apt_pin_packages").strip("/"))
    for name in ("nvidia-driver", "libgl1-nvidia-glvnd-glx", "firmware-nvidia-gsp", "libcuda1", "libnvidia-ml1",
                 "nvidia-open-580", "cuda-drivers-580", "xserver-xorg-video-nvidia", "libnvcuvid1"):
        assert pattern.search(name), name
    for name in ("cuda-toolkit-13-0", "xserver-xorg-video-nouveau", "libdrm2", "linux-headers-amd64"):
        assert not pattern.search(name), name


@pytest.mark.parametrize("pin_vars, loaded, ok", [
    ({}, "580.95.05", True),
    ({"nvidia_driver_branch": "580"}, "580.95.05", True),
    ({"nvidia_driver_branch": "580"}, "575.57.08", False),
    ({"nvidia_driver_branch": "58"}, "580.95.05", False),
    ({"nvidia_driver_branch": "580", "nvidia_driver_version": "580.95.05"}, "580.95.05", True),
    ({"nvidia_driver_branch": "580", "nvidia_driver_version": "580.95.05"}, "580.82.07", False),
    ({"nvidia_driver_version": "580.95"}, "580.95.05", True),
    ({"nvidia_driver_branch": "580"}, "", False),
])
def test_version_matches(pin_vars, loaded, ok):
    assert render("nvidia_driver__plan.version_matches | bool", nvidia_driver__loaded_version=loaded, **pin_vars) is ok


# --- GPU presence, Blackwell, NVSwitch / Fabric Manager ----------------------------------------

def test_no_gpu():
    assert render("nvidia_driver__plan.gpu_count | int", pci=[]) == 0
    assert render("nvidia_driver__plan.gpu_count | int", pci=["0000:41:00.1 0x040300 0x22ba"]) == 0


def test_gpus_from_proc_when_sysfs_hides_pci():
    assert render("nvidia_driver__plan.gpu_count | int", pci=["proc 0000:17:00.0", "proc 0000:2a:00.0"]) == 2


def test_rtx_pro_6000_box():
    assert render("nvidia_driver__plan.gpu_count | int", pci=RTX_PRO_6000_X8) == 8
    assert render("nvidia_driver__plan.blackwell_or_newer", pci=RTX_PRO_6000_X8) is True
    assert render("nvidia_driver__plan.nvswitch_count", pci=RTX_PRO_6000_X8) == 0
    assert render("nvidia_driver__plan.fabric_manager_enabled | bool", pci=RTX_PRO_6000_X8) is False


def test_ada_is_not_blackwell():
    assert render("nvidia_driver__plan.gpu_count | int", pci=L40S) == 1
    assert render("nvidia_driver__plan.blackwell_or_newer", pci=L40S) is False


def test_hgx_nvswitch_from_pci():
    assert render("nvidia_driver__plan.gpu_count | int", pci=HGX_H100) == 8
    assert render("nvidia_driver__plan.blackwell_or_newer", pci=HGX_H100) is False
    assert render("nvidia_driver__plan.fabric_manager_enabled | bool", pci=HGX_H100) is True
    assert render("nvidia_driver__plan.fabric_manager_enabled | bool", pci=HGX_H100, nvidia_driver_fabric_manager=False) is False
    assert render("nvidia_driver__plan.fabric_manager_enabled | bool", pci=RTX_PRO_6000_X8, nvidia_driver_fabric_manager=True) is True


def _gpu_facts(n, cell):
    matrix = {"GPU%d" % i: {"GPU%d" % j: cell for j in range(n) if j != i} for i in range(n)}
    return {"gpu_count": n, "topology": {"nvlink": cell.startswith("NV"), "matrix": matrix}}


@pytest.mark.parametrize("facts, expected", [
    (_gpu_facts(8, "NV18"), True),     # HGX: every GPU pair over NVSwitch
    (_gpu_facts(8, "NODE"), False),    # PCIe only (RTX PRO 6000)
    (_gpu_facts(2, "NV4"), False),     # an NVLink bridge pair needs no Fabric Manager
    ({}, False),                       # no GPU facts yet
])
def test_fabric_manager_auto_from_gpu_facts(facts, expected):
    host = dict(DEBIAN12, llmfleet_gpu=facts)
    assert render("nvidia_driver__plan.fabric_manager_enabled | bool", host, pci=[]) is expected


def test_fabric_manager_auto_mixed_matrix_is_not_nvswitch():
    facts = _gpu_facts(4, "NV12")
    facts["topology"]["matrix"]["GPU0"]["GPU3"] = "SYS"
    assert render("nvidia_driver__plan.fabric_manager_enabled | bool", dict(DEBIAN12, llmfleet_gpu=facts)) is False


@pytest.mark.parametrize("facts, overrides, expected", [
    (UBUNTU2404, {"nvidia_driver_source": "cuda_repo"}, ["nvidia-fabricmanager"]),
    (UBUNTU2404, {"nvidia_driver_source": "cuda_repo", "nvidia_driver_branch": "580"}, ["nvidia-fabricmanager"]),
    (UBUNTU2404, {"nvidia_driver_source": "cuda_repo", "nvidia_driver_branch": "570"}, ["nvidia-fabricmanager-570"]),
    (UBUNTU2404, {"nvidia_driver_source": "distro", "nvidia_driver_branch": "580"}, ["nvidia-fabricmanager-580"]),
    (DEBIAN12, {"nvidia_driver_source": "distro"}, []),
    (DEBIAN12, {"nvidia_driver_fabric_manager_packages": ["my-fm"]}, ["my-fm"]),
])
def test_fabric_manager_packages(facts, overrides, expected):
    assert render("nvidia_driver__plan.fabric_manager_packages", facts, **overrides) == expected
