# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The nvidia_driver role's plan (module_utils/nvidia_driver_plan.py owns the rules)."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.module_utils import nvidia_driver_plan as _plan
from ansible_collections.llmfleet.vllm.plugins.module_utils.plain_data import plain

SETTINGS = ('source', 'branch', 'version', 'open_kernel', 'ubuntu_server_flavour', 'persistence', 'kernel_headers_packages',
            'extra_packages', 'fabric_manager', 'fabric_manager_packages', 'cuda_repo_base_url', 'cuda_repo_distro',
            'cuda_keyring_version')


def nvidia_driver_plan(facts, settings, scan_lines=None, debian_open_version='', gpu_facts=None, loaded_version=''):
    settings = plain(settings)
    missing = sorted(set(SETTINGS) - set(settings))
    if missing:
        raise AnsibleFilterError('nvidia_driver_plan: settings lack %s' % ', '.join(missing))
    return _plan.plan(plain(facts), settings, plain(scan_lines or []), str(debian_open_version or ''), plain(gpu_facts or {}),
                      str(loaded_version or ''))


class FilterModule:
    def filters(self):
        return {'nvidia_driver_plan': nvidia_driver_plan}
