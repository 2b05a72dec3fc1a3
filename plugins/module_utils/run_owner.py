# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who runs a play, as the host lock records it, and whether that run is still alive.

A run is the ansible-playbook process on its controller: the controller's host name and boot, the process id and
the process's start time (a pid reused after the run died is another process). Only the controller that ran it can
tell whether it still lives; from another controller the answer is unknown (None).
"""
from __future__ import annotations

import os
import socket

PLAYBOOK_COMMANDS = ('ansible-playbook', 'ansible-pull', 'ansible-console')


def _read(path):
    try:
        with open(path, 'rb') as handle:
            return handle.read()
    except OSError:
        return None


def _stat_fields(pid, proc='/proc'):
    """(ppid, start time in clock ticks since boot) of a process, or None when it is gone."""
    raw = _read(os.path.join(proc, str(pid), 'stat'))
    if raw is None:
        return None
    # The command name (2nd field) is in parentheses and may hold spaces: split after its last ')'.
    fields = raw[raw.rindex(b')') + 2:].split()
    return int(fields[1]), int(fields[19])


def _is_playbook(pid, proc='/proc'):
    argv = (_read(os.path.join(proc, str(pid), 'cmdline')) or b'').split(b'\0')
    return any(os.path.basename(arg.decode(errors='replace')).startswith(PLAYBOOK_COMMANDS) for arg in argv[:2])


def boot_id(proc='/proc'):
    return (_read(os.path.join(proc, 'sys', 'kernel', 'random', 'boot_id')) or b'').decode().strip()


def this_run(pid=None, proc='/proc', scope=None):
    """The run this process belongs to: its outermost ansible-playbook ancestor (Ansible forks its workers from the
    ansible-playbook process, so they carry the same command line, and templates lookups in them; a worker ends with
    its task), else the parent process.

    ``scope`` (e.g. the inventory host and slot) becomes part of the id: one run that reaches the same machine as two
    inventory hosts holds two different owners, so the second waits for the first instead of re-entering its lock."""
    pid = pid or os.getpid()
    chosen, seen = None, 0
    current = pid
    while current and current > 1 and seen < 64:
        if _is_playbook(current, proc):
            chosen = current
        elif chosen is not None:
            break
        fields = _stat_fields(current, proc)
        if fields is None:
            break
        current, seen = fields[0], seen + 1
    if chosen is None:
        chosen = (_stat_fields(pid, proc) or (os.getppid(), 0))[0]
    started = (_stat_fields(chosen, proc) or (0, 0))[1]
    controller = socket.gethostname()
    run_id = '%s:%s:%d:%d' % (controller, boot_id(proc)[:8], chosen, started)
    owner = {'id': run_id + (' %s' % scope if scope else ''), 'controller': controller, 'boot_id': boot_id(proc),
             'pid': chosen, 'started': started}
    if scope:
        owner['scope'] = scope
    return owner


def run_alive(owner, proc='/proc'):
    """True or False when this controller ran ``owner`` (same host name and boot), None when it cannot tell."""
    if not isinstance(owner, dict) or owner.get('controller') != socket.gethostname():
        return None
    if owner.get('boot_id') != boot_id(proc):
        return False  # the controller rebooted since: that run is gone
    fields = _stat_fields(owner.get('pid'), proc)
    return fields is not None and fields[1] == owner.get('started')
