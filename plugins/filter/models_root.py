# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over a models root (module_utils models_root owns the rules)."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.module_utils.models_root import serving_record_path as _serving_record_path


def serving_record_path(models_root, host, variant=None):
    try:
        return _serving_record_path(models_root, host, variant)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule:
    def filters(self):
        return {'serving_record_path': serving_record_path}
