# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Host slots: naming rules, migration, GPU and port assignment (module_utils/host_slots), and the host_slots
module run the way Ansible runs it (a real process with its argument file) on a temporary state directory.

GPU facts come from the nvidia fixtures through module_utils/nvidia (no GPU here): the hand-written 8x RTX PRO 6000
PCIe-only host (two NUMA nodes of four GPUs; GPU 0 busy with 94210 MiB used) and the hand-written 4x NVLink host.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import host_slots as hs
from ansible_collections.llmfleet.vllm.plugins.module_utils import nvidia

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
FIX = os.path.join(REPO, "tests", "fixtures", "nvidia")
SHA1, SHA2 = "1" * 40, "2" * 40


def _fixture(name):
    with open(os.path.join(FIX, name)) as handle:
        return "".join(line for line in handle if not line.startswith("#"))


def _facts(query, topo):
    def run(args):
        if not args:
            return 0, _fixture("synthetic-8x-rtxpro6000-nvidia-smi.txt"), ""
        return 0, _fixture(topo if args[0] == "topo" else query), ""
    facts, _errors = nvidia.gather(smi_run=run, source="nvidia-smi")
    return facts


@pytest.fixture(scope="module")
def pcie8():
    return _facts("synthetic-8x-rtxpro6000-query-gpu.txt", "synthetic-8x-rtxpro6000-topo-m.txt")


@pytest.fixture(scope="module")
def nvlink4():
    facts = _facts("synthetic-8x-rtxpro6000-query-gpu.txt", "synthetic-4x-nvlink-topo-m.txt")
    gpus = [dict(g, memory_used_mib=0) for g in facts["gpus"][:4]]
    return dict(facts, gpu_count=4, gpus=gpus)


def _slot(gpu_ids, model="m", port=8000):
    return {"name": "x", "model": model, "gpu_ids": gpu_ids, "port": port}


# --- names, state, migration ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["default", "a", "minimax", "slot-2", "a" * 32])
def test_slot_names_allowed(name):
    assert hs.check_slot_name(name) == name


@pytest.mark.parametrize("name", ["", "A", "2a", "a_b", "a.b", "a/b", "a" * 33, None, 3])
def test_bad_slot_name_names_the_variable(name):
    with pytest.raises(hs.SlotError, match=r"^pivot_slot must be a slot name .* got "):
        hs.check_slot_name(name, "pivot_slot")


def test_legacy_current_json_becomes_the_default_slot():
    legacy = json.dumps({"model": "tiny-llama-b", "unit": "vllm-tiny-llama-b.service", "since": 17.5,
                         "previous": "tiny-llama-a"})
    slots, migrated = hs.load_state(None, legacy)
    assert migrated
    assert slots == {"default": {"name": "default", "model": "tiny-llama-b", "profile": "", "revision": None,
                                 "model_dir": None, "gpu_ids": None, "port": None, "unit": "vllm-tiny-llama-b.service",
                                 "since": 17.5, "previous": {"model": "tiny-llama-a"}}}
    # slots.json wins over a left-over current.json; nothing at all is no slot.
    assert hs.load_state(hs.dump_state({}), legacy) == ({}, False)
    assert hs.load_state(None, None) == ({}, False)


def test_broken_state_file_is_named():
    with pytest.raises(hs.SlotError, match="not JSON"):
        hs.load_state("{", None)
    with pytest.raises(hs.SlotError, match='no "slots" mapping'):
        hs.load_state('{"version": 1}', None)


def test_state_paths_have_one_default():
    assert hs.state_paths() == {"state_dir": "/var/lib/llmfleet", "state_file": "/var/lib/llmfleet/slots.json",
                                "legacy_state_file": "/var/lib/llmfleet/current.json",
                                "records_dir": "/var/lib/llmfleet/pivots"}
    assert hs.state_paths("/srv/state/")["state_file"] == "/srv/state/slots.json"


# --- model directories: one revision each ---------------------------------------------------------------------

def test_model_dir_holds_one_revision():
    # Nothing on disk, or the directory holds this commit: <model>.
    assert hs.model_dir_name("m", SHA1, {}) == "m"
    assert hs.model_dir_name("m", SHA1, {"m": SHA1}) == "m"
    # <model> holds another commit: never written with this one.
    assert hs.model_dir_name("m", SHA2, {"m": SHA1}) == "m--" + SHA2[:12]
    # ...and that directory is found again once it exists, even when <model> has gone.
    assert hs.model_dir_name("m", SHA2, {"m": None, "m--" + SHA2[:12]: SHA2}) == "m--" + SHA2[:12]
    # Unknown commit (check mode before the hub client exists): the model's name.
    assert hs.model_dir_name("m", None, {"m": SHA1}) == "m"


# --- GPUs ------------------------------------------------------------------------------------------------------

def test_tp4_on_the_8x_pcie_box_takes_one_numa_node_and_skips_the_busy_gpu(pcie8):
    # GPU 0 has 94210 of 97887 MiB used: GPUs 4-7 share a NUMA node (NODE), 1-3 + one more would cross it (SYS).
    assert hs.assign_gpus("a", 4, pcie8, {}) == [4, 5, 6, 7]


def test_second_slot_gets_the_gpus_no_other_slot_holds(pcie8):
    free = dict(pcie8, gpus=[dict(g, memory_used_mib=0) for g in pcie8["gpus"]])
    assert hs.assign_gpus("a", 4, free, {}) == [0, 1, 2, 3]
    slots = {"a": _slot([0, 1, 2, 3])}
    assert hs.assign_gpus("b", 4, free, slots) == [4, 5, 6, 7]
    # The slot being pivoted keeps its own GPUs (its model stops first), even while they show as used.
    busy_own = dict(free, gpus=[dict(g, memory_used_mib=90000 if g["index"] >= 4 else 0) for g in free["gpus"]])
    assert hs.assign_gpus("b", 4, busy_own, dict(slots, b=_slot([4, 5, 6, 7]))) == [4, 5, 6, 7]


def test_topology_preference_same_numa_node_over_lower_indexes(pcie8):
    free = dict(pcie8, gpus=[dict(g, memory_used_mib=0) for g in pcie8["gpus"]])
    # GPUs 0-2 held: {3, 4} would cross NUMA nodes (SYS); {4, 5} share one (NODE).
    assert hs.assign_gpus("b", 2, free, {"a": _slot([0, 1, 2])}) == [4, 5]


def test_nvlink_box_any_pair_is_linked(nvlink4):
    assert hs.assign_gpus("a", 2, nvlink4, {}) == [0, 1]
    assert hs.assign_gpus("b", 2, nvlink4, {"a": _slot([0, 1])}) == [2, 3]


def test_busy_gpus_refuse_with_the_reasons(pcie8):
    slots = {"a": _slot([4, 5, 6, 7])}
    with pytest.raises(hs.SlotError) as err:
        hs.assign_gpus("b", 4, pcie8, slots, variable="pivot_gpu_ids")
    text = str(err.value)
    assert "slot b needs 4 GPUs but only 3 are free" in text
    assert "GPU 0 is busy: 3677 MiB free, the model needs 88098 MiB" in text
    assert "GPU 4 is held by slot a" in text and "pivot_gpu_ids" in text


def test_explicit_gpu_ids_win_but_are_checked(pcie8):
    slots = {"a": _slot([4, 5, 6, 7])}
    assert hs.assign_gpus("b", 2, pcie8, slots, requested=[3, 2]) == [2, 3]
    for requested, message in [([4, 5], "GPU 4 is held by slot a"), ([0, 1], "GPU 0 is busy"),
                               ([1, 9], "GPU 9 is not on this host"), ([1], "names 1 GPUs; the model needs 2"),
                               ([1, 1], "distinct GPU indexes")]:
        with pytest.raises(hs.SlotError, match="pivot_gpu_ids") as err:
            hs.assign_gpus("b", 2, pcie8, slots, requested=requested, variable="pivot_gpu_ids")
        assert message in str(err.value)


def test_cpu_engine_uses_no_gpu_and_refuses_explicit_ones():
    assert hs.assign_gpus("a", 0, {}, {}) == []
    with pytest.raises(hs.SlotError, match="pivot_gpu_ids=.*CPU engine"):
        hs.assign_gpus("a", 0, {}, {}, requested=[0], variable="pivot_gpu_ids")


def test_host_with_too_few_gpus_does_not_fit(nvlink4):
    with pytest.raises(hs.SlotError, match="needs 8 GPUs .* this host has 4: it does not fit"):
        hs.assign_gpus("a", 8, nvlink4, {})
    with pytest.raises(hs.SlotError, match="has 0: it does not fit"):
        hs.assign_gpus("a", 8, {"gpu_count": 0, "gpus": []}, {})


def test_many_gpus_greedy_choice_stays_in_one_numa_node():
    matrix = {"GPU%d" % a: {"GPU%d" % b: ("NODE" if a // 8 == b // 8 else "SYS") for b in range(16) if b != a}
              for a in range(16)}
    facts = {"gpus": [{"index": i, "memory_total_mib": 1000, "memory_used_mib": 0} for i in range(16)],
             "topology": {"matrix": matrix}}
    assert hs.assign_gpus("b", 8, facts, {"a": _slot([0])}) == list(range(8, 16))


# --- ports -----------------------------------------------------------------------------------------------------

def test_ports_stable_per_slot_catalog_then_next_free():
    slots = {"a": _slot([], port=8001), "b": _slot([], port=8002)}
    assert hs.assign_port("b", slots, catalog_port=8009) == 8002  # stable across pivots of b
    assert hs.assign_port("c", slots, catalog_port=8009) == 8009  # a new slot: the model's catalog port
    assert hs.assign_port("c", slots, catalog_port=8001) == 8000  # taken: the lowest free from 8000
    assert hs.assign_port("c", dict(slots, d=_slot([], port=8000)), catalog_port=8001) == 8003
    assert hs.assign_port("c", slots, catalog_port=8009, reserved=[8009]) == 8000
    with pytest.raises(hs.SlotError, match="gateway_port 8002 is a port of slot b; pick another gateway_port"):
        hs.assign_port("b", slots, catalog_port=8009, reserved=[8002])


def test_explicit_port_clash_names_the_variable_and_the_slot():
    slots = {"a": _slot([], port=8001)}
    assert hs.assign_port("b", slots, 8001, requested="8005") == 8005
    with pytest.raises(hs.SlotError, match=r"pivot_port=8001 is already used by slot a"):
        hs.assign_port("b", slots, 8002, requested=8001, variable="pivot_port")
    with pytest.raises(hs.SlotError, match=r"pivot_port=9000 is already used by the gateway"):
        hs.assign_port("b", slots, 8002, requested=9000, reserved=[9000], variable="pivot_port")
    with pytest.raises(hs.SlotError, match=r"pivot_port must be a TCP port"):
        hs.assign_port("b", slots, 8002, requested="http", variable="pivot_port")


def test_a_model_serves_in_one_slot():
    slots = {"a": _slot([], model="tiny-llama-a")}
    hs.check_model_free("a", "tiny-llama-a", slots)
    with pytest.raises(hs.SlotError, match="tiny-llama-a already serves in slot a"):
        hs.check_model_free("b", "tiny-llama-a", slots)


# --- the module, as Ansible runs it ----------------------------------------------------------------------------

def _run_module(args, check=False, diff=False):
    payload = {"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check, _ansible_diff=diff)}
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, ".ansible", "collections"))
    proc = subprocess.run([sys.executable, "-m", "ansible_collections.llmfleet.vllm.plugins.modules.host_slots",
                           json.dumps(payload)], capture_output=True, text=True, check=False, env=env)
    return json.loads(proc.stdout)


def _write_manifest(root, name, commit):
    """The manifest model_fetch writes (module_utils/model_manifest), with the commit its files came from."""
    os.makedirs(os.path.join(root, name))
    with open(os.path.join(root, name, hs.MANIFEST_FILENAME), "w") as handle:
        json.dump({"revision": commit, "files": []}, handle)


def test_module_migrates_plans_and_records(tmp_path):
    state, models = tmp_path / "state", tmp_path / "models"
    state.mkdir()
    _write_manifest(str(models), "tiny-llama-a", SHA1)
    (state / "current.json").write_text(json.dumps({"model": "tiny-llama-a", "since": 1.0}))
    units = tmp_path / "units"
    units.mkdir()
    unit = "[Service]\nExecStart=/opt/vllm/bin/vllm serve /srv/models/tiny-llama-a --host 0.0.0.0 --port 8001 --max-model-len 256\n"
    (units / "vllm-tiny-llama-a.service").write_text(unit)
    common = {"state_dir": str(state), "models_root": str(models), "unit_dir": str(units)}

    # Check mode reports the migration and writes nothing.
    checked = _run_module(common, check=True)
    assert checked["migrated"] and checked["changed"] and not (state / "slots.json").exists()
    # The first real run writes slots.json (directory and commit from the manifest) and keeps current.json aside.
    first = _run_module(common)
    assert first["changed"] and first["slots"]["default"]["revision"] == SHA1
    assert first["slots"]["default"]["model_dir"] == str(models / "tiny-llama-a")
    assert first["slots"]["default"]["port"] == 8001 and first["slots"]["default"]["gpu_ids"] == []
    assert (state / "current.json.migrated").exists() and not (state / "current.json").exists()
    assert _run_module(common)["changed"] is False

    # The served commit of the model again: serving_same, same directory. main moved: a directory of its own.
    same = _run_module(dict(common, action="plan", model="tiny-llama-a", revision=SHA1, catalog_port=8009))
    assert same["serving_same"] and same["model_dir"] == str(models / "tiny-llama-a") and same["port"] == 8001
    moved = _run_module(dict(common, action="plan", model="tiny-llama-a", revision=SHA2, catalog_port=8009))
    assert not moved["serving_same"] and moved["model_dir"] == str(models / ("tiny-llama-a--" + SHA2[:12]))

    # A second slot: its own port; recording it shows the diff and leaves the default slot alone.
    plan_b = _run_module(dict(common, action="plan", slot="b", model="tiny-llama-b", revision=SHA1, catalog_port=8001))
    assert plan_b["port"] == 8000 and plan_b["unit"] == "vllm-tiny-llama-b.service" and plan_b["gpu_ids"] == []
    record = {"state_dir": str(state), "action": "set", "slot": "b", "model": "tiny-llama-b", "revision": SHA1,
              "model_dir": plan_b["model_dir"], "port": plan_b["port"], "since": 5.0}
    written = _run_module(record, diff=True)
    assert written["changed"] and '"b": {' in written["diff"]["after"] and '"b": {' not in written["diff"]["before"]
    assert written["slots"]["default"] == first["slots"]["default"]
    assert _run_module(dict(record, since=9.0))["changed"] is False  # the same model where it was: unchanged
    assert sorted(_run_module(common)["units"]) == ["vllm-tiny-llama-a.service", "vllm-tiny-llama-b.service"]

    # Refusals name the variable.
    taken = _run_module(dict(common, action="plan", slot="c", model="tiny-llama-c", port=8001, variable_prefix="pivot_"))
    assert taken["failed"] and "pivot_port=8001 is already used by slot default" in taken["msg"]
    twice = _run_module(dict(common, action="plan", slot="c", model="tiny-llama-b"))
    assert twice["failed"] and "tiny-llama-b already serves in slot b" in twice["msg"]
    bad = _run_module(dict(common, slot="B", variable_prefix="pivot_"))
    assert bad["failed"] and bad["msg"].startswith("pivot_slot must be a slot name")
    unresolved = _run_module(dict(common, action="plan", slot="c", model="x", revision="main", variable_prefix="pivot_"))
    assert unresolved["failed"] and "pivot_revision must be resolved to a 40-hex commit" in unresolved["msg"]

    # Removing a slot.
    assert _run_module({"state_dir": str(state), "action": "absent", "slot": "b"})["changed"]
    assert list(json.loads((state / "slots.json").read_text())["slots"]) == ["default"]


def test_blue_green_prefers_gpus_no_slot_holds_then_shares_its_own_when_the_memory_holds_both():
    # One H200 (143771 MiB) serving the slot's model at 0.40 (58,000 MiB used): a second engine at 0.40 fits beside.
    h200 = {"gpu_count": 1, "gpus": [{"index": 0, "memory_total_mib": 143771, "memory_used_mib": 58600}]}
    slots = {"a": _slot([0])}
    assert hs.assign_gpus("a", 1, h200, slots, memory_fraction=0.40, beside=True) == [0]
    assert hs.shared_gpus("a", slots, [0]) == [0]
    # At vLLM's default share (0.9) it does not: refused with the reason, so the pivot falls back to stop-then-start.
    with pytest.raises(hs.SlotError, match=r"GPU 0 is busy: 85171 MiB free, the model needs 129393 MiB \(0.9"):
        hs.assign_gpus("a", 1, h200, slots, beside=True)
    # Another slot's GPU is never shared, however much memory it has free.
    with pytest.raises(hs.SlotError, match="GPU 0 is held by slot a"):
        hs.assign_gpus("b", 1, h200, slots, memory_fraction=0.40, beside=True)
    # A whole free GPU wins over sharing.
    two = {"gpu_count": 2, "gpus": h200["gpus"] + [{"index": 1, "memory_total_mib": 143771, "memory_used_mib": 600}]}
    assert hs.assign_gpus("a", 1, two, slots, memory_fraction=0.40, beside=True) == [1]
    assert hs.shared_gpus("a", slots, [1]) == []
    # Named GPUs: the slot's own may be named for sharing, and are checked against their free memory.
    assert hs.assign_gpus("a", 1, h200, slots, requested=[0], memory_fraction=0.40, beside=True) == [0]
    with pytest.raises(hs.SlotError, match="pivot_gpu_ids=\\[0\\] cannot be used by slot a: GPU 0 is busy"):
        hs.assign_gpus("a", 1, h200, slots, requested=[0], memory_fraction=0.7, beside=True, variable="pivot_gpu_ids")


def test_gateway_sees_the_serving_port_as_active_until_the_switch():
    slots = {"default": dict(_slot([0], model="a", port=8000), name="default", alias="chat", standby_port=8001),
             "b": dict(_slot([1], model="b", port=8002), name="b")}
    # Blue/green: the plan gives the new model the standby port (8001); the gateway keeps 8000 active until the switch.
    view = hs.gateway_slots_before(slots, "default", "chat", "c", "blue_green", 8001, 8000)
    assert (view["default"]["port"], view["default"]["standby_port"], view["default"]["model"]) == (8000, 8001, "c")
    assert view["b"] == slots["b"] and slots["default"]["model"] == "a"  # the others as recorded; nothing changed
    # Stop-then-start: the new model takes the slot's port.
    view = hs.gateway_slots_before(slots, "default", "chat", "c", "stop_start", 8000, 8001)
    assert (view["default"]["port"], view["default"]["standby_port"]) == (8000, 8001)
    # A new slot appears with its alias.
    view = hs.gateway_slots_before(slots, "c", "other", "c", "new", 8003, 8004)
    assert view["c"] == {"name": "c", "alias": "other", "model": "c", "port": 8003, "standby_port": 8004}


def test_sleep_then_wake_through_the_module(tmp_path):
    """Rollback by wake (docs/pivot-safety.md): the plan puts the slot's model to sleep when asked to and its unit has
    sleep mode, records it asleep at the commit, wakes it on a pivot back, and refuses it to another slot."""
    state, models = tmp_path / "state", tmp_path / "models"
    state.mkdir()
    for name in ("a", "b", "c"):
        _write_manifest(str(models), name, SHA1)
    common = {"state_dir": str(state), "models_root": str(models)}
    gpu = {"gpu_count": 1, "gpus": [{"index": 0, "memory_total_mib": 143771, "memory_used_mib": 58600}]}
    a = {"action": "set", "model": "a", "revision": SHA1, "model_dir": str(models / "a"), "port": 8000,
         "standby_port": 8001, "gpu_ids": [0], "gateway": True, "alias": "chat", "sleep_mode": True, "since": 1.0}
    assert _run_module(dict(common, **a))["changed"]
    plan = dict(common, action="plan", model="b", revision=SHA1, catalog_port=8000, gpus_needed=1, gpu_facts=gpu,
                sleep_previous=True, blue_green=False, variable_prefix="pivot_")

    slept = _run_module(plan)
    assert (slept["strategy"], slept["port"], slept["standby_port"], slept["gpu_ids"]) == ("sleep", 8001, 8000, [0])
    assert slept["switch"] == "sleep"
    assert slept["sleeps_previous"] and not slept["stops_asleep"] and slept["contract"]["port"]["value"] == 8000
    assert slept["gateway_slots_before"]["default"]["port"] == 8000  # the gateway keeps the old port until the commit
    # Blue/green allowed but not fitting beside the old model (0.9 of the GPU): sleep, with the reason.
    crowded = _run_module(dict(plan, blue_green=True, gpu_memory_utilization=0.9))
    assert crowded["strategy"] == "sleep" and "does not fit beside" in crowded["strategy_reason"]
    # Not asked to, or a unit started without sleep mode: stop, then start (the reason says why).
    assert _run_module(dict(plan, sleep_previous=False))["strategy"] == "stop_start"
    assert _run_module(dict(common, **dict(a, sleep_mode=False)))["changed"]
    plain = _run_module(plan)
    assert plain["strategy"] == "stop_start" and "a was started without sleep mode" in plain["strategy_reason"]
    assert plain["switch"] == "stop_start"
    assert _run_module(dict(common, **a))["changed"]

    # The commit of b records a asleep on its port until keep_previous_s from now; a re-run of b keeps it.
    b = {"action": "set", "model": "b", "revision": SHA1, "model_dir": str(models / "b"), "port": 8001,
         "standby_port": 8000, "gpu_ids": [0], "gateway": True, "sleep_mode": True, "asleep": "previous",
         "keep_previous_s": 600}
    committed = _run_module(dict(common, **b))["slots"]["default"]
    asleep = committed["asleep"]
    assert (asleep["model"], asleep["unit"], asleep["port"], asleep["gpu_ids"], asleep["alias"]) == ("a", "vllm-a.service", 8000, [0], "chat")
    assert abs(asleep["until"] - asleep["since"] - 600) < 0.01 and committed["sleep_mode"] is True
    rerun = dict(common, action="set", model="b", revision=SHA1, model_dir=str(models / "b"), port=8001, standby_port=8000,
                 gpu_ids=[0], gateway=True)
    assert _run_module(rerun)["changed"] is False
    assert sorted(_run_module(common)["units"]) == ["vllm-a.service", "vllm-b.service"]

    # A pivot back to a, while it sleeps: a wake on its port; b sleeps in turn (its unit has sleep mode).
    back = dict(plan, model="a", asleep_alive=True)
    woken = _run_module(back)
    assert (woken["strategy"], woken["port"], woken["standby_port"], woken["gpu_ids"]) == ("wake", 8000, 8001, [0])
    assert woken["sleeps_previous"] and not woken["stops_asleep"]
    assert not _run_module(dict(back, sleep_previous=False))["sleeps_previous"]  # still a wake; b stops
    # a no longer sleeps (its timer stopped it): no wake; b sleeps, and the record's sleeper is stopped first.
    gone = _run_module(dict(back, asleep_alive=False))
    assert gone["strategy"] == "sleep" and gone["stops_asleep"] and gone["port"] == 8000
    # Another model: a, asleep, stops first; b sleeps.
    other = _run_module(dict(plan, model="c", asleep_alive=True))
    assert other["strategy"] == "sleep" and other["stops_asleep"] and other["asleep"]["model"] == "a"
    # A model asleep in one slot is refused to another (one unit per model).
    taken = _run_module(dict(common, action="plan", slot="x", model="a", revision=SHA1, catalog_port=8005))
    assert taken["failed"] and "a sleeps in slot default" in taken["msg"]

    # Once stopped, the slot forgets it.
    cleared = _run_module(dict(common, action="clear_asleep"))
    assert cleared["changed"] and "asleep" not in cleared["slots"]["default"]
    assert _run_module(dict(common, action="clear_asleep"))["changed"] is False


def test_asleep_paths_have_one_owner():
    paths = hs.asleep_paths("vllm-minimax-m25.service", "/var/lib/x/")
    assert paths == {"answers": "/var/lib/x/asleep/vllm-minimax-m25.answers.json", "timer": "llmfleet-asleep-vllm-minimax-m25",
                     "timer_unit": "llmfleet-asleep-vllm-minimax-m25.timer"}
    with pytest.raises(hs.SlotError, match="named by its systemd unit"):
        hs.asleep_paths("../x")


def test_fast_start_plans_the_models_other_unit_for_a_new_revision_and_records_it(tmp_path):
    """Issue #45: with fast start a stop-then-start to another revision of the served model arms the new one beside
    the old, so it takes the model's other unit; the turns alternate, and the intent and the record name that unit."""
    state, models = tmp_path / "state", tmp_path / "models"
    state.mkdir()
    _write_manifest(str(models), "tiny-llama-a", SHA1)
    common = {"state_dir": str(state), "models_root": str(models)}
    _run_module(dict(common, action="set", model="tiny-llama-a", revision=SHA1, model_dir=str(models / "tiny-llama-a"),
                     port=8001))
    new_revision = dict(common, action="plan", model="tiny-llama-a", revision=SHA2, catalog_port=8001)
    assert _run_module(new_revision)["unit"] == "vllm-tiny-llama-a.service"  # fast start off: the same unit, rewritten
    plan = _run_module(dict(new_revision, fast_start=True))
    assert plan["strategy"] == "stop_start" and plan["unit"] == "vllm-tiny-llama-a-alt.service"
    assert _run_module(dict(common, action="plan", model="tiny-llama-b", catalog_port=8001,
                            fast_start=True))["unit"] == "vllm-tiny-llama-b.service"  # another model: its own unit
    target = dict(common, model="tiny-llama-a", revision=SHA2, model_dir=plan["model_dir"], port=8001, unit=plan["unit"])
    intent = _run_module(dict(target, action="intend", strategy="stop_start"))["slots"]["default"]["pivot"]
    assert intent["to"]["unit"] == "vllm-tiny-llama-a-alt.service"
    assert intent["from"]["unit"] == "vllm-tiny-llama-a.service"
    assert _run_module(dict(target, action="set"))["slots"]["default"]["unit"] == "vllm-tiny-llama-a-alt.service"
    # Served from the other unit now: the same revision keeps it, the next revision takes the first unit again.
    assert _run_module(dict(new_revision, fast_start=True))["unit"] == "vllm-tiny-llama-a-alt.service"
    back = dict(common, action="plan", model="tiny-llama-a", revision=SHA1, catalog_port=8001, fast_start=True)
    assert _run_module(back)["unit"] == "vllm-tiny-llama-a.service"


def test_each_strategy_is_carried_out_by_one_switch():
    """roles/pivot/tasks/switch_<switch>.yml: a wake is the sleep switch's, a first model or a re-run of an unhealthy
    one is a start without a stop (stop_start)."""
    assert {s: hs.switch_of(s) for s in ("blue_green", "sleep", "wake", "stop_start", "new", "none")} == {
        "blue_green": "blue_green", "sleep": "sleep", "wake": "sleep", "stop_start": "stop_start", "new": "stop_start",
        "none": "stop_start"}
    roles_tasks = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "roles", "pivot", "tasks")
    for switch in set(hs.SWITCH_OF_STRATEGY.values()) | {"stop_start"}:
        assert os.path.isfile(os.path.join(roles_tasks, "switch_%s.yml" % switch)), switch
