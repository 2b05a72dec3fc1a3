"""Each naming and path rule has one owner that the others call (issue #29): the rule's owner spells it, and a
path or name built anywhere else in the collection, its playbooks, tools or benches fails here, naming the file
and line. Tests may spell concrete names (vllm-tiny-llama-a.service): they check the owners from outside."""
from __future__ import annotations

import os
import re

import pytest
import yaml

from ansible_collections.llmfleet.vllm.plugins.module_utils import catalog, host_slots, models_root, results_paths

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCANNED = ("roles", "playbooks", "plugins", "tools", "bench")
SUFFIXES = (".py", ".yml", ".yaml", ".j2", ".sh")

# rule: (owner, patterns of the rule built by hand), from rule_owners.yml beside this file.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "rule_owners.yml"), encoding="utf-8") as _handle:
    RULES = {r["rule"]: (r["owner"], r["patterns"]) for r in yaml.safe_load(_handle)}


def _files():
    for top in SCANNED:
        for root, dirs, files in os.walk(os.path.join(REPO, top)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__",)]
            for name in files:
                if name.endswith(SUFFIXES):
                    path = os.path.join(root, name)
                    yield os.path.relpath(path, REPO), path


def _built_by_hand(patterns, text):
    return [number for number, line in enumerate(text.splitlines(), 1) if any(re.search(p, line) for p in patterns)]


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_rule_is_built_only_by_its_owner(rule):
    owner, patterns = RULES[rule]
    found = []
    for relative, path in _files():
        if relative == owner:
            continue
        with open(path, encoding="utf-8", errors="replace") as handle:
            found += ["%s:%d" % (relative, n) for n in _built_by_hand(patterns, handle.read())]
    assert found == [], "%s is built outside %s at: %s" % (rule, owner, ", ".join(found))


@pytest.mark.parametrize("rule, spelling", [
    # How these rules were spelt by hand before they had an owner (each one was in main).
    ("a host's pivot record <results>/<host>/pivots/<model>-latest.json",
     'dest: "{{ pivot_controller_results_dir }}/{{ inventory_hostname }}/pivots/{{ pivot_model }}-latest.json"'),
    ("a host's pivot record <results>/<host>/pivots/<model>-latest.json",
     'path: "{{ pivot_controller_results_dir }}/{{ inventory_hostname }}/pivots"'),
    ("a host's pivot record <results>/<host>/pivots/<model>-latest.json",
     'with open(os.path.join(results, host, "pivots", f"{model}-latest.json"), encoding="utf-8") as fh:'),
    ("a pivot's record on its host <UTC stamp of its end>-<model>[-rolled-back].json",
     """      {{ pivot__slots.records_dir }}/{{ '%Y%m%dT%H%M%SZ' | strftime(pivot__new_ready_at | float, utc=true) }}-{{ pivot_model }}.json"""),
    ("a pivot's record on its host <UTC stamp of its end>-<model>[-rolled-back].json",
     'dest: "{{ pivot__slots.records_dir }}/{{ now(utc=true).strftime(\'%Y%m%dT%H%M%SZ\') }}-{{ pivot_model }}-rolled-back.json"'),
    ("the GPUs a model needs, tensor x pipeline x data parallel size",
     "  {{ pivot__entry.serving.tensor_parallel_size * pivot__entry.serving.pipeline_parallel_size | default(1, true)"),
    ("the GPUs a model needs, tensor x pipeline x data parallel size",
     "    count = (serving.get('tensor_parallel_size') or 1) * (serving.get('pipeline_parallel_size') or 1)"),
    ("the GPUs a model needs, tensor x pipeline x data parallel size", "    result = {'gpus_needed': tp * pp * dp,"),
    ("the gateway's port, gateway_port or the gateway role's default (entry point `port`)",
     '    reserved_ports: "{{ [gateway_port | int] if pivot__gateway and gateway_port is defined else [] }}"'),
    ("the gateway's port, gateway_port or the gateway role's default (entry point `port`)",
     '          port: "{{ (gateway_port | default(8080)) if rollout__slots.gateway else rollout__dir_plan.port }}"'),
    ("the directory of a model pinned to a commit <model>--<commit12>",
     "    names = [p['model'], '%s--%s' % (p['model'], (revision or '')[:12])]"),
    ("the directory of a model pinned to a commit <model>--<commit12>",
     "model_dir: \"{{ pivot_models_root }}/{{ pivot_model ~ '--' ~ model_fetch_commit[:12] }}\""),
    ("the directory of a model pinned to a commit <model>--<commit12>", 'pinned = f"{model}--{commit[:12]}"'),
    ("a host's serving record in the models root <root>/.llmfleet/serving/<host>.json",
     '    dest: "{{ pivot_models_root }}/.llmfleet/serving/{{ inventory_hostname }}.json"'),
    ("a host's serving record in the models root <root>/.llmfleet/serving/<host>.json",
     '            dest: "{{ ray__models_root }}/.llmfleet/serving/{{ inventory_hostname }}.ray.json"'),
    ("a host's serving record in the models root <root>/.llmfleet/serving/<host>.json",
     "    path: \"{{ pivot_models_root }}/.llmfleet/serving\""),
    ("a host's serving record in the models root <root>/.llmfleet/serving/<host>.json",
     "    record = os.path.join(root, '.llmfleet', 'serving', host + '.json')"),
    ("a playbook run's slot and results folder when -e and the inventory say none",
     "        slot: \"{{ slot | default(pivot_slot | default(omit), true) }}\""),
    ("a playbook run's slot and results folder when -e and the inventory say none",
     "    rollout__results_dir: \"{{ pivot_controller_results_dir | default(lookup('llmfleet.vllm.results_dir')) }}\""),
    ("the unit that serves a model vllm-<model>.service", "service_deploy__unit: vllm-{{ service_deploy__name }}.service"),
    ("the unit that serves a model vllm-<model>.service", 'env: "{{ service_deploy_env_dir }}/vllm-{{ service_deploy__name }}.env"'),
    ("the unit that serves a model vllm-<model>.service", "    ray__serve_unit: vllm-{{ ray_model }}-ray.service"),
    ("the unit that serves a model vllm-<model>.service", "SyslogIdentifier=vllm-{{ service_deploy__name }}"),
    ("the unit that serves a model vllm-<model>.service", 'unit = "vllm-%s.service" % model'),
    ("the unit that serves a model vllm-<model>.service", "name: \"{{ 'vllm-' ~ model ~ '.service' }}\""),
])
def test_the_check_catches_a_rule_spelt_by_hand(rule, spelling):
    assert _built_by_hand(RULES[rule][1], spelling) == [1]


def test_the_owners_spell_the_rules():
    assert results_paths.pivot_record_path("results", "gpu1", "minimax-m25") == "results/gpu1/pivots/minimax-m25-latest.json"
    assert results_paths.pivot_records_dir("results", "gpu1") == "results/gpu1/pivots"
    assert results_paths.host_pivot_record_name("minimax-m25", 1796629242.38) == "20261207T074042Z-minimax-m25.json"
    assert results_paths.host_pivot_record_name("minimax-m25", "1796629242", True) == "20261207T074042Z-minimax-m25-rolled-back.json"
    for model, ended_at in (("org/model", 1.0), ("", 1.0), ("minimax-m25", None), ("minimax-m25", "soon")):
        with pytest.raises(ValueError):
            results_paths.host_pivot_record_name(model, ended_at)
    assert catalog.gpus_needed({"serving": {"tensor_parallel_size": 4, "pipeline_parallel_size": 2, "data_parallel_size": 2}}) == 16
    assert catalog.gpus_needed({"serving": {"tensor_parallel_size": 4, "pipeline_parallel_size": None}}, 2) == 2
    assert host_slots.unit_name("minimax-m25") == "vllm-minimax-m25.service"
    assert host_slots.model_dir_candidates("minimax-m25", "0123456789abcdef" * 2 + "01234567") == [
        "minimax-m25", "minimax-m25--0123456789ab"]
    assert host_slots.model_dir_candidates("minimax-m25", None) == ["minimax-m25"]
    assert host_slots.unit_name("minimax-m25", "ray") == "vllm-minimax-m25-ray.service"
    assert models_root.serving_record_path("/srv/models/", "gpu1") == "/srv/models/.llmfleet/serving/gpu1.json"
    assert models_root.serving_record_path("/srv/models", "gpu1", "ray") == "/srv/models/.llmfleet/serving/gpu1.ray.json"
    for host, variant in (("", None), ("../x", None), (".x", None), ("gpu1", "../x"), ("gpu1", "")):
        with pytest.raises(ValueError):
            models_root.serving_record_path("/srv/models", host, variant)
    for bad in ("", None, "org/model"):
        with pytest.raises(ValueError):
            results_paths.pivot_record_path("results", "gpu1", bad)
        with pytest.raises(host_slots.SlotError):
            host_slots.unit_name(bad)


def test_roles_read_no_private_variable_of_a_playbook():
    """A role's inputs are its declared variables: roles/pivot read rollout.yml's private rollout__before (issue #29);
    the rollout now passes pivot_storage_served."""
    found = []
    for relative, path in _files():
        if relative.startswith("roles/"):
            with open(path, encoding="utf-8", errors="replace") as handle:
                found += ["%s:%d" % (relative, n) for n in _built_by_hand([r"\brollout__\w+"], handle.read())]
    assert found == [], found


def _names_set_by_tasks(role):
    """(name, file) of every variable a role's task files register or set_fact."""
    import yaml
    found = []

    def walk(tasks, name):
        for task in tasks or []:
            if not isinstance(task, dict):
                continue
            for key in ("block", "rescue", "always"):
                walk(task.get(key), name)
            if isinstance(task.get("register"), str):
                found.append((task["register"], name))
            facts = task.get("ansible.builtin.set_fact")
            if isinstance(facts, dict):
                found.extend((fact, name) for fact in facts if fact != "cacheable")
    tasks_dir = os.path.join(REPO, "roles", role, "tasks")
    for name in sorted(os.listdir(tasks_dir)):
        with open(os.path.join(tasks_dir, name), encoding="utf-8") as handle:
            walk(yaml.safe_load(handle), name)
    return found


ROLES = sorted(d for d in os.listdir(os.path.join(REPO, "roles")) if not d.startswith("."))


@pytest.mark.parametrize("role", ROLES)
def test_one_private_convention_role__name(role):
    """A role's own variables are <role>__name (private) or <role>_name (declared input or documented output); the
    __<role>_name and _<role>_name styles are gone (issue #29)."""
    found = []
    for relative, path in _files():
        if relative.startswith("roles/"):
            with open(path, encoding="utf-8", errors="replace") as handle:
                found += ["%s:%d" % (relative, n)
                          for n in _built_by_hand([r"(?<![\w.])_{1,2}%s_[a-z]" % role], handle.read())]
    assert found == [], found
    assert [n for n, _f in _names_set_by_tasks(role) if not n.startswith(role + "_")] == []


@pytest.mark.parametrize("role", ROLES)
def test_every_output_of_a_role_is_declared_or_documented(role):
    """A public name a role sets (<role>_x, not <role>__x) is an input of its argument specs, a default, or an
    output its README names: what other roles and playbooks may read."""
    import yaml
    with open(os.path.join(REPO, "roles", role, "meta", "argument_specs.yml"), encoding="utf-8") as handle:
        specs = yaml.safe_load(handle)["argument_specs"]
    declared = {option for entry in specs.values() for option in (entry.get("options") or {})}
    with open(os.path.join(REPO, "roles", role, "README.md"), encoding="utf-8") as handle:
        readme = handle.read()
    undocumented = sorted({"%s (%s)" % (n, f) for n, f in _names_set_by_tasks(role)
                           if not n.startswith(role + "__") and n not in declared and "`%s`" % n not in readme})
    assert undocumented == [], undocumented


# --- one owner of a slot's state (issue #42): roles/slot alone writes the host's slots and lock and switches its gateway

SLOT_OWNER = "roles/slot/"
STATE_MODULES = ("llmfleet.vllm.host_slots", "llmfleet.vllm.host_lock")
# The gateway's entry points that change what it sends where: rendering it (main, configure), a server's state and a
# slot's window at the request hold (issue 44).
SWITCHING_ENTRIES = ("main", "configure", "server", "hold")
# A fleet gateway (rollout.yml) is no host's gateway: the fleet's own plays set it up directly (its servers, and the
# fleet's window at its request hold, gateway_hold_slot fleet).
FLEET_GATEWAY_VARS = ("gateway_fleet", "gateway_server_host")
FLEET_HOLD_SLOT = "fleet"
# Private names read across an owner, each with the reason (none left: parity_slot.yml fed the pivot's private
# pivot__parity_* names to an undeclared entry point until answer parity became a role, issue #42).
FOREIGN_PRIVATE_ALLOWED = {}


def _tasks(node):
    """Every task of a task file or playbook, blocks and plays opened."""
    for item in node if isinstance(node, list) else []:
        if not isinstance(item, dict):
            continue
        yield item
        for key in ("block", "rescue", "always", "tasks", "pre_tasks", "post_tasks", "handlers"):
            yield from _tasks(item.get(key))


def _yaml_files(*tops):
    for relative, path in _files():
        if relative.startswith(tops) and relative.endswith((".yml", ".yaml")) and "/meta/" not in relative:
            with open(path, encoding="utf-8") as handle:
                yield relative, yaml.safe_load(handle)


def _slot_state_writers(relative, document):
    """(file, what) of each task that calls a state module or switches a host's gateway outside the slot role."""
    if relative.startswith(SLOT_OWNER):
        return []
    found = []
    for task in _tasks(document):
        found += ["%s: %s" % (relative, module) for module in STATE_MODULES if module in task]
        for key in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
            include = task.get(key)
            if not isinstance(include, dict) or include.get("name") != "llmfleet.vllm.gateway":
                continue
            entry, task_vars = include.get("tasks_from", "main"), task.get("vars") or {}
            fleet = any(v in task_vars for v in FLEET_GATEWAY_VARS) or task_vars.get("gateway_hold_slot") == FLEET_HOLD_SLOT
            if entry in SWITCHING_ENTRIES and not fleet:
                found.append("%s: gateway %s (%s)" % (relative, entry, task.get("name")))
    return found


def test_only_the_slot_role_writes_a_hosts_slots_and_lock_and_switches_its_gateway():
    """Where is the slot record written, where is the gateway switched: in roles/slot, and nowhere else."""
    found = [line for relative, document in _yaml_files("roles/", "playbooks/") for line in _slot_state_writers(relative, document)]
    assert found == [], found
    # The check sees what it looks for: the slot role itself does all three.
    own = [line for relative, document in _yaml_files(SLOT_OWNER)
           for line in _slot_state_writers("elsewhere/" + relative, document)]
    assert {line.split(": ", 1)[1].split(" (")[0] for line in own} >= {
        "llmfleet.vllm.host_slots", "llmfleet.vllm.host_lock", "gateway configure", "gateway server", "gateway hold"}, own


def test_the_check_catches_a_state_write_or_a_gateway_switch_elsewhere():
    pivot = [{"name": "Commit", "block": [{"llmfleet.vllm.host_slots": {"action": "set"}}]},
             {"name": "Switch", "ansible.builtin.include_role": {"name": "llmfleet.vllm.gateway", "tasks_from": "server"},
              "vars": {"gateway_server_slot": "default"}},
             {"name": "Render", "ansible.builtin.include_role": {"name": "llmfleet.vllm.gateway"}}]
    assert len(_slot_state_writers("roles/pivot/tasks/commit.yml", pivot)) == 3
    fleet = [{"name": "Fleet", "ansible.builtin.include_role": {"name": "llmfleet.vllm.gateway", "tasks_from": "server"},
              "vars": {"gateway_server_host": "gpu1"}},
             {"name": "Port", "ansible.builtin.include_role": {"name": "llmfleet.vllm.gateway", "tasks_from": "port"}},
             {"name": "Hold", "ansible.builtin.include_role": {"name": "llmfleet.vllm.gateway", "tasks_from": "hold"},
              "vars": {"gateway_hold_slot": "fleet"}}]
    assert _slot_state_writers("playbooks/rollout.yml", fleet) == []
    slot_hold = [{"name": "Hold", "ansible.builtin.include_role": {"name": "llmfleet.vllm.gateway", "tasks_from": "hold"},
                  "vars": {"gateway_hold_slot": "default"}}]
    assert len(_slot_state_writers("playbooks/rollout.yml", slot_hold)) == 1


def _foreign_private_names(relative, text):
    """<role>__name of another role than the file's own (a playbook owns none)."""
    own = relative.split("/")[1] if relative.startswith("roles/") else None
    pattern = re.compile(r"\b(%s)__\w+" % "|".join(re.escape(role) for role in ROLES))
    return sorted({m.group(0) for m in pattern.finditer(text) if m.group(1) != own
                   and FOREIGN_PRIVATE_ALLOWED.get(relative) != m.group(1)})


def test_no_role_or_playbook_reads_another_roles_private_names():
    """A role's <role>__ names are its own: others read its declared inputs and documented outputs (the pivot read
    observability__publish, benchmark.yml registered benchmark__slots; the GPU runs of tools/device read
    service_deploy__unit_path and nvidia_driver__state; module and filter EXAMPLES showed pivot__entry). Only a role's
    own molecule scenario, its white-box test, may look at them (molecule/ is not scanned)."""
    found = []
    for relative, path in _files():
        with open(path, encoding="utf-8", errors="replace") as handle:
            found += ["%s: %s" % (relative, name) for name in _foreign_private_names(relative, handle.read())]
    assert found == [], found
    assert _foreign_private_names("roles/pivot/tasks/main.yml", "when: observability__publish | bool") == ["observability__publish"]
    assert _foreign_private_names("playbooks/benchmark.yml", "register: benchmark__slots") == ["benchmark__slots"]
    assert _foreign_private_names("roles/pivot/tasks/main.yml", "pivot__run and slot_host_slots") == []
