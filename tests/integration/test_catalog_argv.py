# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every catalog entry and profile, as the units render it, parsed by the real vLLM argument parser.

The command lines come from the collection's own filters (catalog_entry + vllm_serve_args, the code the
service_deploy unit template uses); llmfleet.vllm.vllm_args_check parses them on the vllm_server test host
with the vLLM of the test image (the CPU build carries the same `vllm serve` parser). A vLLM version bump that
removes or renames a flag, or a catalog typo, fails here, naming the entry, the flag and the vLLM version.
"""
from __future__ import annotations

import json
import os
import subprocess

from ansible_collections.llmfleet.vllm.plugins.filter import catalog as catalog_filter
from ansible_collections.llmfleet.vllm.plugins.filter import vllm_serve_args as args_filter

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def unit_commands(extra=None):
    """{entry[:profile]: the argv after `vllm serve`} for every catalog entry and each of its profiles."""
    commands = {}
    for name in catalog_filter.catalog_models(extra):
        for profile in [""] + sorted(catalog_filter.catalog_entry(name, extra)["profiles"]):
            entry = catalog_filter.catalog_entry(name, extra, profile)
            path = "/srv/models/" + name + ("/" + entry["gguf_file"] if entry["format"] == "gguf" else "")
            commands[name + (":" + profile if profile else "")] = (
                [path, "--host", "127.0.0.1", "--port", str(entry["port"])] + args_filter.vllm_serve_args(entry["serving"]))
    return commands


def check(inventory, host, commands, tmp_path):
    """Run llmfleet.vllm.vllm_args_check ad hoc on host, the vLLM venv's python as the vllm user; (rc, module result)."""
    args = tmp_path / "commands.json"
    args.write_text(json.dumps({"commands": commands}))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_CALLBACK_RESULT_FORMAT="json",
               ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible"), "-i", inventory, host,
                           "-e", "@%s" % args, "-m", "llmfleet.vllm.vllm_args_check",
                           "-a", '{"commands": "{{ commands }}", "python": "/opt/vllm/bin/python", "user": "vllm"}'],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=600, check=False)
    # The default callback prints "<host> | SUCCESS => {json}" (or FAILED!).
    return proc.returncode, json.loads(proc.stdout.split(" => ", 1)[1])


def test_every_entry_and_profile_parses_with_the_real_vllm(vllm_server, machine_inventory, tmp_path):
    # Plus the loader options no embedded entry sets (the GPU run's profiles, tools/device/gpuhost-vars.yml).
    commands = unit_commands({"tiny-llama-a": {"profiles": {"loader": {
        "load_format": "runai_streamer", "model_loader_extra_config": {"concurrency": 16}}}}})
    assert "--load-format" in commands["tiny-llama-a:loader"]
    catalog = catalog_filter.catalog_models()
    assert len(commands) > len(catalog)  # every entry, plus its profiles
    rc, result = check(machine_inventory, vllm_server.machine, commands, tmp_path)
    assert rc == 0, result.get("msg")
    assert set(result["commands_checked"]) == set(commands)
    assert all(r["ok"] for r in result["commands_checked"].values())
    assert result["vllm_version"].startswith("0.")
    # The tool-call and reasoning parser names of the catalog exist in this vLLM too.
    assert "hermes" in result["tool_call_parsers"] and result["reasoning_parsers"]
    # Accepted once by this installation: the same command lines are not parsed again; a changed one is.
    assert result["cached"] is False
    rc, again = check(machine_inventory, vllm_server.machine, commands, tmp_path)
    assert rc == 0 and again["cached"] is True and again["commands_checked"] == result["commands_checked"]
    first = sorted(commands)[0]
    rc, changed = check(machine_inventory, vllm_server.machine, {first: commands[first] + ["--max-num-seqs", "7"]}, tmp_path)
    assert rc == 0 and changed["cached"] is False
    # Another port or address is the same command line to the parser (a blue/green pivot's standby port): not parsed again.
    moved_argv = [{"127.0.0.1": "0.0.0.0"}.get(a, a) for a in commands[first]][:4] + ["9999"] + commands[first][5:]
    moved = {first: moved_argv + ["--max-num-seqs", "7"]}
    assert moved[first][3:5] == ["--port", "9999"] and moved[first][2] == "0.0.0.0"
    rc, elsewhere = check(machine_inventory, vllm_server.machine, moved, tmp_path)
    assert rc == 0 and elsewhere["cached"] is True


def test_misspelt_flag_and_unknown_parser_are_named_with_the_vllm_version(vllm_server, machine_inventory, tmp_path):
    extra = {"tiny-llama-a": {"profiles": {
        "typo": {"extra_args": ["--tensor-paralel-size", "2"]},
        "bad-parser": {"enable_auto_tool_choice": True, "tool_call_parser": "no_such_parser"}}}}
    commands = {k: v for k, v in unit_commands(extra).items() if k.startswith("tiny-llama-a:")}
    rc, result = check(machine_inventory, vllm_server.machine, commands, tmp_path)
    assert rc != 0
    version = result["vllm_version"]
    assert result["msg"].startswith("vLLM %s rejects the command line of " % version), result["msg"]
    checked = result["commands_checked"]
    assert "unrecognized arguments: --tensor-paralel-size" in checked["tiny-llama-a:typo"]["error"]
    assert "--tool-call-parser no_such_parser is not a parser of this vLLM" in checked["tiny-llama-a:bad-parser"]["error"]
    assert checked["tiny-llama-a:tools"]["ok"], checked  # the catalog's own tools profile is fine
