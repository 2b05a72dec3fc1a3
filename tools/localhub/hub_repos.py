"""Model repos served from plain folders ROOT/<org>/<name>/, described the way the Hub describes them.

Each file gets its git blob id, and LFS files (weights, by extension or size) their sha256 and the
git-lfs pointer the Hub would store. A repo's commit sha is a hash over its file list and blob ids,
so it is stable while the files are unchanged and changes when any of them does.

Earlier commits stay downloadable by their sha from ROOT/.history/<org>/<name>/<commit>/ (copies of the files as
they were), which publish_commit() writes before it changes a repo: the Hub keeps every commit, and a host pinned
to an older one must still find it.
"""
import hashlib
import os
import re
import shutil
import threading
from dataclasses import dataclass

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack",
                ".onnx", ".npy", ".npz", ".model", ".zip", ".tar", ".gz")
LFS_MIN_SIZE = 10 * 1024 * 1024
SKIPPED_DIRS = {".git", ".cache", "__pycache__"}
HISTORY_DIR = ".history"
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class RepoFile:
    path: str  # relative, "/"-separated
    abspath: str
    size: int
    sha256: str
    blob_id: str  # git blob sha1 of the content, or of the LFS pointer for LFS files
    lfs_pointer_size: int | None  # None: a regular git file

    @property
    def is_lfs(self):
        return self.lfs_pointer_size is not None

    @property
    def etag(self):
        """What the Hub puts in ETag / X-Linked-Etag: sha256 for LFS files, the git blob id otherwise."""
        return self.sha256 if self.is_lfs else self.blob_id


@dataclass(frozen=True)
class RepoSnapshot:
    repo_id: str
    commit: str
    files: dict  # path -> RepoFile, sorted by path

    def revision_matches(self, revision):
        return revision in ("main", self.commit)


def git_blob_id(data_size, chunks):
    digest = hashlib.sha1(f"blob {data_size}\0".encode())
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def lfs_pointer(sha256, size):
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _read_chunks(path, chunk_size=1 << 20):
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            yield chunk


def is_lfs_path(path, size):
    return path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE


class RepoStore:
    """Finds repos under root and hashes their files, re-hashing only files whose size or mtime changed."""

    def __init__(self, root):
        self.root = os.path.abspath(root)
        self._hash_cache = {}  # abspath -> ((size, mtime_ns), sha256, content blob id)
        self._lock = threading.Lock()

    def repo_ids(self):
        ids = []
        for org in sorted(os.listdir(self.root)):
            org_dir = os.path.join(self.root, org)
            if org.startswith(".") or not os.path.isdir(org_dir):
                continue
            ids += [f"{org}/{name}" for name in sorted(os.listdir(org_dir))
                    if not name.startswith(".") and os.path.isdir(os.path.join(org_dir, name))]
        return ids

    def _repo_dir(self, repo_id):
        parts = repo_id.split("/")
        if len(parts) != 2 or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            return None
        repo_dir = os.path.join(self.root, *parts)
        return repo_dir if os.path.isdir(repo_dir) else None

    def snapshot(self, repo_id, revision="main"):
        """The repo's RepoSnapshot at ``revision`` (main, the current commit, or an earlier commit kept in the
        history); the current one when the revision is unknown (the caller checks revision_matches); None when
        there is no such repo."""
        repo_dir = self._repo_dir(repo_id)
        if repo_dir is None:
            return None
        head = self._snapshot_of(repo_id, repo_dir)
        if revision in ("main", head.commit) or not _COMMIT_RE.match(revision or ""):
            return head
        old_dir = os.path.join(self.root, HISTORY_DIR, repo_id, revision)
        if os.path.isdir(old_dir):
            old = self._snapshot_of(repo_id, old_dir)
            if old.commit == revision:
                return old
        return head

    def publish_commit(self, repo_id, changes):
        """Keep the current commit in the history, then write ``changes`` ({relative path: bytes}) into the repo:
        main moves to a new commit. Returns (old commit, new commit)."""
        repo_dir = self._repo_dir(repo_id)
        old = self._snapshot_of(repo_id, repo_dir)
        keep = os.path.join(self.root, HISTORY_DIR, repo_id, old.commit)
        if not os.path.isdir(keep):
            shutil.copytree(repo_dir, keep + ".tmp", ignore=shutil.ignore_patterns(*SKIPPED_DIRS), dirs_exist_ok=True)
            os.replace(keep + ".tmp", keep)
        for rel, data in changes.items():
            with open(os.path.join(repo_dir, rel), "wb") as handle:
                handle.write(data)
        return old.commit, self._snapshot_of(repo_id, repo_dir).commit

    def _snapshot_of(self, repo_id, repo_dir):
        files = {}
        for rel in sorted(self._walk(repo_dir)):
            files[rel] = self._describe(rel, os.path.join(repo_dir, rel))
        manifest = "".join(f"{f.path}\0{f.blob_id}\n" for f in files.values())
        commit = hashlib.sha1(f"llmfleet-localhub {repo_id}\n{manifest}".encode()).hexdigest()
        return RepoSnapshot(repo_id=repo_id, commit=commit, files=files)

    @staticmethod
    def _walk(repo_dir):
        for dirpath, dirnames, filenames in os.walk(repo_dir):
            dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS]
            for name in filenames:
                yield os.path.relpath(os.path.join(dirpath, name), repo_dir).replace(os.sep, "/")

    def _describe(self, rel, abspath):
        stat = os.stat(abspath)
        key = (stat.st_size, stat.st_mtime_ns)
        with self._lock:
            cached = self._hash_cache.get(abspath)
        if cached is None or cached[0] != key:
            sha256, blob_sha1 = hashlib.sha256(), hashlib.sha1(f"blob {stat.st_size}\0".encode())
            for chunk in _read_chunks(abspath):
                sha256.update(chunk)
                blob_sha1.update(chunk)
            cached = (key, sha256.hexdigest(), blob_sha1.hexdigest())
            with self._lock:
                self._hash_cache[abspath] = cached
        sha256_hex, content_blob_id = cached[1:]
        if is_lfs_path(rel, stat.st_size):
            pointer = lfs_pointer(sha256_hex, stat.st_size)
            return RepoFile(rel, abspath, stat.st_size, sha256_hex, git_blob_id(len(pointer), [pointer]), len(pointer))
        return RepoFile(rel, abspath, stat.st_size, sha256_hex, content_blob_id, None)
