# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run a systemd unit that roles/service_deploy rendered, on a machine without systemd (the device tool's VM).

    unit_runner.py start UNIT_FILE [--pass-env NAME ...]   # ExecStartPre, then ExecStart; returns once it runs
    unit_runner.py stop UNIT                               # SIGTERM to the main process, then SIGKILL the rest
    unit_runner.py shims DIR                               # DIR/systemctl and DIR/journalctl run this file

As `systemctl` it answers `show -P PROP UNIT`, `show --property=A,B UNIT` and `is-active UNIT` from the state
this runner keeps, so roles/service_deploy/files/wait-ready.py (the role's readiness wait) works unchanged;
as `journalctl -u UNIT -n N` it prints the tail of the unit's log.

What it does as systemd would: User=/Group= (with the user's groups), EnvironmentFile= over Environment=
over systemd's own PATH/LANG/USER/LOGNAME/HOME/SHELL, CacheDirectory= and RuntimeDirectory= (created, owned by the user),
WorkingDirectory=, LimitNOFILE=, LimitMEMLOCK=, NoNewPrivileges=, UMask=, ExecStartPre= (as root), Type=exec (start
returns once the main process runs), KillMode=mixed and TimeoutStopSec= on stop, ActiveState failed when the
main process exits non-zero. Specifiers: %C (/var/cache) and %%. Not emulated, and listed under "ignored" in
the start result: the sandboxing settings (ProtectSystem=, PrivateTmp=, ...), Restart=, the start limits.
"""
from __future__ import annotations

import ctypes
import grp
import json
import os
import pwd
import resource
import signal
import subprocess
import sys
import time
import traceback

STATE_DIR = os.environ.get("LLMFLEET_UNIT_STATE_DIR", "/run/llmfleet-units")
SPECIFIERS = {"C": "/var/cache", "%": "%"}
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
EMULATED = {"User", "Group", "EnvironmentFile", "Environment", "CacheDirectory", "RuntimeDirectory", "WorkingDirectory",
            "ExecStartPre", "ExecStart", "LimitNOFILE", "LimitMEMLOCK", "NoNewPrivileges", "UMask", "Type", "KillMode", "TimeoutStopSec"}
PR_SET_NO_NEW_PRIVS = 38


# --------------------------------------------------------------------------- unit file parsing


def read_unit(text):
    """{section: [(key, value), ...]} with continuation lines joined (value keeps one space per join)."""
    sections, section, pending = {}, None, ""
    for raw in text.splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            sections.setdefault(section, [])
        elif "=" in line and section:
            key, value = line.split("=", 1)
            sections[section].append((key.strip(), value.strip()))
    return sections


def expand_specifiers(text):
    out, i = [], 0
    while i < len(text):
        if text[i] == "%" and i + 1 < len(text):
            spec = text[i + 1]
            if spec not in SPECIFIERS:
                raise ValueError("specifier %%%s is not emulated (in %r)" % (spec, text))
            out.append(SPECIFIERS[spec])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'", "s": " "}


def split_words(text):
    """systemd's word splitting: whitespace separates, "..." / '...' quote, C escapes (\\n \\t \\\\ \\")."""
    words, i, n = [], 0, len(text)
    while i < n:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            break
        word, quote = [], None
        if text[i] in "\"'":
            quote = text[i]
            i += 1
        while i < n:
            c = text[i]
            if c == "\\" and i + 1 < n:
                word.append(_ESCAPES.get(text[i + 1], text[i + 1]))
                i += 2
                continue
            if quote and c == quote:
                i += 1
                break
            if not quote and c.isspace():
                break
            word.append(c)
            i += 1
        words.append("".join(word))
    return words


def command_line(value):
    """ExecStart= value -> (prefixes, argv): '$$' -> '$', specifiers expanded per word."""
    prefixes = ""
    while value and value[0] in "+-@!:":
        prefixes += value[0]
        value = value[1:]
    argv = [expand_specifiers(w).replace("$$", "$") for w in split_words(value)]
    return prefixes, argv


def environment_file(text):
    """KEY=value / KEY="value" lines (backslash escapes inside quotes), comments and blanks skipped."""
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
            out, i = [], 0
            while i < len(value):
                if value[i] == "\\" and i + 1 < len(value):
                    out.append(value[i + 1])
                    i += 2
                else:
                    out.append(value[i])
                    i += 1
            value = "".join(out)
        env[key.strip()] = value
    return env


def parse_unit(text):
    """What the runner needs of a unit: argv, pre-commands, user, environment pieces, limits, ignored keys."""
    service = read_unit(text).get("Service", [])
    unit = {"exec_start_pre": [], "environment": {}, "environment_files": [], "ignored": []}
    for key, value in service:
        if key == "ExecStart":
            unit["prefixes"], unit["argv"] = command_line(value)
        elif key == "ExecStartPre":
            unit["exec_start_pre"].append(command_line(value))
        elif key == "Environment":
            for word in split_words(value):
                name, _sep, val = word.partition("=")
                unit["environment"][name] = expand_specifiers(val)
        elif key == "EnvironmentFile":
            unit["environment_files"].append(expand_specifiers(value))
        elif key in ("User", "Group", "KillMode", "Type"):
            unit[key.lower()] = value
        elif key in ("CacheDirectory", "RuntimeDirectory", "WorkingDirectory"):
            unit[key.lower()] = expand_specifiers(value)
        elif key in ("LimitNOFILE", "LimitMEMLOCK"):
            unit[key.lower()] = resource.RLIM_INFINITY if value == "infinity" else int(value)
        elif key == "TimeoutStopSec":
            unit["timeout_stop_s"] = float(value)
        elif key == "UMask":
            unit["umask"] = int(value, 8)
        elif key == "NoNewPrivileges":
            unit["no_new_privileges"] = value in ("true", "yes", "1", "on")
        if key not in EMULATED:
            unit["ignored"].append("%s=%s" % (key, value))
    if "argv" not in unit:
        raise ValueError("the unit has no ExecStart=")
    return unit


def service_environment(unit, pass_env=()):
    """The main process's environment: systemd's own, Environment=, then EnvironmentFile= (which wins)."""
    user = unit.get("user", "root")
    pw = pwd.getpwnam(user)
    env = {"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8", "USER": user, "LOGNAME": user, "HOME": pw.pw_dir,
           "SHELL": pw.pw_shell}
    env.update(unit["environment"])
    for path in unit["environment_files"]:
        optional = path.startswith("-")
        try:
            with open(path.lstrip("-"), encoding="utf-8") as handle:
                env.update(environment_file(handle.read()))
        except FileNotFoundError:
            if not optional:
                raise
    for name in pass_env:
        if name in os.environ:
            env[name] = os.environ[name]
    return env


# --------------------------------------------------------------------------- state


def unit_name(path_or_name):
    return os.path.basename(path_or_name)


def state_path(unit):
    return os.path.join(STATE_DIR, unit_name(unit) + ".json")


def log_path(unit):
    return os.path.join(STATE_DIR, unit_name(unit) + ".log")


def read_state(unit):
    try:
        with open(state_path(unit), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {"ActiveState": "inactive", "NRestarts": 0, "ExecMainStartTimestampMonotonic": 0, "MainPID": 0}


def write_state(unit, state):
    os.makedirs(STATE_DIR, exist_ok=True)
    tmp = state_path(unit) + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(state, handle, indent=1, sort_keys=True)
    os.replace(tmp, state_path(unit))


def monotonic_us():
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)


# --------------------------------------------------------------------------- start / stop


def _demote(unit):
    """preexec_fn of the main process: umask, no-new-privileges, then the service user and its groups."""
    user = unit.get("user", "root")
    pw = pwd.getpwnam(user)
    gid = grp.getgrnam(unit["group"]).gr_gid if unit.get("group") else pw.pw_gid

    def preexec():
        if "umask" in unit:
            os.umask(unit["umask"])
        if unit.get("no_new_privileges"):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        os.initgroups(user, gid)
        os.setgid(gid)
        os.setuid(pw.pw_uid)
    return preexec


def _set_limits(unit):
    """LimitNOFILE=/LimitMEMLOCK= on this process (inherited by the main process); what was set, per limit."""
    done = {}
    for key, limit in (("limitnofile", resource.RLIMIT_NOFILE), ("limitmemlock", resource.RLIMIT_MEMLOCK)):
        if key not in unit:
            continue
        try:
            resource.setrlimit(limit, (unit[key], unit[key]))
        except (ValueError, OSError) as exc:  # a container without CAP_SYS_RESOURCE: raise the soft limit only
            hard = resource.getrlimit(limit)[1]
            if hard == resource.RLIM_INFINITY:
                soft = unit[key]
            else:
                soft = hard if unit[key] == resource.RLIM_INFINITY else min(unit[key], hard)
            resource.setrlimit(limit, (soft, hard))
            done[key + "_error"] = str(exc)
        done[key] = list(resource.getrlimit(limit))
    return done


def _prepare_dirs(unit):
    user = unit.get("user", "root")
    pw = pwd.getpwnam(user)
    gid = grp.getgrnam(unit["group"]).gr_gid if unit.get("group") else pw.pw_gid
    # As systemd: each directory the unit's user's (its parents root's), under /var/cache and /run.
    for key, root in (("cachedirectory", SPECIFIERS["C"]), ("runtimedirectory", "/run")):
        for name in unit.get(key, "").split():
            path = os.path.join(root, name)
            os.makedirs(path, mode=0o755, exist_ok=True)
            os.chown(path, pw.pw_uid, gid)


def supervise(unit_file, unit, env, log):
    """Child of `start`, in a session of its own: run ExecStartPre, start the main process, wait, record."""
    name = unit_name(unit_file)
    for _prefixes, argv in unit["exec_start_pre"]:
        rc = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        if rc != 0:
            write_state(name, {"ActiveState": "failed", "NRestarts": 0, "ExecMainStartTimestampMonotonic": 0,
                               "MainPID": 0, "Result": "exit-code", "failed_step": "ExecStartPre", "rc": rc})
            return
    limits = _set_limits(unit)
    started_us = monotonic_us()
    proc = subprocess.Popen(unit["argv"], env=env, cwd=unit.get("workingdirectory") or "/", stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_demote(unit))
    state = {"ActiveState": "active", "SubState": "running", "NRestarts": 0, "MainPID": proc.pid,
             "ExecMainStartTimestampMonotonic": started_us, "started_at": time.time(), "supervisor_pid": os.getpid(),
             "session_id": os.getsid(0), "unit_file": unit_file, "argv": unit["argv"], "limits": limits}
    write_state(name, state)
    rc = proc.wait()
    stopping = read_state(name).get("stopping", False)
    state.update(MainPID=0, ExecMainStatus=rc, exited_at=time.time(), SubState="dead",
                 ActiveState="inactive" if rc == 0 or (stopping and rc == -signal.SIGTERM) else "failed",
                 Result="success" if rc == 0 or stopping else "exit-code")
    write_state(name, state)


def start(unit_file, pass_env=()):
    with open(unit_file, encoding="utf-8") as handle:
        unit = parse_unit(handle.read())
    name = unit_name(unit_file)
    if read_state(name).get("ActiveState") == "active":
        raise SystemExit("%s is already active" % name)
    env = service_environment(unit, pass_env)
    _prepare_dirs(unit)
    os.makedirs(STATE_DIR, exist_ok=True)
    if os.path.exists(state_path(name)):
        os.unlink(state_path(name))
    log = open(log_path(name), "ab")
    log.write(("-- start %s (%s)\n" % (name, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))).encode())
    log.flush()
    pid = os.fork()
    if pid == 0:
        # A daemon: own session, and none of the caller's descriptors (a caller that reads our output to
        # its end, such as Ansible's command module, would otherwise wait for the service to exit).
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        os.closerange(3, log.fileno())
        os.closerange(log.fileno() + 1, 4096)
        sys.stdout = sys.stderr = open(2, "w", closefd=False)
        try:
            supervise(unit_file, unit, env, log)
        except BaseException:  # noqa: B902 - report anything in the unit's log, then leave
            traceback.print_exc()
            write_state(name, {"ActiveState": "failed", "NRestarts": 0, "ExecMainStartTimestampMonotonic": 0,
                               "MainPID": 0, "Result": "resources"})
        finally:
            sys.stderr.flush()
            os._exit(0)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = read_state(name)
        if state.get("MainPID") or state.get("ActiveState") == "failed":
            break
        time.sleep(0.05)
    secret_free = {k: ("<set>" if "KEY" in k or "TOKEN" in k else v) for k, v in env.items()}
    return {"unit": name, "state": read_state(name), "environment": secret_free, "argv": unit["argv"],
            "user": unit.get("user"), "ignored": unit["ignored"], "passed_env": [n for n in pass_env if n in os.environ]}


def _session_pids(sid, exclude=()):
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open("/proc/%s/stat" % entry) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop(unit):
    """KillMode=mixed: SIGTERM to the main process, wait up to TimeoutStopSec, then SIGKILL the session's rest."""
    name = unit_name(unit)
    state = read_state(name)
    t0 = time.monotonic()
    result = {"unit": name, "was": state.get("ActiveState")}
    if state.get("ActiveState") != "active" or not state.get("MainPID"):
        return dict(result, stop_s=0.0)
    with open(state["unit_file"], encoding="utf-8") as handle:
        timeout = parse_unit(handle.read()).get("timeout_stop_s", 90.0)
    state["stopping"] = True
    write_state(name, state)
    os.kill(state["MainPID"], signal.SIGTERM)
    while _alive(state["MainPID"]) and time.monotonic() - t0 < timeout:
        time.sleep(0.05)
    result["main_exited_s"] = round(time.monotonic() - t0, 3)
    leftovers = _session_pids(state["session_id"], exclude=(state["supervisor_pid"],))
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    while _alive(state["supervisor_pid"]) and time.monotonic() - t0 < timeout + 10:
        time.sleep(0.05)
    final = read_state(name)
    return dict(result, stop_s=round(time.monotonic() - t0, 3), sigkilled=leftovers,
                active_state=final.get("ActiveState"), exec_main_status=final.get("ExecMainStatus"))


# --------------------------------------------------------------------------- systemctl / journalctl


def systemctl(args):
    props, value_only, words = [], False, []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-P", "-p", "--property") and i + 1 < len(args):
            props += args[i + 1].split(",")
            value_only = value_only or arg == "-P"
            i += 2
            continue
        if arg.startswith("--property="):
            props += arg.split("=", 1)[1].split(",")
        elif arg.startswith("--value"):
            value_only = True
        elif not arg.startswith("-"):
            words.append(arg)
        i += 1
    if not words:
        return 1
    verb, units = words[0], words[1:]
    if verb == "is-active":
        states = [read_state(u).get("ActiveState", "inactive") for u in units]
        print("\n".join(states))
        return 0 if all(s == "active" for s in states) else 3
    if verb != "show":
        sys.stderr.write("unit_runner systemctl: only show and is-active are emulated, not %s\n" % verb)
        return 1
    for unit in units:
        state = read_state(unit)
        for prop in props or sorted(state):
            value = state.get(prop, "")
            print(value if value_only else "%s=%s" % (prop, value))
    return 0


def journalctl(args):
    unit, lines = None, 10
    for i, arg in enumerate(args):
        if arg == "-u" and i + 1 < len(args):
            unit = args[i + 1]
        elif arg == "-n" and i + 1 < len(args):
            lines = int(args[i + 1])
    if not unit:
        return 1
    try:
        with open(log_path(unit), "rb") as handle:
            tail = handle.read().decode("utf-8", "replace").splitlines()[-lines:]
    except OSError:
        tail = ["-- No entries --"]
    print("\n".join(tail))
    return 0


def main(argv):
    if len(argv) > 2 and argv[1] == "--as":
        return {"systemctl": systemctl, "journalctl": journalctl}[argv[2]](argv[3:])
    if len(argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    verb, target = argv[1], argv[2]
    if verb == "start":
        pass_env = [argv[i + 1] for i, a in enumerate(argv) if a == "--pass-env" and i + 1 < len(argv)]
        result = start(target, pass_env)
    elif verb == "stop":
        result = stop(target)
    elif verb == "shims":
        os.makedirs(target, exist_ok=True)
        for name in ("systemctl", "journalctl"):
            with open(os.path.join(target, name), "w", encoding="utf-8") as handle:
                handle.write('#!/bin/sh\nexec %s %s --as %s "$@"\n' % (sys.executable, os.path.abspath(__file__), name))
            os.chmod(os.path.join(target, name), 0o755)
        result = {"shims": target}
    else:
        sys.stderr.write(__doc__)
        return 2
    print(json.dumps(result, indent=1, sort_keys=True))
    return 1 if verb == "start" and result["state"].get("ActiveState") != "active" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
