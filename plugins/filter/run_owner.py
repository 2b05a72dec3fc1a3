# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Whether the run that holds a host lock still lives (filters run on the controller)."""
from __future__ import annotations

from ansible_collections.llmfleet.vllm.plugins.module_utils.run_owner import run_alive


def controller_run_alive(owner):
    return run_alive(owner)


class FilterModule:
    def filters(self):
        return {'controller_run_alive': controller_run_alive}
