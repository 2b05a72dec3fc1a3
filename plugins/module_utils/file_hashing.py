# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parallel streaming file hashing that keeps the disk, not Python, the bottleneck.

Each worker thread reads into one reused buffer with ``readinto`` and feeds hashlib a
memoryview of it: both the read and a large ``update`` release the GIL, so N threads
hash N files at once without copying the data through Python objects.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

DEFAULT_BUFFER_BYTES = 4 * 1024 * 1024
SHA256 = "sha256"
# git's object id of a file: sha1 over b"blob <size>\0" followed by the content.
GIT_BLOB_SHA1 = "git_sha1"
ALGORITHMS = (SHA256, GIT_BLOB_SHA1)


def default_workers():
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


def hash_file(path, algorithm=SHA256, buffer=None):
    """Return (hexdigest, bytes_read) of the file at ``path``."""
    view = memoryview(buffer if buffer is not None else bytearray(DEFAULT_BUFFER_BYTES))
    with open(path, "rb", buffering=0) as handle:
        fd = handle.fileno()
        if algorithm == SHA256:
            digest = hashlib.sha256()
        elif algorithm == GIT_BLOB_SHA1:
            digest = hashlib.sha1()  # nosec - git's object id, not a security hash
            digest.update(b"blob %d\0" % os.fstat(fd).st_size)
        else:
            raise ValueError("unknown hash algorithm %r" % algorithm)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        total = 0
        while True:
            count = handle.readinto(view)
            if not count:
                break
            digest.update(view[:count])
            total += count
    return digest.hexdigest(), total


class HashResult:
    __slots__ = ("path", "algorithm", "digest", "bytes_read", "seconds", "error")

    def __init__(self, path, algorithm, digest=None, bytes_read=0, seconds=0.0, error=None):
        self.path = path
        self.algorithm = algorithm
        self.digest = digest
        self.bytes_read = bytes_read
        self.seconds = seconds
        self.error = error


def hash_files(jobs, workers=None, buffer_bytes=DEFAULT_BUFFER_BYTES):
    """Hash many files in parallel.

    ``jobs`` is a list of (path, algorithm, size_hint). Largest files start first so one
    big file does not run alone at the end. Returns {path: HashResult}; a read error is
    recorded in ``HashResult.error`` instead of raised.
    """
    local = threading.local()

    def run(job):
        path, algorithm, _size = job
        buffer = getattr(local, "buffer", None)
        if buffer is None:
            buffer = local.buffer = bytearray(buffer_bytes)
        started = time.monotonic()
        try:
            digest, bytes_read = hash_file(path, algorithm, buffer)
        except OSError as exc:
            return HashResult(path, algorithm, error=str(exc), seconds=time.monotonic() - started)
        return HashResult(path, algorithm, digest, bytes_read, time.monotonic() - started)

    ordered = sorted(jobs, key=lambda job: job[2] or 0, reverse=True)
    workers = max(1, min(workers or default_workers(), len(ordered) or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return {result.path: result for result in pool.map(run, ordered)}
