# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Durable atomic writes of records and state files: the one owner of that rule.

A reader sees the old file or the new one, never a part (temp file + rename in the same directory), and after a
power loss the file is the old one or the new one, never empty: the temp file is fsynced before the rename, the
directory after it (the rename itself lives in the directory).
"""
from __future__ import annotations

import os
import tempfile


def fsync_dir(directory):
    """fsync a directory, so that the names created, renamed or removed in it survive a power loss."""
    fd = os.open(directory or '.', os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(source, path):
    """Rename source over path (same filesystem): source's data fsynced first, the directory after."""
    fd = os.open(source, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(source, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def atomic_write(path, data, mode=0o644, make_dirs=True, dir_mode=0o755, durable=True):
    """Write data (str: UTF-8, or bytes) to path durably and atomically, with the file mode given.

    The temp file is created next to path (a hidden name, removed again when anything fails), written, fsynced,
    renamed over path, and the directory fsynced. make_dirs creates missing parents (dir_mode). durable=False skips
    both fsyncs, for a cache that a power loss may leave empty (its reader starts afresh) but that is written often.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if make_dirs and not os.path.isdir(directory):
        os.makedirs(directory, dir_mode, exist_ok=True)
    payload = data.encode('utf-8') if isinstance(data, str) else bytes(data)
    fd, tmp = tempfile.mkstemp(prefix='.%s.' % os.path.basename(path), suffix='.tmp', dir=directory)
    try:
        with os.fdopen(fd, 'wb') as handle:
            handle.write(payload)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(directory)
