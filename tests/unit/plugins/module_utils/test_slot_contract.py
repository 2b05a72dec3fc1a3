# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a slot promises its clients across runs (gateway, alias, port), the pivot intent in the slot's record, the
host lock and the run that owns it: module_utils/host_slots and run_owner, and the host_slots and host_lock modules
run the way Ansible runs them (a real process with its argument file) on a temporary state directory."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import host_slots as hs
from ansible_collections.llmfleet.vllm.plugins.module_utils import run_owner

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
SHA1, SHA2 = "1" * 40, "2" * 40


def _run_module(name, args, check=False):
    payload = {"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check)}
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, ".ansible", "collections"))
    proc = subprocess.run([sys.executable, "-m", "ansible_collections.llmfleet.vllm.plugins.modules." + name,
                           json.dumps(payload)], capture_output=True, text=True, check=False, env=env)
    return json.loads(proc.stdout)


SERVING = {"name": "default", "model": "tiny-llama-a", "port": 8501, "standby_port": 8502, "alias": "chat",
           "unit": "vllm-tiny-llama-a.service"}


@pytest.mark.parametrize("requested, expected", [
    (None, (True, "kept")), ("", (True, "kept")), ("false", (False, "given")), (True, (True, "given")),
    ("yes", (True, "given")), ("0", (False, "given"))])
def test_gateway_not_given_is_kept_turned_off_is_not(requested, expected):
    assert hs.resolve_gateway(SERVING, requested) == expected


def test_gateway_of_a_new_slot_and_of_an_older_release_record():
    assert hs.resolve_gateway(None) == (False, "default")
    assert hs.resolve_gateway({"name": "x", "pivot": {}}) == (False, "default")
    # An older release recorded no `gateway`; a standby port existed only behind one.
    assert hs.slot_gateway({"model": "m", "standby_port": None}) is False
    assert hs.slot_gateway(dict(SERVING, gateway=False)) is False
    with pytest.raises(hs.SlotError, match=r"pivot_gateway must be true or false .* got \"maybe\""):
        hs.resolve_gateway(SERVING, "maybe", "pivot_gateway")


def test_contract_says_what_was_given_and_what_was_kept():
    contract = hs.contract(SERVING, True, "kept", "chat", None, 8501, None, True, "kept")
    assert contract == {"gateway": {"value": True, "source": "kept"}, "alias": {"value": "chat", "source": "kept"},
                        "port": {"value": 8501, "source": "kept"}, "hold": {"value": True, "source": "kept"}}
    assert hs.contract(SERVING, True, "kept", "bot", "bot", 8501, None)["alias"]["source"] == "given"
    assert hs.contract(None, False, "default", "default", None, 8000, None)["port"]["source"] == "default"


def test_holding_is_kept_as_the_slot_recorded_it_and_on_for_a_new_slot():
    """Issue 44 item 2: the gateway's hold is part of what the slot promises, like its alias."""
    assert hs.resolve_hold(None) == (True, "default") and hs.resolve_hold({"name": "x", "pivot": {}}) == (True, "default")
    assert hs.resolve_hold(SERVING) == (True, "kept")  # a record without the key: an older release's, or one that holds
    assert hs.resolve_hold(dict(SERVING, hold=False)) == (False, "kept")
    assert hs.resolve_hold(dict(SERVING, hold=False), "true") == (True, "given")
    assert hs.resolve_hold(SERVING, "false") == (False, "given") and hs.resolve_hold(SERVING, "") == (True, "kept")
    with pytest.raises(hs.SlotError, match=r"pivot_hold must be true or false .* got \"sometimes\""):
        hs.resolve_hold(SERVING, "sometimes", "pivot_hold")


def test_module_records_holding_off_and_later_runs_keep_it(tmp_path):
    state = str(tmp_path)
    common = {"state_dir": state, "slot": "default"}
    set_a = dict(common, action="set", model="tiny-llama-a", revision=SHA1, model_dir="/srv/models/tiny-llama-a",
                 port=8501, standby_port=8502, alias="chat", gateway=True, since=1.0)
    assert "hold" not in _run_module("host_slots", set_a)["slots"]["default"]  # the default is not written
    off = _run_module("host_slots", dict(set_a, hold="false"))
    assert off["changed"] and off["slots"]["default"]["hold"] is False
    plan = _run_module("host_slots", dict(common, action="plan", model="tiny-llama-b", models_root="/srv/models",
                                          variable_prefix="pivot_"))
    assert plan["contract"]["hold"] == {"value": False, "source": "kept"}, plan
    # A later record without the setting (a heal, a rollout's step) keeps it; given on again, the key goes.
    assert _run_module("host_slots", dict(set_a, since=2.0))["slots"]["default"]["hold"] is False
    assert "hold" not in _run_module("host_slots", dict(set_a, hold=True))["slots"]["default"]


def test_a_serving_slot_keeps_its_port_and_a_new_slot_takes_the_requested_one():
    slots = {"default": SERVING}
    assert hs.assign_port("default", slots, 8501, requested=8501) == 8501
    with pytest.raises(hs.SlotError, match=r"pivot_port=8505: slot default serves tiny-llama-a on port 8501, and a serving"
                                           r" slot keeps its port .*\(-e slot=NAME -e pivot_port=8505\). Nothing was changed"):
        hs.assign_port("default", slots, 8501, requested="8505", variable="pivot_port")
    assert hs.assign_port("second", slots, 8501, requested="8505") == 8505


def test_intent_names_where_the_slot_comes_from_and_goes():
    intent = hs.intent_record(dict(SERVING, pivot={"phase": "switching"}), {"model": "tiny-llama-b", "port": 8502},
                              "blue_green", owner={"id": "c:1"}, now=5.0)
    assert intent["phase"] == hs.INTENT_SWITCHING and intent["to"]["unit"] == "vllm-tiny-llama-b.service"
    assert intent["from"] == SERVING and "pivot" not in intent["from"]
    assert hs.intent_record({"name": "new"}, {"model": "m", "port": 1}, "new")["from"] is None
    assert hs.intent_of({"pivot": {"phase": "other"}}) is None and hs.intent_of(None) is None


def test_module_intent_commit_and_clear(tmp_path):
    state = str(tmp_path)
    common = {"state_dir": state, "slot": "default"}
    set_a = dict(common, action="set", model="tiny-llama-a", revision=SHA1, model_dir="/srv/models/tiny-llama-a",
                 port=8501, standby_port=8502, alias="chat", gateway=True, since=1.0)
    assert _run_module("host_slots", set_a)["changed"]
    # A later run without the flag keeps the slot behind its gateway, and says so.
    read = _run_module("host_slots", common)
    assert (read["gateway"], read["gateway_source"], read["intent"]) == (True, "kept", None)

    intend = dict(common, action="intend", model="tiny-llama-b", revision=SHA2, model_dir="/srv/models/tiny-llama-b",
                  port=8502, standby_port=8501, alias="chat", strategy="blue_green", owner={"id": "ctl:1"})
    assert _run_module("host_slots", intend, check=True)["changed"]
    assert _run_module("host_slots", common)["intent"] is None  # check mode wrote nothing
    _run_module("host_slots", intend)
    intent = _run_module("host_slots", common)["intent"]
    assert intent["phase"] == "switching" and intent["from"]["model"] == "tiny-llama-a" and intent["to"]["port"] == 8502
    assert intent["to"]["gateway"] is True and intent["owner"] == {"id": "ctl:1"}

    # The commit: the record names b; the intent stays, committed, until the old model is gone.
    commit = dict(set_a, model="tiny-llama-b", revision=SHA2, model_dir="/srv/models/tiny-llama-b", port=8502,
                  standby_port=8501, commit_intent=True, since=2.0)
    slots = _run_module("host_slots", commit)["slots"]
    assert slots["default"]["model"] == "tiny-llama-b" and slots["default"]["pivot"]["phase"] == "committed"
    assert slots["default"]["pivot"]["from"]["model"] == "tiny-llama-a"
    cleared = _run_module("host_slots", dict(common, action="clear_intent"))
    assert cleared["changed"] and "pivot" not in cleared["slots"]["default"]
    assert cleared["slots"]["default"]["model"] == "tiny-llama-b"
    assert not _run_module("host_slots", dict(common, action="clear_intent"))["changed"]

    # A new slot's first pivot that never committed leaves no slot behind once its intent goes.
    _run_module("host_slots", dict(intend, slot="b", model="tiny-llama-c", port=8600, strategy="new"))
    assert _run_module("host_slots", dict(common, slot="b"))["intent"]["from"] is None
    assert "b" not in _run_module("host_slots", dict(common, slot="b", action="clear_intent"))["slots"]


def test_module_refuses_a_port_change_of_a_serving_slot(tmp_path):
    state = str(tmp_path)
    _run_module("host_slots", {"state_dir": state, "action": "set", "model": "tiny-llama-a",
                               "model_dir": "/srv/models/tiny-llama-a", "port": 8501})
    plan = _run_module("host_slots", {"state_dir": state, "action": "plan", "model": "tiny-llama-b",
                                      "models_root": "/srv/models", "port": 8505, "variable_prefix": "pivot_"})
    assert plan["failed"] and "pivot_port=8505: slot default serves tiny-llama-a on port 8501" in plan["msg"]


# --- the host lock and the run that owns it --------------------------------------------------------------------

def _owner(pid, started, controller=None):
    import socket
    return {"id": "%s:%d" % (controller or socket.gethostname(), pid), "controller": controller or socket.gethostname(),
            "boot_id": run_owner.boot_id(), "pid": pid, "started": started}


def test_run_alive_tells_a_live_run_from_a_dead_or_reused_pid_and_knows_what_it_cannot_tell():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        started = run_owner._stat_fields(sleeper.pid)[1]
        assert run_owner.run_alive(_owner(sleeper.pid, started)) is True
        assert run_owner.run_alive(_owner(sleeper.pid, started + 1)) is False  # the pid reused by another process
    finally:
        sleeper.kill()
        sleeper.wait()
    assert run_owner.run_alive(_owner(sleeper.pid, started)) is False
    assert run_owner.run_alive(_owner(1, 0, controller="another-controller")) is None
    assert run_owner.run_alive(dict(_owner(os.getpid(), 0), boot_id="an-earlier-boot")) is False


def test_this_run_is_the_outermost_ansible_playbook_ancestor(tmp_path):
    # A real process named ansible-playbook that forks a worker (same command line, as Ansible's workers are), whose
    # child asks who its run is: the run is the ansible-playbook process, not the worker that ends with its task.
    script = tmp_path / "ansible-playbook"
    script.write_text("#!%s\nimport os, subprocess, sys\npid = os.fork()\n"
                      "if pid == 0:\n    os._exit(subprocess.call([sys.executable, '-c', sys.argv[1]]))\n"
                      "sys.exit(os.waitpid(pid, 0)[1] >> 8)\n" % sys.executable)
    script.chmod(0o755)
    child = ("import json, sys; sys.path.insert(0, %r); "
             "from ansible_collections.llmfleet.vllm.plugins.module_utils.run_owner import this_run; "
             "print(json.dumps(this_run()))" % os.path.join(REPO, ".ansible", "collections"))
    proc = subprocess.Popen([str(script), child], stdout=subprocess.PIPE, text=True)
    out, _err = proc.communicate(timeout=60)
    run = json.loads(out)
    assert run["pid"] == proc.pid and run["id"].endswith(":%d:%d" % (proc.pid, run["started"]))


def test_lock_one_run_at_a_time_given_back_and_taken_over_only_from_a_run_that_is_gone(tmp_path):
    state = str(tmp_path)
    first, second = _owner(11, 1), _owner(22, 2)
    took = _run_module("host_lock", {"state_dir": state, "owner": first, "purpose": "pivot slot default to a"})
    assert took["acquired"] and took["changed"] and took["holder"] is None
    assert _run_module("host_lock", {"state_dir": state, "owner": first})["changed"] is False  # re-entrant
    held = _run_module("host_lock", {"state_dir": state, "owner": second})
    assert not held["acquired"] and held["holder"]["purpose"] == "pivot slot default to a"
    assert held["holder"]["owner"]["id"] == first["id"]
    # A takeover names the holder it replaces: a lock taken by a third run meanwhile is not stolen.
    assert not _run_module("host_lock", {"state_dir": state, "owner": second, "takeover": "someone-else"})["acquired"]
    taken = _run_module("host_lock", {"state_dir": state, "owner": second, "takeover": first["id"]})
    assert taken["acquired"] and json.loads((tmp_path / "pivot.lock").read_text())["took_over"] == first["id"]
    # Only the holder gives it back.
    assert not _run_module("host_lock", {"state_dir": state, "owner": first, "state": "absent"})["changed"]
    assert _run_module("host_lock", {"state_dir": state, "owner": second, "state": "absent"})["changed"]
    assert not (tmp_path / "pivot.lock").exists()
    # Check mode says it would take the lock and writes nothing.
    assert _run_module("host_lock", {"state_dir": state, "owner": first}, check=True)["acquired"]
    assert not (tmp_path / "pivot.lock").exists()


def test_lock_two_runs_at_once_one_wins(tmp_path):
    state = str(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, ".ansible", "collections"))
    procs = [subprocess.Popen([sys.executable, "-m", "ansible_collections.llmfleet.vllm.plugins.modules.host_lock",
                               json.dumps({"ANSIBLE_MODULE_ARGS": {"state_dir": state, "owner": _owner(100 + i, i)}})],
                              stdout=subprocess.PIPE, text=True, env=env) for i in range(6)]
    results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert sum(r["acquired"] for r in results) == 1
    winner = [r for r in results if r["acquired"]][0]
    winner_pid = json.loads((tmp_path / "pivot.lock").read_text())["owner"]["pid"]
    assert winner_pid == 100 + results.index(winner)
    assert winner["changed"] and all(r["holder"]["owner"]["pid"] == winner_pid for r in results if not r["acquired"])


def test_a_pivot_in_progress_holds_its_units_and_port():
    slots = {"a": dict(SERVING, name="a", pivot=hs.intent_record(SERVING, {"model": "tiny-llama-b", "port": 8502}, "blue_green"))}
    assert hs.slot_units(slots) == ["vllm-tiny-llama-a.service", "vllm-tiny-llama-b.service"]
    assert hs.slot_units({"n": {"name": "n", "pivot": hs.intent_record(None, {"model": "m", "port": 9000}, "new")}}) == \
        ["vllm-m.service"]
    with pytest.raises(hs.SlotError, match=r"pivot_port=9000 is already used by slot n \(a pivot in progress\)"):
        hs.assign_port("b", {"n": {"name": "n", "pivot": hs.intent_record(None, {"model": "m", "port": 9000}, "new")}},
                       8000, requested=9000, variable="pivot_port")


# --- the drain's wait on vLLM's own count (roles/slot/files/wait-idle.py), against a real HTTP server -----------

WAIT_IDLE = os.path.join(REPO, "roles", "slot", "files", "wait-idle.py")


class _Metrics:
    """A real HTTP server on loopback answering /metrics with vLLM's gauges (a TEST FIXTURE standing in for vLLM)."""

    def __init__(self, running, status=200):
        import http.server
        import threading
        state = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                body = ('vllm:num_requests_running{model_name="m"} %d.0\nvllm:num_requests_waiting{model_name="m"} 0.0\n'
                        % state.running).encode()
                self.send_response(state.status)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.running, self.status = running, status
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _wait_idle(port, timeout_s):
    out = subprocess.run([sys.executable, WAIT_IDLE, str(port), str(timeout_s)], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return json.loads(out)


def test_wait_idle_waits_for_the_models_own_count_and_is_a_bound():
    import threading
    metrics = _Metrics(running=2)
    threading.Timer(1.5, lambda: setattr(metrics, "running", 0)).start()
    drained = _wait_idle(metrics.port, 20)
    assert drained["idle"] and drained["in_flight"] == 0 and 1.4 <= drained["waited_s"] < 10, drained
    busy = _Metrics(running=3)
    bounded = _wait_idle(busy.port, 1.5)
    assert (bounded["idle"], bounded["in_flight"]) == (False, 3) and bounded["waited_s"] >= 1.5
    failing = _Metrics(running=0, status=500)  # an error page says nothing about what is in flight
    assert _wait_idle(failing.port, 1.5)["idle"] is False
    for server in (metrics.server, busy.server, failing.server):
        server.shutdown()
        server.server_close()
    # Nothing listens: nothing in flight.
    assert _wait_idle(metrics.port, 5)["idle"] is True


def test_a_run_scoped_to_two_inventory_hosts_holds_two_owners_of_one_machine_lock(tmp_path):
    # One rollout reaching one machine as two inventory hosts (two slots): the second is not let into the first's lock.
    first, second = run_owner.this_run(scope="gpu-1a slot a"), run_owner.this_run(scope="gpu-1b slot b")
    assert first["pid"] == second["pid"] and first["id"] != second["id"] and first["scope"] == "gpu-1a slot a"
    assert run_owner.this_run()["id"] == first["id"].split(" ")[0]
    assert _run_module("host_lock", {"state_dir": str(tmp_path), "owner": first})["acquired"]
    held = _run_module("host_lock", {"state_dir": str(tmp_path), "owner": second})
    assert not held["acquired"] and held["holder"]["owner"]["scope"] == "gpu-1a slot a"
    assert run_owner.run_alive(held["holder"]["owner"]) is True  # alive: refused, not taken over


@pytest.mark.parametrize("record_port, phase, origin, target, expected", [
    (8401, "switching", {"unit": "vllm-a.service", "port": 8401}, {"unit": "vllm-b.service", "port": 8401}, True),
    # Blue/green's new model is on the standby port: the gateway never routed there.
    (8401, "switching", {"unit": "vllm-a.service", "port": 8401}, {"unit": "vllm-b.service", "port": 8402}, False),
    # Committed stop-then-start: the replaced model may still run on the slot's port.
    (8401, "committed", {"unit": "vllm-a.service", "port": 8401}, {"unit": "vllm-b.service", "port": 8401}, True),
    # Committed blue/green: the slot serves on the new port; the old one is on the other.
    (8402, "committed", {"unit": "vllm-a.service", "port": 8401}, {"unit": "vllm-b.service", "port": 8402}, False),
    # A revision keeps the model's one unit: nothing else to stop.
    (8401, "committed", {"unit": "vllm-a.service", "port": 8401}, {"unit": "vllm-a.service", "port": 8401}, False),
    (8401, "committed", None, {"unit": "vllm-b.service", "port": 8401}, False),
    (None, "switching", None, {"unit": "vllm-b.service", "port": 8401}, False),
])
def test_heal_closes_the_slot_port_when_it_stops_or_starts_a_model_there(record_port, phase, origin, target, expected):
    intent = {"phase": phase, "from": origin, "to": target}
    record = {"model": "b", "port": record_port, "pivot": intent}
    assert hs.heal_changes_slot_port(record, hs.intent_of(record)) is expected
    assert hs.heal_changes_slot_port(record, None) is False


A, B = {"unit": "vllm-a.service", "port": 8401, "model": "a"}, {"unit": "vllm-b.service", "port": 8401, "model": "b"}
B_STANDBY, A_REVISION = dict(B, port=8402), dict(A, revision="new")


@pytest.mark.parametrize("record_port, phase, origin, target, steps", [
    # Back: stop the half-started new model; the old one starts again (heal.yml starts the recorded unit).
    (8401, "switching", A, B, {"stop_new"}),
    (8401, "switching", A, B_STANDBY, {"stop_new"}),
    (8401, "switching", None, B, {"stop_new"}),
    # Back from a revision: one unit, written again for the recorded revision and started.
    (8401, "switching", A, A_REVISION, {"restart_previous"}),
    # Forward: the replaced model goes, stopped where it holds the slot's port, drained first where it is on the other.
    (8401, "committed", A, B, {"stop_previous"}),
    (8402, "committed", A, B_STANDBY, {"drain_previous"}),
    (8401, "committed", A, A_REVISION, set()),
    (8401, "committed", None, B, set()),
])
def test_heal_plan_names_the_units_it_stops_or_starts(record_port, phase, origin, target, steps):
    record = {"model": "b", "port": record_port, "pivot": {"phase": phase, "from": origin, "to": target}}
    plan = hs.heal_plan(record, hs.intent_of(record))
    assert {step for step in ("stop_new", "restart_previous", "stop_previous", "drain_previous") if plan[step]} == steps
    assert plan["forward"] is (phase == "committed") and plan["from"] == (origin or {})
    assert plan["changes_slot_port"] is hs.heal_changes_slot_port(record, hs.intent_of(record))
    assert hs.heal_plan(record, None) is None
