# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Digests taken while a model downloads, and when they still count.

hf_snapshot hashes each file as soon as it lands, while other files still download, and records the digest with
the file's identity when it was read: device, inode, size, mtime and ctime, the same before and after the read.
shard_verify then trusts a digest only while the file still has that identity. Any write, rename over it or
re-fetch changes the inode or the ctime (which no user can set), so a file changed after it was hashed is hashed
again; nothing unverified is reported verified.

A digest is recorded only when the file's ctime was at least SETTLED_S old at the first stat: the kernel keeps
timestamps at a coarse tick (a few ms), and a write within the same tick as the one before could leave ctime
unchanged. On a filesystem with whole-second timestamps (ctime with no fraction) the margin is COARSE_SETTLED_S.

Each download run starts a new ledger (``Ledger(..., fresh=True)``): digests are trusted for the run that took
them, never for a later one (a full verification without a download reads every byte).
"""
from __future__ import annotations

import json
import os
import threading
import time

from ansible_collections.llmfleet.vllm.plugins.module_utils.atomic_write import atomic_write
from ansible_collections.llmfleet.vllm.plugins.module_utils.file_hashing import hash_file

LEDGER_RELPATH = ".cache/llmfleet/hashed.json"
SETTLED_S = 0.05
COARSE_SETTLED_S = 2.0


def identity(st):
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def settled(st, now):
    """True when a later write could not leave the file's ctime as it is at ``now`` (the time of the stat)."""
    margin = COARSE_SETTLED_S if st.st_ctime_ns % 1000000000 == 0 else SETTLED_S
    return now - st.st_ctime_ns / 1e9 >= margin


class Ledger:
    """{relative path: {algorithm, digest, identity}} of one model directory, saved as JSON."""

    def __init__(self, model_dir, fresh=False):
        self.model_dir = model_dir
        self.path = os.path.join(model_dir, LEDGER_RELPATH)
        self._lock, self._save_lock = threading.Lock(), threading.Lock()
        self.entries = {}
        if fresh:
            self.save()  # a run's ledger starts empty on disk too: no digest of an earlier run survives it
            return
        try:
            with open(self.path) as handle:
                data = json.load(handle)
            if isinstance(data, dict) and isinstance(data.get("files"), dict):
                self.entries = data["files"]
        except (OSError, ValueError):
            pass

    def hash_and_record(self, relpath, algorithm, buffer=None):
        """Hash a file and record the digest if the file kept one identity throughout; returns (digest, recorded)."""
        full = os.path.join(self.model_dir, relpath)
        now = time.time()
        before = os.stat(full)
        digest, _count = hash_file(full, algorithm, buffer)
        after = os.stat(full)
        recorded = identity(before) == identity(after) and settled(before, now)
        with self._lock:
            if recorded:
                self.entries[relpath] = {"algorithm": algorithm, "digest": digest, "identity": identity(after)}
            else:
                self.entries.pop(relpath, None)
        return digest, recorded

    def digest(self, relpath, algorithm):
        """The recorded digest when the file still has the identity it had when hashed, else None."""
        with self._lock:
            entry = self.entries.get(relpath)
        if not entry or entry.get("algorithm") != algorithm:
            return None
        try:
            st = os.stat(os.path.join(self.model_dir, relpath))
        except OSError:
            return None
        return entry["digest"] if identity(st) == entry.get("identity") else None

    def forget(self, relpaths):
        with self._lock:
            for relpath in relpaths:
                self.entries.pop(relpath, None)

    def save(self):
        with self._save_lock:
            with self._lock:
                data = {"files": dict(self.entries)}
            # A temporary name of its own: a killed run's module may still be saving the same ledger (seen in CI:
            # two writers of one hashed.json.tmp, the second rename found it gone). Not fsynced: it is saved after
            # every file hashed, and a ledger a power loss empties only means hashing again.
            atomic_write(self.path, json.dumps(data, sort_keys=True), durable=False)
