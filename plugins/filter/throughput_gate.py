# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The canary gate's decision: is the new model's throughput below a share of the previous one's, beyond noise."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.module_utils import bench_stats


def throughput_gate(new_levels, previous_levels, min_ratio):
    try:
        ratio = float(min_ratio)
    except (TypeError, ValueError):
        raise AnsibleFilterError('throughput_gate: min_ratio must be a number, got %r' % (min_ratio,))
    if not isinstance(new_levels or [], list) or not isinstance(previous_levels or [], list):
        raise AnsibleFilterError('throughput_gate expects two lists of throughput_check levels')
    return bench_stats.ratio_gate(new_levels, previous_levels, ratio)


class FilterModule:
    def filters(self):
        return {'throughput_gate': throughput_gate}
