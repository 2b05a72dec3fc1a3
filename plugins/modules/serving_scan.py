#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: serving_scan
short_description: Find vLLM servers, units and port listeners on a host that a pivot would collide with
version_added: "0.1.0"
description:
  - Lists the active systemd units named C(vllm*.service), the running vLLM server processes (command line with
    C(vllm serve) or C(vllm.entrypoints)) with the systemd unit each belongs to, and the processes listening on
    O(ports).
  - Everything not in O(expected_units) is reported in RV(foreign) with a sentence naming it, so that a pivot can
    refuse to start a model next to a server it does not manage (the new one would not get the GPU memory or the
    port) before anything changes.
  - Reads C(/proc) and C(systemctl); changes nothing.
author:
  - llmfleet maintainers (@llmfleet)
options:
  expected_units:
    description: Units the caller manages (the serving model's and the target's); they and their processes are not foreign.
    type: list
    elements: str
    default: []
  ports:
    description: TCP ports the new server needs; a listener outside O(expected_units) is foreign.
    type: list
    elements: int
    default: []
extends_documentation_fragment:
  - llmfleet.vllm.attributes
"""

EXAMPLES = r"""
- name: Look for vLLM servers the collection does not manage
  llmfleet.vllm.serving_scan:
    expected_units: [vllm-minimax-m25.service, vllm-kimi-k25-int4.service]
    ports: [8000]
  register: scan

- name: Refuse to pivot next to them
  ansible.builtin.assert:
    that: scan.foreign | length == 0
    fail_msg: "{{ scan.foreign | map(attribute='message') | join('; ') }}"
"""

RETURN = r"""
units:
  description: Active C(vllm*.service) units with their main PID.
  returned: always
  type: list
  elements: dict
  sample: [{unit: vllm-handmade.service, main_pid: 4242, active: active}]
processes:
  description: vLLM server processes (pid, unit or null, command line).
  returned: always
  type: list
  elements: dict
listeners:
  description: Per port in O(ports), the listening pid, its unit and command line (empty when the port is free).
  returned: always
  type: list
  elements: dict
foreign:
  description: What the caller does not manage, each with C(kind) (unit, process, port), details and C(message).
  returned: always
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule

LISTEN = "0A"


def read(path, mode="r"):
    try:
        with open(path, mode) as handle:
            return handle.read()
    except OSError:
        return None


def pids():
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())


def argv_of(pid):
    raw = read("/proc/%d/cmdline" % pid, "rb")
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a] if raw else []


def cmdline(pid):
    return " ".join(argv_of(pid))


def unit_of(pid):
    """The systemd service a process runs in, from its cgroup path (None outside any service)."""
    for line in (read("/proc/%d/cgroup" % pid) or "").splitlines():
        for part in reversed(line.rsplit(":", 1)[-1].split("/")):
            if part.endswith(".service"):
                return part
    return None


def is_vllm_server(argv):
    """`vllm serve ...` (any interpreter in front), `python -m vllm.entrypoints.openai.api_server`, or either behind
    the fast start launcher (`python vllm-launch.py OPTIONS -- vllm serve ...`, run in the launcher's own process)."""
    if any(os.path.basename(arg) == "vllm-launch.py" for arg in argv[:3]) and "--" in argv:
        return is_vllm_server(argv[argv.index("--") + 1:])
    for i, arg in enumerate(argv[:4]):
        if os.path.basename(arg) == "vllm" and argv[i + 1:i + 2] == ["serve"]:
            return True
        if arg == "-m" and argv[i + 1:i + 2] and argv[i + 1].startswith("vllm.entrypoints.") and \
                ("serve" in argv[i + 2:i + 3] or argv[i + 1].endswith("api_server")):
            return True
    return False


def listening_inodes(ports):
    wanted = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (read(table) or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN:
                port = int(fields[1].rsplit(":", 1)[1], 16)
                if port in ports:
                    wanted[fields[9]] = port
    return wanted


def socket_owners(inodes):
    owners = {}
    for pid in pids():
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                owners.setdefault(target[8:-1], pid)
    return owners


def active_units(module):
    rc, out, _err = module.run_command(["systemctl", "list-units", "--plain", "--no-legend", "--type=service", "--state=active",
                                        "vllm*.service"])
    units = []
    for line in out.splitlines() if rc == 0 else []:
        name = line.split()[0] if line.split() else ""
        if name.endswith(".service"):
            rc2, pid, _e = module.run_command(["systemctl", "show", "-P", "MainPID", name])
            units.append({"unit": name, "main_pid": int(pid.strip() or 0) if rc2 == 0 else None, "active": "active"})
    return units


def main():
    module = AnsibleModule(
        argument_spec=dict(expected_units=dict(type="list", elements="str", default=[]),
                           ports=dict(type="list", elements="int", default=[])),
        supports_check_mode=True,
    )
    expected = set(module.params["expected_units"])
    ports = set(module.params["ports"])
    units = active_units(module)
    processes = []
    for pid in pids():
        argv = argv_of(pid)
        if is_vllm_server(argv):
            processes.append({"pid": pid, "unit": unit_of(pid), "cmdline": " ".join(argv)[:300]})
    # A server's worker processes share its unit: report each unit, or each unit-less process, once.
    inodes = listening_inodes(ports)
    owners = socket_owners(inodes)
    listeners = []
    for inode, port in sorted(inodes.items(), key=lambda item: item[1]):
        pid = owners.get(inode)
        listeners.append({"port": port, "pid": pid, "unit": unit_of(pid) if pid else None,
                          "cmdline": cmdline(pid)[:300] if pid else ""})
    foreign = []
    for unit in units:
        if unit["unit"] not in expected:
            foreign.append({"kind": "unit", "unit": unit["unit"], "pid": unit["main_pid"],
                            "message": "systemd unit %s (main PID %s) serves vLLM and is not managed by this pivot"
                                       % (unit["unit"], unit["main_pid"])})
    seen_units = {u["unit"] for u in units}
    for proc in processes:
        if proc["unit"] not in expected and proc["unit"] not in seen_units:
            if proc["unit"]:
                seen_units.add(proc["unit"])
            foreign.append({"kind": "process", "pid": proc["pid"], "unit": proc["unit"],
                            "message": "vLLM process %d (%s%s) runs outside the units this pivot manages"
                                       % (proc["pid"], proc["cmdline"][:120], ", unit " + proc["unit"] if proc["unit"] else "")})
    for listener in listeners:
        if listener["unit"] not in expected:
            foreign.append({"kind": "port", "port": listener["port"], "pid": listener["pid"], "unit": listener["unit"],
                            "message": "port %d is taken by %s" % (
                                listener["port"], "PID %s (%s%s)" % (listener["pid"], listener["cmdline"][:120],
                                                                     ", unit " + listener["unit"] if listener["unit"] else "")
                                if listener["pid"] else "a process this scan cannot see")})
    module.exit_json(changed=False, units=units, processes=processes, listeners=listeners, foreign=foreign)


if __name__ == "__main__":
    main()
