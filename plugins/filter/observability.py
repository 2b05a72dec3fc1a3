# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters for what Prometheus learns from a host's state (module_utils/observability.py owns the rules): a host's
file_sd targets, the name of its targets file, and the path of a slot's metrics at the gateway."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.module_utils import observability as _obs
from ansible_collections.llmfleet.vllm.plugins.module_utils.host_slots import SlotError, check_slot_name


def prometheus_targets(slots, host, address, gateway_metrics_port=None, node_exporter_port=None, engine_versions=None,
                       locks=None, extra_labels=None, gateway_tls=False):
    try:
        return _obs.target_groups(host, address, slots, gateway_metrics_port or None, node_exporter_port or None,
                                  engine_versions, locks, extra_labels, bool(gateway_tls))
    except _obs.ObservabilityError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def prometheus_targets_file(host):
    try:
        return _obs.targets_file_name(host)
    except _obs.ObservabilityError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def slot_metrics_path(slot):
    try:
        check_slot_name(slot)
    except SlotError as exc:
        raise AnsibleFilterError('slot_metrics_path: %s' % exc) from exc
    return _obs.SLOT_METRICS_PATH % slot


class FilterModule:
    def filters(self):
        return {'prometheus_targets': prometheus_targets, 'prometheus_targets_file': prometheus_targets_file,
                'slot_metrics_path': slot_metrics_path}
