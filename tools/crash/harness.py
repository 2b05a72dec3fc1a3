# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Crash harness: kill the controller (SIGKILL) at a task boundary of a pivot's switch phase, check what the slot's
clients see, reload HAProxy and reboot the host, then re-run the same command once and check that the host ends
serving the intended model with its record, units and gateway agreeing (docs/pivot-safety.md).

The kill comes from tools/crash/callback_plugins/crash_after_task.py (boundaries keyed by a task counter). Used by
tests/integration/test_gateway.py (a few boundaries, make test) and bench/crash.py (every boundary). Loopback and
test-host addresses only.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, ".ansible", "collections"))  # the working tree as the collection (`make venv`)
# pylint: disable-next=wrong-import-position
from ansible_collections.llmfleet.vllm.plugins.module_utils.host_slots import ALT_UNIT_VARIANT, unit_name  # noqa: E402
TESTBED = os.path.join(REPO, "tools", "testbed", "testbed.sh")
CALLBACKS = os.path.join(REPO, "tools", "crash", "callback_plugins")


def run_pivot(inventory, extra, crash_after=None, task_log=None, timeout_s=1800, crash_before_task_named=None):
    """ansible-playbook playbooks/pivot.yml in a session of its own; crash_after=N kills it after N tasks of the
    switch phase (crash_before_task_named: as the first task of the phase with that in its name starts). Returns
    (returncode, stdout, killed)."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACK_PLUGINS=os.pathsep.join(p for p in (CALLBACKS, os.environ.get("ANSIBLE_CALLBACK_PLUGINS")) if p),
               # Callbacks the caller enabled too (e.g. ansible.posix.profile_tasks for each task's time).
               ANSIBLE_CALLBACKS_ENABLED=",".join(filter(None, ["crash_after_task", os.environ.get("ANSIBLE_CALLBACKS_ENABLED")])))
    env.pop("LLMFLEET_CRASH_AFTER", None)
    env.pop("LLMFLEET_CRASH_BEFORE_TASK_NAMED", None)
    if crash_before_task_named:
        env["LLMFLEET_CRASH_BEFORE_TASK_NAMED"] = crash_before_task_named
    if crash_after is not None:
        env["LLMFLEET_CRASH_AFTER"] = str(crash_after)
    if task_log:
        env["LLMFLEET_CRASH_LOG"] = str(task_log)
    proc = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", str(inventory),
                           os.path.join(REPO, "playbooks", "pivot.yml"), *extra],
                          capture_output=True, text=True, env=env, cwd=REPO, check=False, timeout=timeout_s,
                          start_new_session=True)
    return proc.returncode, proc.stdout + proc.stderr, proc.returncode == -9


def phase_tasks(task_log):
    """[(index, action, name)] of the switch phase as a run logged them."""
    rows = []
    with open(task_log) as handle:
        for line in handle:
            fields = line.rstrip("\n").split("\t", 3)
            if fields[0] == "TASK":
                rows.append((int(fields[1]), fields[2], fields[3]))
    return rows


def changed_tasks(task_log):
    """Indexes of the phase's tasks that changed the host (a result 'changed'). A kill after any other task leaves the
    host as the kill after the last changing task before it did: the boundaries that differ are these."""
    changed = set()
    with open(task_log) as handle:
        for line in handle:
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "RESULT" and fields[2] == "changed":
                changed.add(int(fields[1]))
    return sorted(changed)


def probe(gateway_url, alias, api_key=None, timeout_s=30):
    """One completion through the gateway: 'ok', 'retry' (503 with Retry-After) or what else came back."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    body = json.dumps({"model": alias, "prompt": "hi", "max_tokens": 2}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(gateway_url + "/v1/completions", data=body, headers=headers),
                                    timeout=timeout_s) as resp:
            return "ok" if resp.status == 200 else "http-%d" % resp.status
    except urllib.error.HTTPError as exc:
        if exc.code == 503 and exc.headers.get("Retry-After"):
            return "retry"
        return "http-%d" % exc.code
    except OSError as exc:
        return "error-%s" % type(exc).__name__


def watch(gateway_url, alias, seconds, api_key=None, until_ok=False, machine=None):
    """Probe for a while; the outcomes seen. until_ok: stop at the first answer, or (machine given) once the answer
    is 503 with Retry-After and no vLLM unit of the host is active or starting - a steady state that will not serve
    before the next run."""
    seen, deadline = [], time.monotonic() + seconds
    while True:
        seen.append(probe(gateway_url, alias, api_key))
        if time.monotonic() >= deadline or (until_ok and seen[-1] == "ok"):
            return seen
        if until_ok and machine and seen[-3:] == ["retry"] * 3 and not vllm_units_running(machine):
            return seen
        time.sleep(1)


def vllm_units_running(machine):
    """vLLM units of the host that are active or activating (a model loading counts)."""
    return ssh(machine, "systemctl list-units --plain --no-legend --state=active,activating 'vllm-*.service'"
                        " | awk '{print $1}'").split()


def ssh(machine, command):
    return subprocess.run([TESTBED, "ssh", machine, command], capture_output=True, text=True, check=False).stdout.strip()


def served_unit(slots, model):
    """The unit that serves `model` as the host's slots record it (with fast start a new revision runs in the model's
    other unit, vllm-<model>-alt.service), else vllm-<model>.service."""
    for record in slots.values():
        if record.get("model") == model and record.get("unit"):
            return record["unit"]
    return unit_name(model)


def model_units(model):
    """Both units a model may run in."""
    return [unit_name(model), unit_name(model, ALT_UNIT_VARIANT)]


def host_state(machine, slot="default"):
    """The slot's record, the lock, its units and the gateway's servers as the host has them."""
    slots = json.loads(ssh(machine, "cat /var/lib/llmfleet/slots.json") or '{"slots": {}}')["slots"]
    record = slots.get(slot) or {}
    # Units of the host's other slots are theirs: this slot's check leaves them out.
    others = {served_unit({name: s}, s["model"]) for name, s in slots.items() if name != slot and s.get("model")}
    units = {}
    for line in ssh(machine, "systemctl list-units --all --plain --no-legend 'vllm-*.service' | awk '{print $1}'").split():
        if line not in others:
            units[line] = ssh(machine, f"systemctl is-active {line}; systemctl is-enabled {line}").split()
    # The slot's backend in haproxy.cfg (the file a reload or a reboot reads), not the other slots'.
    backend = ssh(machine, f"sed -n '/^backend slot_{slot}$/,/^$/p' /etc/haproxy/haproxy.cfg")
    servers = [line.split() for line in backend.splitlines() if line.strip().startswith("server port")]
    return {"record": record, "lock": ssh(machine, "cat /var/lib/llmfleet/pivot.lock 2>/dev/null"), "units": units,
            "servers": servers}


def agrees(state, model):
    """Problems, empty when the host serves `model` in the slot with record, units and gateway agreeing."""
    problems = []
    record = state["record"]
    if record.get("model") != model:
        problems.append("record names %s" % record.get("model"))
    if record.get("pivot"):
        problems.append("an intent is left: %s" % record["pivot"].get("phase"))
    if state["lock"]:
        problems.append("the lock is left")
    unit = served_unit({"slot": record}, model)
    for name, (active, enabled) in state["units"].items():
        want = ["active", "enabled"] if name == unit else None
        if want and [active, enabled] != want:
            problems.append("%s is %s/%s" % (name, active, enabled))
        if not want and (active == "active" or enabled == "enabled"):
            problems.append("%s still %s/%s" % (name, active, enabled))
    if unit not in state["units"]:
        problems.append("%s does not exist" % unit)
    active_servers = [s for s in state["servers"] if "disabled" not in s]
    if record.get("gateway") and [s[1] for s in active_servers] != ["port%s" % record.get("port")]:
        problems.append("gateway servers %s, record port %s" % (state["servers"], record.get("port")))
    return problems


def crash_and_heal(machine, inventory, extra, boundary, gateway_url, alias, model, reboot=False, api_key=None,
                   task_log=None, settle_s=3, reboot_wait_s=420, rerun_fails=False):
    """Kill the pivot after `boundary` tasks of its switch phase (or before the task so named), check (a) the alias answers or says 503 with
    Retry-After, (b) after `systemctl reload haproxy` (and a reboot) likewise, (c) one re-run ends serving `model`
    with record, units and gateway agreeing (rerun_fails: a pivot that must fail and roll back to `model`, such as one
    whose gate no model passes: the re-run heals, pivots again and fails). Returns a dict of what was seen."""
    named = boundary if isinstance(boundary, str) else None
    rc, out, killed = run_pivot(inventory, extra, crash_after=None if named else boundary, task_log=task_log,
                                crash_before_task_named=named)
    seen = {"boundary": boundary, "killed": killed, "rc": rc, "at": {"killed": time.time()}}
    seen["after_kill"] = watch(gateway_url, alias, settle_s, api_key)
    seen["at"]["reload"] = time.time()
    ssh(machine, "systemctl reload haproxy")
    seen["after_reload"] = watch(gateway_url, alias, settle_s, api_key)
    if reboot:
        seen["at"]["reboot"] = time.time()
        subprocess.run([TESTBED, "reboot", machine], check=True, capture_output=True)
        seen["after_reboot"] = watch(gateway_url, alias, reboot_wait_s, api_key, until_ok=True, machine=machine)
    seen["at"]["rerun"] = time.time()
    rc2, out2, _killed = run_pivot(inventory, extra)
    seen["at"]["healed"] = time.time()
    seen["rerun_rc"] = rc2
    seen["kill_tail"] = "" if killed else out[-3000:]
    seen["problems"] = agrees(host_state(machine), model)
    seen["after_heal"] = probe(gateway_url, alias, api_key)
    outcomes = seen["after_kill"] + seen["after_reload"] + seen.get("after_reboot", [])
    seen["bad_answers"] = sorted({o for o in outcomes if o not in ("ok", "retry")})
    seen["healed"] = (rc2 != 0) == rerun_fails and not seen["problems"] and seen["after_heal"] == "ok"
    seen["rerun_tail"] = "" if seen["healed"] else out2[-12000:]
    # What the host's units said (a unit that failed to start names why in its journal).
    seen["units_journal"] = "" if seen["healed"] else ssh(machine, "journalctl -u 'vllm-*' -o short-unix --no-pager -q -n 80")
    return seen
