# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ansible-playbook run this play is, as llmfleet.vllm.host_lock records its owner."""
from __future__ import annotations

DOCUMENTATION = r"""
name: controller_run
author:
  - llmfleet maintainers (@llmfleet)
short_description: The ansible-playbook run of this play (controller, boot, process id and start time)
description:
  - Returns the owner that C(llmfleet.vllm.host_lock) records for this run - the controller's host name and boot id,
    the process id of C(ansible-playbook) and the process's start time (a reused process id is another run).
  - The filter C(llmfleet.vllm.controller_run_alive) tells, on the same controller, whether such a run still lives.
  - Terms, when given, are the owner's scope (joined by a space and added to its id), e.g. the inventory host and the
    slot, so that one run reaching one machine as two inventory hosts holds two different owners.
options:
  _terms:
    description: The scope of the owner (optional).
    required: false
"""

EXAMPLES = r"""
- name: Take the host lock for this run
  llmfleet.vllm.host_lock:
    owner: "{{ lookup('llmfleet.vllm.controller_run', inventory_hostname, 'slot default') }}"
"""

RETURN = r"""
_raw:
  description: One dict - id, controller, boot_id, pid, started, and scope when terms were given.
  type: list
  elements: dict
"""

from ansible.plugins.lookup import LookupBase
from ansible_collections.llmfleet.vllm.plugins.module_utils.run_owner import this_run


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        scope = ' '.join(str(term) for term in terms) if terms else None
        return [this_run(scope=scope)]
