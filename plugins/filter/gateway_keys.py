# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The gateway's map files of keys (llmfleet.vllm's module_utils gateway_keys owns their rules)."""
from __future__ import annotations

from ansible_collections.llmfleet.vllm.plugins.module_utils import gateway_keys


def gateway_map_keys(text):
    return gateway_keys.map_keys(text)


def gateway_bad_key_positions(keys):
    return gateway_keys.bad_key_positions(keys)


class FilterModule:
    def filters(self):
        return {'gateway_map_keys': gateway_map_keys, 'gateway_bad_key_positions': gateway_bad_key_positions}
