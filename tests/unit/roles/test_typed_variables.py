# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Every boolean a user may pass must be cast where it is used.

`ansible-playbook -e pivot_gate=false` passes the *string* "false": a bare `when: pivot_gate` is then
true (or, in ansible-core 2.19, an error). This walks every task, vars file and template of the roles
and playbooks, takes every expression (when/that/until/... and each `{{ }}` / `{% %}`), and fails on a
documented boolean variable used without `| bool`. tests/integration/test_cli_typed_vars.py checks the
effect of such values through the real CLI.
"""
from __future__ import annotations

import pathlib
import re

import yaml

REPO = pathlib.Path(__file__).resolve().parents[3]
EXPRESSION_KEYS = {"when", "that", "until", "failed_when", "changed_when"}
# Play-level switches of playbooks/rollout.yml (documented in docs/rollout.md).
PLAYBOOK_BOOLEANS = {"rollout_canary", "rollout_prestage", "rollout_canary_rollback"}
# A nullable boolean handed whole to a module option that parses it (true/false strings, null for "not given"):
# llmfleet.vllm.host_slots' `gateway` and `hold` (module_utils/host_slots.as_bool, unit-tested in
# test_slot_contract.py), given directly or through the slot role's `slot_gateway` (read) and `slot_plan_request`
# (plan), handed over whole.
PARSED_BY_MODULE = re.compile(r"\A{{\s*pivot_(gateway|hold)(\s*\|\s*default\(none\))?\s*}}\Z")
MODULE_PARSED_KEYS = {"gateway", "slot_gateway", "hold"}
STRING_LITERAL = re.compile(r"'[^']*'|\"[^\"]*\"")
JINJA = re.compile(r"{{(.*?)}}|{%(.*?)%}", re.S)


def documented_booleans() -> set[str]:
    names = set(PLAYBOOK_BOOLEANS)
    for spec_file in REPO.glob("roles/*/meta/argument_specs.yml"):
        for entry in yaml.safe_load(spec_file.read_text())["argument_specs"].values():
            names |= {name for name, opt in (entry.get("options") or {}).items() if opt.get("type") == "bool"}
    return names


def expressions(node, key=None):
    """Yield every Jinja expression in a parsed YAML document."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from expressions(v, k)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item, key)
    elif isinstance(node, str):
        if key in MODULE_PARSED_KEYS and PARSED_BY_MODULE.match(node.strip()):
            return
        if key in EXPRESSION_KEYS and "{{" not in node:
            yield node
        yield from (a or b for a, b in JINJA.findall(node))


def uncast_uses(text: str, names: set[str]) -> list[str]:
    bare = STRING_LITERAL.sub("''", text)
    found = []
    for name in names:
        for m in re.finditer(r"(?<![\w.'])%s\b" % re.escape(name), bare):
            rest = bare[m.end():]
            if re.match(r"\s*(\|\s*default\([^()]*\)\s*)?\|\s*bool\b", rest) or re.match(r"\s*is\s+(not\s+)?defined", rest):
                continue
            found.append(name)
    return found


def sources():
    for pattern in ("roles/*/tasks/*.yml", "roles/*/vars/*.yml", "roles/*/handlers/*.yml", "playbooks/*.yml",
                    "playbooks/tasks/*.yml"):
        for path in sorted(REPO.glob(pattern)):
            yield path, expressions(yaml.safe_load(path.read_text()))
    for path in sorted(REPO.glob("roles/*/templates/*.j2")) + sorted(REPO.glob("playbooks/templates/*.j2")):
        yield path, (a or b for a, b in JINJA.findall(path.read_text()))


def test_the_scan_sees_expressions_and_catches_a_bare_boolean():
    names = {"pivot_gate"}
    assert uncast_uses("pivot_gate and not ansible_check_mode", names) == ["pivot_gate"]
    assert uncast_uses("'x' if pivot_gate else 'y'", names) == ["pivot_gate"]
    assert uncast_uses("pivot_gate | bool and x", names) == []
    assert uncast_uses("pivot_gate | default(true) | bool", names) == []
    assert uncast_uses("'pivot_gate is off'", names) == []
    assert list(expressions({"when": "a and b", "msg": "{{ c }} and {% if d %}"})) == ["a and b", " c ", " if d "]
    assert {"pivot_gate", "benchmark_gpu_power", "pivot_prune", "model_fetch_offline"} <= documented_booleans()


def test_every_documented_boolean_is_cast_where_it_is_used():
    names = documented_booleans()
    problems = []
    for path, exprs in sources():
        for expr in exprs:
            problems += ["%s: %s in `%s`" % (path.relative_to(REPO), name, " ".join(expr.split()))
                         for name in uncast_uses(expr, names)]
    assert not problems, "booleans used without `| bool` (a -e string 'false' is true):\n" + "\n".join(problems)
