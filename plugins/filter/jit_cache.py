# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters over a unit's JIT caches (module_utils jit_cache owns the rules)."""
from __future__ import annotations

from ansible_collections.llmfleet.vllm.plugins.module_utils.jit_cache import report, summary


def jit_cache_summary(jit):
    return summary(jit)


def jit_cache_report(verified, seeded=None, recorded=None, fault=None):
    return report(verified, seeded, recorded, fault)


class FilterModule:
    def filters(self):
        return {'jit_cache_summary': jit_cache_summary, 'jit_cache_report': jit_cache_report}
