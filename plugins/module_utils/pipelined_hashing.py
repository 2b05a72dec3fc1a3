# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Hash the files of a download as soon as each is complete, while the others still download."""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.llmfleet.vllm.plugins.module_utils.file_hashing import (
    DEFAULT_BUFFER_BYTES, GIT_BLOB_SHA1, SHA256, default_workers)
from ansible_collections.llmfleet.vllm.plugins.module_utils.hash_ledger import SETTLED_S, settled


def algorithm_of(entry):
    """sha256 for LFS files, git's blob sha1 for the others, None when the manifest has neither."""
    return SHA256 if entry.get("sha256") else GIT_BLOB_SHA1 if entry.get("git_sha1") else None


class PipelinedHasher:
    """Watches manifest entries; a file whose final name has the hub's size (and a settled ctime) is hashed into the
    ledger by one of ``workers`` threads. What is still downloading is left to shard_verify afterwards."""

    def __init__(self, ledger, entries, workers=None, interval=0.2, buffer_bytes=DEFAULT_BUFFER_BYTES, owner=None):
        """owner -- (uid, gid) each complete file gets before it is hashed (-1 leaves that one), or None."""
        self.ledger, self.interval, self.buffer_bytes, self.owner = ledger, interval, buffer_bytes, owner
        self.pending = dict((e["path"], e) for e in entries if algorithm_of(e))
        self.files_total, self.bytes_total = len(self.pending), sum(e["size"] for e in self.pending.values())
        self.files_hashed, self.bytes_hashed, self.mismatched = 0, 0, []
        self._lock, self._local, self._stop = threading.Lock(), threading.local(), threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers or default_workers()), thread_name_prefix="hash")
        self._thread = None

    def _hash(self, entry):
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:
            buffer = self._local.buffer = bytearray(self.buffer_bytes)
        algorithm = algorithm_of(entry)
        expected = entry["sha256"] if algorithm == SHA256 else entry["git_sha1"]
        try:
            digest, recorded = self.ledger.hash_and_record(entry["path"], algorithm, buffer)
        except OSError:
            recorded = False
        with self._lock:
            if recorded:
                self.files_hashed += 1
                self.bytes_hashed += entry["size"]
                if digest != expected:
                    self.mismatched.append(entry["path"])
        if recorded:
            self.ledger.save()  # a killed download keeps what it hashed

    def _needs_chown(self, st):
        if self.owner is None:
            return False
        uid, gid = self.owner
        return (uid != -1 and st.st_uid != uid) or (gid != -1 and st.st_gid != gid)

    def scan(self):
        """Submit every pending file that is complete now (given its owner first: a chown later would change its
        ctime and void the digest)."""
        for path, entry in list(self.pending.items()):
            full = os.path.join(self.ledger.model_dir, path)
            now = time.time()
            try:
                st = os.stat(full)
                if st.st_size == entry["size"] and self._needs_chown(st):
                    os.chown(full, *self.owner)
                    continue  # hashed once its new ctime has settled
            except OSError:
                continue
            if st.st_size == entry["size"] and settled(st, now):
                del self.pending[path]
                self._pool.submit(self._hash, entry)

    def _run(self):
        while not self._stop.wait(self.interval):
            self.scan()

    def start(self):
        self._thread = threading.Thread(target=self._run, name="hash-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Stop watching, hash what is complete by now (it is read once either way, here or by shard_verify) and save.

        Two last passes, each after the settling margin: the first may only give files their owner."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for _last_pass in range(2):
            time.sleep(SETTLED_S + 0.01)
            self.scan()
        self._pool.shutdown(wait=True)
        self.ledger.save()
        return self.progress()

    def progress(self):
        with self._lock:
            return {"files_hashed": self.files_hashed, "files_to_hash": self.files_total,
                    "bytes_hashed": self.bytes_hashed, "bytes_to_hash": self.bytes_total,
                    "hash_mismatches": list(self.mismatched)}
