"""module_utils/gateway_keys.py: the keys a gateway map file holds, and which given keys HAProxy could not hold."""
from __future__ import annotations

from ansible_collections.llmfleet.vllm.plugins.module_utils import gateway_keys


def test_a_map_gives_its_keys_in_order_without_comments_or_blank_lines():
    text = "# API keys (llmfleet.vllm.gateway)\nsk-one ok\n\n   \nsk-two ok\n# sk-not\n"
    assert gateway_keys.map_keys(text) == ["sk-one", "sk-two"]
    assert gateway_keys.map_keys("") == [] and gateway_keys.map_keys(None) == []


def test_a_map_an_older_release_wrote_gives_the_keys_not_bearer():
    assert gateway_keys.map_keys("# old\nBearer sk-one ok\nBearer sk-two ok\n") == ["sk-one", "sk-two"]


def test_bad_keys_are_named_by_position_only():
    keys = ["sk-fine", "sk bad", "", "a,b", "a#b", "caf\u00e9", 7, "tab\tkey", "ok!~"]
    assert gateway_keys.bad_key_positions(keys) == [2, 3, 4, 5, 6, 7, 8]
    assert gateway_keys.bad_key_positions(None) == [] and gateway_keys.bad_key_positions([]) == []


def test_every_key_written_is_read_back():
    keys = ["sk-" + chr(c) * 3 for c in range(0x21, 0x7f) if chr(c) not in ",#"]
    assert gateway_keys.bad_key_positions(keys) == []
    assert gateway_keys.map_keys("# keys\n" + "".join("%s ok\n" % k for k in keys)) == keys
