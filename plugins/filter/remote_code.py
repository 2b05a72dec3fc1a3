# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Remote code serves only a commit someone chose (module_utils/remote_code.py owns the rule)."""
from __future__ import annotations

from ansible_collections.llmfleet.vllm.plugins.module_utils import remote_code as _remote_code


def remote_code_refusal(entry, wanted, commit=None, accepted='', lock=None, caller='pivot'):
    return _remote_code.refusal(entry, wanted, commit, accepted or '', lock or None, caller)


def remote_code_acceptance(commit, accepted=''):
    return _remote_code.acceptance(commit, accepted)


class FilterModule:
    def filters(self):
        return {'remote_code_refusal': remote_code_refusal, 'remote_code_acceptance': remote_code_acceptance}
