"""Refusals in bulk (issue 41, item 4): many bad-input cases of playbooks/pivot.yml in one `ansible-playbook` run.

`-e` applies to a whole run and `set_fact` values outlive `meta: clear_facts`, so each case is a play of its own for
an inventory host of its own: an alias of the test machine, with the machine's inventory variables. The case's
variables are that play's variables, typed as `-e` gives them (`key=value` a string, a JSON document its types).
Every play is playbooks/pivot.yml's own play (its become, facts and variables, read from the file) with the role in a
block: Ansible ends a run at a play whose every host failed, so the rescue writes the refusal to a file on the
controller instead. The plays run one after another, each taking and giving back the host's pivot lock.
A few cases of each module stay on the real CLI (`-e`), so that the strings `-e` gives are still tested there.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIVOT_PLAYBOOK = os.path.join(REPO, "playbooks", "pivot.yml")


def cli_vars(extra: list[str]) -> dict:
    """The variables a list of `-e` arguments gives: ansible-playbook's own parser (load_extra_vars) reads them."""
    from ansible import context  # pylint: disable=import-outside-toplevel
    from ansible.module_utils.common.collections import ImmutableDict  # pylint: disable=import-outside-toplevel
    from ansible.parsing.dataloader import DataLoader  # pylint: disable=import-outside-toplevel
    from ansible.utils.vars import load_extra_vars  # pylint: disable=import-outside-toplevel

    assert all(flag == "-e" for flag in extra[::2]) and len(extra) % 2 == 0, extra
    saved, cached = context.CLIARGS, getattr(load_extra_vars, "extra_vars", None)
    context.CLIARGS = ImmutableDict(extra_vars=tuple(extra[1::2]))
    load_extra_vars.extra_vars = None  # it keeps its first answer for the process: a CLI parses once
    try:
        values = load_extra_vars(DataLoader())
    finally:
        context.CLIARGS, load_extra_vars.extra_vars = saved, cached
    return json.loads(json.dumps(dict(values)))  # plain types, for the playbook file


# The failed task's message, and each failed item's (a loop fails with "One or more items failed").
FAILURE_TEXT = ("{{ ([ansible_failed_result.msg | default('')] + (ansible_failed_result.results | default([])"
                " | selectattr('failed', 'defined') | selectattr('failed') | map(attribute='msg', default='') | list))"
                " | join('\\n') }}")


def _plays(aliases: list[str], cases: list[dict], outdir: pathlib.Path) -> list[dict]:
    with open(PIVOT_PLAYBOOK, encoding="utf-8") as handle:
        playbook = yaml.safe_load(handle)
    # What is copied: a play that gained tasks, handlers or role parameters would need them here too.
    template = playbook[0]
    assert len(playbook) == 1 and set(template) == {"name", "hosts", "become", "gather_subset", "vars", "roles"}, template
    assert len(template["roles"]) == 1 and set(template["roles"][0]) == {"role"}, template["roles"]
    role = template["roles"][0]["role"]
    plays = []
    for alias, case_vars in zip(aliases, cases):
        play = {key: value for key, value in template.items() if key not in ("hosts", "roles", "name")}
        play.update(name="Refusal case %s" % alias, hosts=alias, vars=dict(template.get("vars") or {}, **case_vars))
        report = {"delegate_to": "localhost", "become": False}
        play["tasks"] = [{"block": [
            {"name": "Pivot", "ansible.builtin.include_role": {"name": role}},
            dict(report, name="Note a case that was not refused",
                 **{"ansible.builtin.copy": {"content": "ACCEPTED", "dest": str(outdir / alias)}}),
        ], "rescue": [
            dict(report, name="Note the refusal",
                 **{"ansible.builtin.copy": {"content": FAILURE_TEXT,
                                             "dest": str(outdir / alias)}}),
        ]}]
        plays.append(play)
    return plays


def run(inventory_dir: pathlib.Path, machine: str, common: list[str], cases: list[list[str]],
        workdir: pathlib.Path, alias_vars: dict | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Each case's `-e` arguments after the common ones, in one run; returns it and each case's refusal message.
    alias_vars: inventory variables of the aliases beside the machine's (e.g. where a refused run publishes the
    Prometheus targets of its inventory host, which would otherwise add the aliases to the test's Prometheus)."""
    with open(inventory_dir / "hosts.yml", encoding="utf-8") as handle:
        machine_vars = dict(yaml.safe_load(handle)["all"]["hosts"][machine], **(alias_vars or {}))
    aliases = ["%s-case%02d" % (machine, n) for n in range(len(cases))]
    inventory, outdir = workdir / "inventory", workdir / "refusals"
    inventory.mkdir(parents=True)
    outdir.mkdir()
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {a: dict(machine_vars) for a in aliases}}}))
    os.symlink(os.path.realpath(inventory_dir / "group_vars"), inventory / "group_vars")
    playbook = workdir / "refusals.yml"
    plays = _plays(aliases, [dict(cli_vars(common), **cli_vars(case)) for case in cases], outdir)
    playbook.write_text(yaml.safe_dump(plays, sort_keys=False))
    # Each task's time (ansible.posix's profile_tasks) in the run's log, beside the playbook: where a case's seconds go.
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks", PROFILE_TASKS_TASK_OUTPUT_LIMIT="40")
    result = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", str(inventory), str(playbook)],
                            capture_output=True, text=True, env=env, cwd=REPO, check=False)
    (workdir / "refusals.log").write_text(result.stdout + result.stderr)
    messages = [(outdir / a).read_text() if (outdir / a).exists() else "(no play ran for %s)" % a for a in aliases]
    return result, messages
