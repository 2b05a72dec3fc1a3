# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over a pivot's timing (module_utils pivot_timing owns the rules)."""
from __future__ import annotations

from ansible_collections.llmfleet.vllm.plugins.module_utils.pivot_timing import downtime


def pivot_downtime(previous, strategy, old_stop=None, new_ready_monotonic_s=None, new_ready_at=None, old_stopped_at=None):
    return downtime(previous, strategy, old_stop, new_ready_monotonic_s, new_ready_at, old_stopped_at)


class FilterModule:
    def filters(self):
        return {'pivot_downtime': pivot_downtime}
