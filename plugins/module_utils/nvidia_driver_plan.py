# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The nvidia_driver role's plan: what the host's PCI scan shows, NVIDIA's CUDA repository for its OS, the packages,
the apt pin, the version check and Fabric Manager, from the host's facts and the role's settings.

Pure python: the role's filter nvidia_driver_plan passes the facts and settings in; tests call it the same way.
"""
from __future__ import annotations

import re

# PCI class 0x0300xx (VGA) and 0x0302xx (3D controller) are GPUs; 0x0680xx (bridge) are NVSwitches.
GPU_CLASS = re.compile(r'^\S+ 0x030[02]')
NVSWITCH_CLASS = re.compile(r'^\S+ 0x0680')
# Blackwell and newer (PCI device ids 0x2900 and up) only work with the open kernel modules.
FIRST_BLACKWELL_DEVICE = 0x2900
# NVIDIA publishes arm64 server (SBSA) packages under "sbsa".
CUDA_REPO_ARCH = {'x86_64': 'x86_64', 'aarch64': 'sbsa', 'arm64': 'sbsa'}
# Every package with "nvidia" in its name (libgl1-nvidia-glvnd-glx, firmware-nvidia-gsp...) plus the few without.
# Packages of other version schemes (nvidia-container-toolkit...) have no version the pin matches: unaffected.
APT_PIN_PACKAGES = '/(nvidia|^libcuda|^libnvcuvid|^libnvoptix|^libxnvctrl|^cuda-drivers)/'


def pci_inventory(scan_lines):
    """The GPUs and NVSwitches of tasks/detect.yml's scan: "<slot> <class> <device>" per NVIDIA PCI function and
    "proc <bus>" per GPU the loaded driver knows."""
    lines = [line for line in scan_lines if re.match(r'^[0-9a-fA-F]{4}:', line)]
    gpus = [line for line in lines if GPU_CLASS.match(line)]
    gpu_ids = [line.split()[-1] for line in gpus]
    return {
        'gpu_ids': gpu_ids,
        'gpu_count': max(len(gpus), len([line for line in scan_lines if line.startswith('proc ')])),
        'nvswitch_count': len([line for line in lines if NVSWITCH_CLASS.match(line)]),
        'blackwell_or_newer': any(int(device, 16) >= FIRST_BLACKWELL_DEVICE for device in gpu_ids),
    }


def os_id(facts):
    return 'rhel' if facts.get('os_family') == 'RedHat' else str(facts.get('distribution', '')).lower()


def cuda_repo(facts, base_url, distro='', keyring_version=''):
    """https://developer.download.nvidia.com/compute/cuda/repos/<distro>/<arch>/ and its cuda-keyring package."""
    host_os = os_id(facts)
    if not distro:
        distro = ('ubuntu' + str(facts.get('distribution_version', '')).replace('.', '') if host_os == 'ubuntu'
                  else host_os + str(facts.get('distribution_major_version', '')))
    arch = CUDA_REPO_ARCH.get(facts.get('architecture'), 'unsupported')
    url = '%s/%s/%s/' % (base_url.rstrip('/'), distro, arch)
    return {'distro': distro, 'arch': arch, 'url': url, 'keyring_url': '%scuda-keyring_%s_all.deb' % (url, keyring_version)}


def driver_packages(host_os, source, branch='', open_kernel=True, ubuntu_server_flavour=False):
    suffix = '-' + branch if branch else ''
    if source == 'cuda_repo':
        return ['nvidia-open' + suffix if open_kernel else 'cuda-drivers' + suffix]
    if host_os == 'debian':
        return ['nvidia-open-kernel-dkms' if open_kernel else 'nvidia-kernel-dkms', 'nvidia-driver']
    return ['nvidia-driver-%s%s%s' % (branch, '-server' if ubuntu_server_flavour else '', '-open' if open_kernel else '')]


def packages(host_os, source, branch='', open_kernel=True, ubuntu_server_flavour=False, persistence=True,
             kernel_headers_packages=(), extra_packages=()):
    # Ubuntu's driver packages depend on nvidia-compute-utils (which ships nvidia-persistenced).
    persistenced = ['nvidia-persistenced'] if persistence and (source == 'cuda_repo' or host_os != 'ubuntu') else []
    return (driver_packages(host_os, source, branch, open_kernel, ubuntu_server_flavour) + persistenced
            + list(kernel_headers_packages) + list(extra_packages))


def version_pin(version='', branch=''):
    return version or branch


def apt_pin(version='', branch='', debian_open_version=''):
    """An apt_preferences version glob: a version pins "580.95.05-*", Debian's open modules' version (distro mode, see
    tasks/source_distro.yml) "<it>-*", a branch "580.*"; "" is no pin."""
    if version:
        return version + '-*'
    if debian_open_version:
        return debian_open_version + '-*'
    return branch + '.*' if branch else ''


def version_matches(pin, loaded_version):
    """Whether the loaded driver is of the pinned branch or version ("" pins nothing)."""
    return not pin or (loaded_version + '.').startswith(pin + '.')


def nvlink_all_to_all(gpu_facts):
    """Four or more GPUs, each pair joined by NVLink: an NVSwitch system whose switches the PCI scan may not show."""
    topology = gpu_facts.get('topology') or {}
    links = [link for row in (topology.get('matrix') or {}).values() for link in row.values()]
    return (int(gpu_facts.get('gpu_count') or 0) >= 4 and bool(topology.get('nvlink'))
            and all(re.match(r'^NV[0-9]+\Z', str(link)) for link in links))


def fabric_manager_enabled(setting, nvswitch_count, gpu_facts):
    """setting 'auto' (NVSwitches on the PCI bus or NVLink all-to-all), else the setting as a boolean."""
    if setting == 'auto':
        return nvswitch_count > 0 or nvlink_all_to_all(gpu_facts)
    return setting is True


def fabric_manager_packages(host_os, source, branch='', explicit=()):
    if explicit:
        return list(explicit)
    if source == 'distro' and host_os == 'debian':
        return []
    if branch and (source == 'distro' or not branch.isdigit() or int(branch) < 580):
        return ['nvidia-fabricmanager-' + branch]
    return ['nvidia-fabricmanager']


def plan(facts, settings, scan_lines=(), debian_open_version='', gpu_facts=None, loaded_version=''):
    """Everything the role decides, from the facts, its settings (the role's variables without the nvidia_driver_
    prefix, typed), the PCI scan, Debian's open modules' version and the GPU facts once read."""
    host_os, branch, version = os_id(facts), settings['branch'], settings['version']
    pci = pci_inventory(scan_lines)
    pin = version_pin(version, branch)
    return dict(
        pci, os_id=host_os,
        cuda_repo=cuda_repo(facts, settings['cuda_repo_base_url'], settings['cuda_repo_distro'],
                            settings['cuda_keyring_version']),
        packages=packages(host_os, settings['source'], branch, settings['open_kernel'],
                          settings['ubuntu_server_flavour'], settings['persistence'],
                          settings['kernel_headers_packages'], settings['extra_packages']),
        version_pin=pin,
        apt_pin=apt_pin(version, branch, debian_open_version),
        apt_pin_packages=APT_PIN_PACKAGES,
        version_matches=version_matches(pin, loaded_version),
        fabric_manager_enabled=fabric_manager_enabled(settings['fabric_manager'], pci['nvswitch_count'], gpu_facts or {}),
        fabric_manager_packages=fabric_manager_packages(host_os, settings['source'], branch,
                                                        settings['fabric_manager_packages']),
    )
