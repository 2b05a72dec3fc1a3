# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The model manifest: what a downloaded model directory must contain, byte for byte.

Written next to the weights as ``.llmfleet-manifest.json`` by the download step and read
by ``llmfleet.vllm.shard_verify``. Format 1::

    {
      "format": 1,
      "repo_id": "zai-org/GLM-4.5-Air",        # null for a model copied in by hand
      "revision": "a1b2c3...",                 # commit sha the files came from, or null
      "files": [
        {"path": "model-00001-of-00047.safetensors",   # relative, "/"-separated
         "size": 4993365104,                           # bytes
         "sha256": "9f86d0...",                        # LFS files: sha256 of the content
         "git_sha1": "1c2b3a..."},                     # git blob id (of the LFS pointer for LFS files)
        {"path": "config.json", "size": 1234, "sha256": null, "git_sha1": "e69de2..."}
      ]
    }

Hub metadata (``HfApi.model_info(repo_id, revision=..., files_metadata=True).siblings``)
gives every file's ``rfilename``, ``size``, ``blob_id`` and, for LFS files, ``lfs.sha256``.
Small non-LFS files have no sha256 there; their expected hash is the git blob id,
sha1(b"blob <size>\\0" + content), which full verification checks instead.
This module is stdlib-only: siblings may be plain dicts or huggingface_hub objects.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import tempfile
from collections.abc import Mapping

from ansible_collections.llmfleet.vllm.plugins.module_utils.file_hashing import SHA256, hash_files

MANIFEST_FILENAME = ".llmfleet-manifest.json"
MANIFEST_FORMAT = 1
# huggingface_hub's local_dir download keeps its bookkeeping under .cache/huggingface/.
DEFAULT_IGNORE_PATTERNS = (MANIFEST_FILENAME, ".cache/*")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}\Z")
_SHA1_HEX = re.compile(r"^[0-9a-f]{40}\Z")


class ManifestError(ValueError):
    pass


def _field(record, name):
    if isinstance(record, Mapping):
        return record.get(name)
    return getattr(record, name, None)


def manifest_from_siblings(repo_id, revision, siblings):
    """Build a manifest from hub siblings (``rfilename``, ``size``, ``blob_id``, ``lfs``)."""
    files = []
    for sibling in siblings:
        path = _field(sibling, "rfilename")
        lfs = _field(sibling, "lfs")
        size = _field(lfs, "size") if lfs else _field(sibling, "size")
        if size is None:
            raise ManifestError("no size for %s: fetch model_info with files_metadata=True" % path)
        files.append({
            "path": path,
            "size": size,
            "sha256": _field(lfs, "sha256") if lfs else None,
            "git_sha1": _field(sibling, "blob_id"),
        })
    return validate_manifest({"format": MANIFEST_FORMAT, "repo_id": repo_id, "revision": revision, "files": files})


def is_ignored(path, ignore_patterns):
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in ignore_patterns)


def list_model_files(model_dir, ignore_patterns=DEFAULT_IGNORE_PATTERNS):
    """{relative "/"-separated path: size} of the files under ``model_dir`` (symlinks followed).

    Paths matching an ``ignore_patterns`` glob are left out; a dangling symlink is left
    out too, so an expected file behind it counts as missing.
    """
    found = {}
    for root, dirs, names in os.walk(model_dir):
        dirs.sort()
        for name in sorted(names):
            full_path = os.path.join(root, name)
            path = os.path.relpath(full_path, model_dir).replace(os.sep, "/")
            if is_ignored(path, ignore_patterns) or not os.path.isfile(full_path):
                continue
            found[path] = os.stat(full_path).st_size
    return found


def manifest_from_directory(model_dir, workers=None, ignore_patterns=DEFAULT_IGNORE_PATTERNS, repo_id=None, revision=None):
    """Build a manifest from the files now in ``model_dir`` (sha256 of every file).

    For models copied in by hand: it records what is there, so it proves later integrity,
    not that the copy was right in the first place.
    """
    sizes = list_model_files(model_dir, ignore_patterns)
    paths = sorted(sizes)
    jobs = [(os.path.join(model_dir, p), SHA256, sizes[p]) for p in paths]
    results = hash_files(jobs, workers=workers)
    files = []
    for path, (full_path, _algorithm, _size) in zip(paths, jobs):
        result = results[full_path]
        if result.error:
            raise ManifestError("cannot read %s: %s" % (path, result.error))
        files.append({"path": path, "size": result.bytes_read, "sha256": result.digest, "git_sha1": None})
    return validate_manifest({"format": MANIFEST_FORMAT, "repo_id": repo_id, "revision": revision, "files": files})


def validate_manifest(manifest):
    """Return ``manifest`` if it is a well-formed format-1 manifest, else raise ManifestError."""
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise ManifestError("not a format %d manifest" % MANIFEST_FORMAT)
    files = manifest.get("files")
    if not isinstance(files, list):
        raise ManifestError("manifest has no files list")
    seen = set()
    for entry in files:
        path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
            raise ManifestError("invalid manifest path %r" % (path,))
        if path in seen:
            raise ManifestError("duplicate manifest path %s" % path)
        seen.add(path)
        size = entry.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError("invalid size %r for %s" % (size, path))
        for key, pattern in (("sha256", _SHA256_HEX), ("git_sha1", _SHA1_HEX)):
            value = entry.get(key)
            if value is not None and not (isinstance(value, str) and pattern.match(value)):
                raise ManifestError("invalid %s %r for %s" % (key, value, path))
    return manifest


def lock_problem(manifest, repo_id, commit):
    """Why ``manifest`` (a mapping, or its JSON text) may not enter the revision lock of ``repo_id`` at ``commit``, or ''.
    A rollout reads it back from the one host that downloaded (issue 43): the fleet copies and verifies against it, so it
    must be well formed and name the locked commit and repo before it is trusted."""
    if isinstance(manifest, (str, bytes)):
        try:
            manifest = json.loads(manifest)
        except ValueError as exc:
            return "it is not JSON (%s)" % exc
    try:
        validate_manifest(manifest)
    except ManifestError as exc:
        return str(exc)
    unhashed = [f["path"] for f in manifest["files"] if not f.get("sha256") and not f.get("git_sha1")]
    if unhashed:  # a file the fleet could check by its size alone
        return "it gives no hash for %s" % ", ".join(unhashed[:5])
    if manifest.get("revision") != commit:
        return "its revision is %s, not the locked commit %s" % (json.dumps(manifest.get("revision")), commit)
    if repo_id and manifest.get("repo_id") != repo_id:
        return "its repo is %s, not %s" % (json.dumps(manifest.get("repo_id")), repo_id)
    return ""


def load_manifest(path):
    try:
        with open(path, "rb") as handle:
            manifest = json.load(handle)
    except ValueError as exc:
        raise ManifestError("manifest %s is not valid JSON: %s" % (path, exc)) from None
    return validate_manifest(manifest)


def write_manifest(manifest, path):
    """Write ``manifest`` to ``path`` atomically (temp file + rename)."""
    validate_manifest(manifest)
    directory = os.path.dirname(os.path.abspath(path))
    fd, temp_path = tempfile.mkstemp(prefix=".manifest-", dir=directory)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(manifest, handle, indent=1, sort_keys=True)
            handle.write("\n")
        os.replace(temp_path, path)
    except BaseException:
        if os.path.exists(temp_path):
            os.unlink(temp_path)
        raise
