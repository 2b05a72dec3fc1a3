# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the accepted-command-line cache of llmfleet.vllm.vllm_args_check keys on (the parse itself runs against the
real vLLM in tests/integration/test_catalog_argv.py)."""
from ansible_collections.llmfleet.vllm.plugins.modules import vllm_args_check


def test_port_and_address_values_do_not_change_the_key_anything_else_does():
    base = ["/srv/models/m", "--host", "127.0.0.1", "--port", "8001", "--max-model-len", "256"]
    keyed = vllm_args_check.key_commands({"m": base})
    assert keyed == {"m": ["/srv/models/m", "--host", "<--host>", "--port", "<--port>", "--max-model-len", "256"]}
    other_port = list(base)
    other_port[4] = "8002"
    other_host = list(base)
    other_host[2] = "0.0.0.0"
    assert vllm_args_check.key_commands({"m": other_port}) == keyed == vllm_args_check.key_commands({"m": other_host})
    # A flag's value elsewhere, the model path, a flag named like a port's value: all still part of the key.
    for changed in (base[:6] + ["512"], ["/srv/models/n"] + base[1:], base + ["--port-offset", "1"]):
        assert vllm_args_check.key_commands({"m": changed}) != keyed
    # Values of the blind flags only: "--port" as the last word has no value to hide.
    assert vllm_args_check.key_commands({"m": ["/m", "--port"]}) == {"m": ["/m", "--port"]}
