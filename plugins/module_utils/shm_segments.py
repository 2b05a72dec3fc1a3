# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Find shared-memory segments (files in a tmpfs such as /dev/shm) and the live processes that hold them.

A segment is "in use" when any process has it open (a /proc/PID/fd/N symlink resolves to it, or
the fd's stat shows the same device and inode) or mapped (a /proc/PID/maps line names its device
and inode, or its path). Processes that vanish during the scan are skipped; processes whose fd
table or maps cannot be read (permission) are reported so callers can stay on the safe side.

Standard library only: this runs on the target host under its system python.
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import os
import stat
import time

DEFAULT_PATTERNS = ("nccl-*", "psm_*", "sem.mp-*", "torch_*")

_DELETED_SUFFIX = " (deleted)"


class Holder(object):
    """One process that holds a file, and how (fd or maps)."""

    __slots__ = ("pid", "comm", "via")

    def __init__(self, pid, comm, via):
        self.pid = pid
        self.comm = comm
        self.via = via

    def as_dict(self):
        return {"pid": self.pid, "comm": self.comm, "via": self.via}


class ProcScan(object):
    """Result of one pass over /proc: who holds which (dev, ino) or path."""

    def __init__(self):
        self.by_inode = {}  # (dev, ino) -> [Holder]
        self.by_path = {}  # path -> [Holder]
        self.unreadable = {}  # pid -> uid of a process whose fd table or maps we could not read
        self.vanished = 0  # processes that exited while we looked at them
        self.scanned = 0

    def _add(self, table, key, holder):
        holders = table.setdefault(key, [])
        for h in holders:
            if h.pid == holder.pid and h.via == holder.via:
                return
        holders.append(holder)

    def holders_of(self, path, st):
        """Holders of the file at `path` whose stat result is `st`, de-duplicated by (pid, via)."""
        found = []
        seen = set()
        for holder in self.by_inode.get((st.st_dev, st.st_ino), []) + self.by_path.get(path, []):
            key = (holder.pid, holder.via)
            if key not in seen:
                seen.add(key)
                found.append(holder)
        found.sort(key=lambda h: (h.pid, h.via))
        return found


def _read_text(path):
    with open(path, "rb") as handle:
        return handle.read().decode("utf-8", "replace")


def _comm(proc_root, pid):
    try:
        return _read_text(os.path.join(proc_root, str(pid), "comm")).strip()
    except (OSError, IOError):
        return ""


def _owner_uid(proc_root, pid):
    try:
        return os.stat(os.path.join(proc_root, str(pid))).st_uid
    except OSError:
        return None


def _under(path, directory):
    directory = directory.rstrip("/") + "/"
    return path.startswith(directory)


def _strip_deleted(path):
    if path.endswith(_DELETED_SUFFIX):
        return path[: -len(_DELETED_SUFFIX)], True
    return path, False


def _parse_maps_line(line):
    """Return (dev, ino, path) of one /proc/PID/maps line, or None for anonymous mappings.

    Format: ``address perms offset dev inode pathname`` where dev is ``major:minor`` in hex and the
    pathname (optional) may contain spaces and may end with `` (deleted)``.
    """
    parts = line.split(None, 5)
    if len(parts) < 6:
        return None
    dev_field, ino_field, path = parts[3], parts[4], parts[5].rstrip("\n")
    try:
        major, minor = dev_field.split(":")
        dev = os.makedev(int(major, 16), int(minor, 16))
        ino = int(ino_field)
    except ValueError:
        return None
    if ino == 0 or not path.startswith("/"):
        return None
    return dev, ino, path


def _add_path_holder(scan, directory, proc_root, pid, comm, via, path):
    """Record `pid` in ``scan.by_path`` as holding `path` (via "fd" or "maps") when `path` lies under `directory`.

    Returns (holder, comm): holder is None when `path` lies elsewhere. `comm` is the process name, None until
    the first path under `directory`; it is passed back so that /proc/PID/comm is read at most once per process.
    """
    path, _deleted = _strip_deleted(path)
    if not _under(path, directory):
        return None, comm
    if comm is None:
        comm = _comm(proc_root, pid)
    holder = Holder(pid, comm, via)
    scan._add(scan.by_path, path, holder)
    return holder, comm


def scan_processes(directory, proc_root="/proc", self_pid=None):
    """Scan every process under `proc_root` for open fds and mappings of files under `directory`.

    Returns a ProcScan. Never raises for processes that vanish (ENOENT/ESRCH) or that we may not
    inspect (EACCES/EPERM); the latter are recorded in ``scan.unreadable``.
    """
    scan = ProcScan()
    directory = os.path.realpath(directory) if proc_root == "/proc" else directory
    if self_pid is None:
        self_pid = os.getpid()
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return scan
    for entry in entries:
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == self_pid:
            continue
        base = os.path.join(proc_root, entry)
        scan.scanned += 1
        comm = None
        gone = False
        denied = False

        # 1. open file descriptors
        fd_dir = os.path.join(base, "fd")
        try:
            fds = os.listdir(fd_dir)
        except (FileNotFoundError, ProcessLookupError):
            fds = []
            gone = True
        except PermissionError:
            fds = []
            denied = True
        except OSError:
            fds = []
            gone = True
        for fd in fds:
            link = os.path.join(fd_dir, fd)
            try:
                target = os.readlink(link)
            except (FileNotFoundError, ProcessLookupError):
                continue  # fd closed or process exited meanwhile
            except OSError:
                denied = True
                continue
            holder, comm = _add_path_holder(scan, directory, proc_root, pid, comm, "fd", target)
            if holder is None:
                continue
            try:
                st = os.stat(link)  # follows the magic link to the open file itself
                scan._add(scan.by_inode, (st.st_dev, st.st_ino), holder)
            except OSError:
                pass

        # 2. memory mappings (a segment can stay mapped after its fd was closed)
        if not gone:
            try:
                maps = _read_text(os.path.join(base, "maps"))
            except (FileNotFoundError, ProcessLookupError):
                maps = ""
                gone = True
            except PermissionError:
                maps = ""
                denied = True
            except OSError:
                maps = ""
                gone = True
            for line in maps.splitlines():
                parsed = _parse_maps_line(line)
                if parsed is None:
                    continue
                dev, ino, path = parsed
                holder, comm = _add_path_holder(scan, directory, proc_root, pid, comm, "maps", path)
                if holder is not None:
                    scan._add(scan.by_inode, (dev, ino), holder)

        if gone and not denied and not os.path.exists(base):
            scan.vanished += 1
        elif denied:
            uid = _owner_uid(proc_root, pid)
            if uid is not None:
                scan.unreadable[pid] = uid
            else:
                scan.vanished += 1
    return scan


def lease_probe(path):
    """Ask the kernel whether any other open file (fd or shared mapping) refers to `path`.

    A write lease (fcntl F_SETLEASE F_WRLCK) is granted only when no other process has the file
    open, and an mmap keeps the file open even after its fd was closed; this works across PID
    namespaces that /proc cannot see into. The lease is released at once.

    Returns True (free), False (held by someone) or None (could not tell: no permission, leases
    disabled, not a regular file...).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EBUSY):
                return False
            return None
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        except OSError:
            pass
        return True
    finally:
        os.close(fd)


def match_patterns(name, patterns):
    """The first fnmatch pattern (case-sensitive) that `name` matches, or None."""
    for pattern in patterns:
        if fnmatch.fnmatchcase(name, pattern):
            return pattern
    return None


def plan_cleanup(directory, patterns, min_age=0, proc_root="/proc", now=None, scan=None, probe=lease_probe):
    """Decide, for every entry of `directory`, whether it may be removed.

    Returns (remove, keep, listing, scan):
      remove  -- list of dicts {path, name, size, allocated, mtime, age, pattern}
      keep    -- list of dicts {path, name, reason, ...}; reason in
                 in_use | too_young | not_matching | not_a_file | holder_unverifiable

    A matching file is removable only when the /proc scan finds no holder AND `probe` (the
    kernel lease check, None to skip it) does not report it busy. When some process could not be
    inspected and the probe cannot tell either, files of that process's owner are kept.
      listing -- sorted names present before any removal
    """
    if now is None:
        now = time.time()
    names = sorted(os.listdir(directory))
    if scan is None:
        scan = scan_processes(directory, proc_root=proc_root)
    unreadable_uids = set(scan.unreadable.values())
    remove, keep = [], []
    for name in names:
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue  # removed by someone else since listdir
        entry = {"path": path, "name": name, "size": st.st_size}
        pattern = match_patterns(name, patterns)
        if pattern is None:
            entry["reason"] = "not_matching"
            keep.append(entry)
            continue
        entry["pattern"] = pattern
        if not stat.S_ISREG(st.st_mode):
            entry["reason"] = "not_a_file"
            keep.append(entry)
            continue
        holders = scan.holders_of(path, st)
        if holders:
            entry["reason"] = "in_use"
            entry["holders"] = [h.as_dict() for h in holders]
            entry["detected_by"] = "proc"
            keep.append(entry)
            continue
        age = now - st.st_mtime
        entry["age"] = round(age, 3)
        entry["mtime"] = st.st_mtime
        if min_age and age < min_age:
            entry["reason"] = "too_young"
            keep.append(entry)
            continue
        free = probe(path) if probe is not None else None
        if free is False:
            # held by a process that /proc did not show us (other PID namespace, unreadable)
            entry["reason"] = "in_use"
            entry["holders"] = []
            entry["detected_by"] = "lease"
            keep.append(entry)
            continue
        if free is None and st.st_uid in unreadable_uids:
            # a process of the file's owner could not be inspected: it might hold the segment
            entry["reason"] = "holder_unverifiable"
            entry["unreadable_pids"] = sorted(p for p, u in scan.unreadable.items() if u == st.st_uid)
            keep.append(entry)
            continue
        entry["allocated"] = st.st_blocks * 512
        remove.append(entry)
    return remove, keep, names, scan


def recheck(remove, directory, proc_root="/proc", probe=lease_probe):
    """Scan /proc once more just before unlinking and split `remove` into (still_free, now_in_use).

    Narrows the window in which a process that started between the plan and the removal could
    lose a segment it just opened. Entries that disappeared meanwhile are dropped from both lists.
    """
    scan = scan_processes(directory, proc_root=proc_root)
    free, busy = [], []
    for entry in remove:
        try:
            st = os.lstat(entry["path"])
        except FileNotFoundError:
            continue
        holders = scan.holders_of(entry["path"], st)
        if not holders and probe is not None and probe(entry["path"]) is False:
            holders = None
        if holders or holders is None:
            busy_entry = dict(entry)
            busy_entry["reason"] = "in_use"
            busy_entry["holders"] = [h.as_dict() for h in holders or []]
            if holders is None:
                busy_entry["detected_by"] = "lease"
            busy.append(busy_entry)
        else:
            free.append(entry)
    return free, busy


def clean(directory, patterns, min_age=0, probe=lease_probe, check_mode=False, proc_root="/proc"):
    """Plan, re-check and unlink: what nccl_shm_cleanup and the pivot's hand-over do. Returns (removed, keep, listing,
    scan); in check mode `removed` is what would go and nothing is unlinked. Raises OSError when the directory cannot
    be scanned."""
    remove, keep, listing, scan = plan_cleanup(directory, patterns, min_age=min_age, proc_root=proc_root, probe=probe)
    if check_mode or not remove:
        return (remove if check_mode else []), keep, listing, scan
    removed = []
    free, busy = recheck(remove, directory, proc_root=proc_root, probe=probe)
    keep.extend(busy)
    for entry in free:
        try:
            os.unlink(entry["path"])
        except FileNotFoundError:
            continue  # someone else removed it meanwhile: not our change
        except OSError as exc:
            failed = dict(entry)
            failed["reason"] = "error"
            failed["error"] = str(exc)
            keep.append(failed)
            continue
        removed.append(entry)
    return removed, keep, listing, scan
