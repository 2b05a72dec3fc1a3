# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over a slot's record (llmfleet.vllm.host_slots owns the rules)."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.module_utils.host_slots import SlotError, unit_name
from ansible_collections.llmfleet.vllm.plugins.module_utils.host_slots import asleep_paths as _asleep_paths
from ansible_collections.llmfleet.vllm.plugins.module_utils.host_slots import slot_gateway as _slot_gateway


def slot_gateway(record):
    return _slot_gateway(record)


def vllm_unit(model, variant=None):
    try:
        return unit_name(model, variant)
    except SlotError as exc:
        raise AnsibleFilterError('vllm_unit: %s' % exc)


def asleep_paths(unit, state_dir=None):
    try:
        return _asleep_paths(unit, state_dir)
    except SlotError as exc:
        raise AnsibleFilterError('asleep_paths: %s' % exc)


class FilterModule:
    def filters(self):
        return {'slot_gateway': slot_gateway, 'vllm_unit': vllm_unit, 'asleep_paths': asleep_paths}
