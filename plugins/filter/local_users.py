# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who else can log in on a host (llmfleet.vllm's module_utils local_users owns the rule)."""
from __future__ import annotations

from ansible_collections.llmfleet.vllm.plugins.module_utils import local_users


def local_login_users(passwd):
    return local_users.login_users(passwd)


class FilterModule:
    def filters(self):
        return {'local_login_users': local_login_users}
