# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Check a model directory is complete and intact before anything loads it.

``fast`` reads only sizes and headers: index and manifest completeness, numbered part
sets, safetensors tensor layout, GGUF headers, required files. ``full`` adds a hash of
every file that the manifest gives a hash for. A file changed by a catalog patch
(model_patches) is checked against its patch record, and its kept original against the
manifest. Nothing here writes to the directory.
"""

from __future__ import annotations

import json
import os
import shutil
import time

from ansible_collections.llmfleet.vllm.plugins.module_utils.file_hashing import (
    DEFAULT_BUFFER_BYTES, GIT_BLOB_SHA1, SHA256, default_workers, hash_files)
from ansible_collections.llmfleet.vllm.plugins.module_utils.gguf import (
    GGUFError, check_split_metadata, inspect_gguf, missing_split_parts)
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_patches import load_record as load_patch_record
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_manifest import (
    DEFAULT_IGNORE_PATTERNS, MANIFEST_FILENAME, ManifestError, list_model_files, load_manifest)
from ansible_collections.llmfleet.vllm.plugins.module_utils.safetensors_header import (
    SafetensorsHeaderError, inspect_safetensors)

MODES = ("fast", "full")
STATUSES = ("ok", "missing", "truncated", "oversize", "corrupt", "hash_mismatch", "header_invalid")
INDEX_SUFFIX = ".safetensors.index.json"
# "a|b" means any one of them will do.
DEFAULT_REQUIRED_FILES = ("config.json", "tokenizer_config.json|tokenizer.json|tokenizer.model")
MIB = 1024 * 1024


# Where files are moved aside in a model directory (under .cache/, which verification skips): nothing is deleted.
QUARANTINE_RELDIR = ".cache/llmfleet/quarantine"  # failed verification; fetched or copied again
EXTRA_RELDIR = ".cache/llmfleet/extra"  # not in the manifest: a loader may pick a file up by its presence


def extras_to_set_aside(extra):
    """Of verify_model_dir's ``extra``, what may be moved aside: never the directory's manifest or what lies under
    .cache/ (the collection's own state), whatever ignore patterns a caller gave."""
    return [path for path in extra if path != MANIFEST_FILENAME and not path.startswith(".cache/")]


def move_aside(model_dir, paths, reldir):
    """Move each of ``paths`` (relative to model_dir) to model_dir/reldir/<path>, a numbered name (``.~N~``) when one of
    that name is there already; returns the paths moved."""
    moved = []
    for path in paths:
        target = os.path.join(model_dir, reldir, path)
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        candidate, number = target, 0
        while os.path.lexists(candidate):
            number += 1
            candidate = "%s.~%d~" % (target, number)
        shutil.move(os.path.join(model_dir, path), candidate)
        moved.append(path)
    return moved


class VerifyError(Exception):
    """The verification itself could not run (bad arguments, unreadable manifest)."""


class FileCheck:
    def __init__(self, path, size, expected_size):
        self.path = path
        self.size = size
        self.expected_size = expected_size
        self.status = "ok"
        self.reason = ""
        self.seconds = 0.0
        self.hash_algorithm = None
        self.hash_checked = False

    def fail(self, status, reason):
        # The first problem found explains the file best; later ones are usually its echo.
        if self.status == "ok":
            self.status, self.reason = status, reason

    def as_dict(self):
        return {
            "path": self.path, "size": self.size, "expected_size": self.expected_size,
            "status": self.status, "reason": self.reason, "seconds": round(self.seconds, 6),
            "hash_algorithm": self.hash_algorithm, "hash_checked": self.hash_checked,
        }


def resolve_manifest(model_dir, manifest_path=None):
    """Load the manifest at ``manifest_path``, else the one in ``model_dir`` if present, else None."""
    if manifest_path is None:
        default = os.path.join(model_dir, MANIFEST_FILENAME)
        if not os.path.exists(default):
            return None, None
        manifest_path = default
    if not os.path.isfile(manifest_path):
        raise VerifyError("manifest %s does not exist" % manifest_path)
    try:
        return manifest_path, load_manifest(manifest_path)
    except (OSError, ManifestError) as exc:
        raise VerifyError("cannot use manifest %s: %s" % (manifest_path, exc)) from None


def verify_model_dir(model_dir, mode="fast", manifest_path=None, required_files=None, workers=None,
                     fail_on_extra=False, ignore_patterns=DEFAULT_IGNORE_PATTERNS,
                     buffer_bytes=DEFAULT_BUFFER_BYTES, ledger=None):
    """Verify ``model_dir``; return the shard_verify result dict (``failed`` and ``msg`` included).

    ledger -- a hash_ledger.Ledger: in full mode a file it holds a digest for, unchanged since, is not read again.
    """
    started = time.monotonic()
    if mode not in MODES:
        raise VerifyError("mode must be one of %s" % ", ".join(MODES))
    if not os.path.isdir(model_dir):
        raise VerifyError("model directory %s does not exist" % model_dir)
    manifest_path, manifest = resolve_manifest(model_dir, manifest_path)
    if mode == "full" and manifest is None:
        raise VerifyError("mode=full needs a manifest with expected hashes; none at %s"
                          % os.path.join(model_dir, MANIFEST_FILENAME))
    present = list_model_files(model_dir, ignore_patterns)
    entries = {entry["path"]: entry for entry in manifest["files"]} if manifest else {}
    survey = _Survey(model_dir, present, entries)
    survey.expect_indexed_shards()
    survey.expect_required(_required_files(required_files, present))
    survey.expect_numbered_parts()
    survey.check_files()
    hashing = survey.hash_files(workers, buffer_bytes, ledger) if mode == "full" else _HashTotals(0, 0.0, 0)
    extra = survey.extra(bool(manifest))
    return _result(model_dir, mode, manifest_path, survey, extra, hashing, fail_on_extra, started)


def _required_files(required_files, present):
    if required_files is not None:
        return list(required_files)
    has_gguf = any(p.endswith(".gguf") for p in present)
    has_safetensors = any(p.endswith(".safetensors") for p in present)
    # A GGUF carries its config and tokenizer inside; only HF-layout models need the side files.
    return [] if has_gguf and not has_safetensors else list(DEFAULT_REQUIRED_FILES)


class _HashTotals:
    def __init__(self, bytes_hashed, seconds, workers, bytes_from_ledger=0, files_from_ledger=0):
        self.bytes_hashed = bytes_hashed
        self.seconds = seconds
        self.workers = workers
        self.bytes_from_ledger = bytes_from_ledger
        self.files_from_ledger = files_from_ledger


class _Survey:
    """What the directory holds against what the manifest, indexes and conventions expect."""

    def __init__(self, model_dir, present, manifest_entries):
        self.model_dir = model_dir
        self.present = present
        self.manifest_entries = manifest_entries
        # path -> why it is expected (shown when it is missing)
        self.expected = {path: "listed in the manifest" for path in manifest_entries}
        self.index_tensors = {}
        self.checks = {}
        # Patched files whose kept original is there: the live file is what the patch wrote.
        self.patched = {path: entry for path, entry in load_patch_record(model_dir).items()
                        if path in present and os.path.isfile(os.path.join(model_dir, entry.get("original", "")))}

    def check(self, path):
        if path not in self.checks:
            entry = self.manifest_entries.get(path)
            expected = self.patched[path]["patched_size"] if path in self.patched else entry["size"] if entry else None
            self.checks[path] = FileCheck(path, self.present.get(path), expected)
        return self.checks[path]

    def expect(self, path, why):
        self.expected.setdefault(path, why)

    def expect_indexed_shards(self):
        for index_path in sorted(p for p in self.present if p.endswith(INDEX_SUFFIX)):
            self.expect(index_path, "safetensors index")
            check = self.check(index_path)
            started = time.monotonic()
            weight_map = self._read_weight_map(index_path, check)
            check.seconds += time.monotonic() - started
            base = os.path.dirname(index_path)
            for tensor, shard in sorted(weight_map.items()):
                shard_path = os.path.normpath(os.path.join(base, shard)).replace(os.sep, "/")
                self.expect(shard_path, "named by %s" % index_path)
                self.index_tensors.setdefault(shard_path, set()).add(tensor)

    def _read_weight_map(self, index_path, check):
        try:
            with open(os.path.join(self.model_dir, index_path), "rb") as handle:
                index = json.load(handle)
        except (OSError, ValueError) as exc:
            check.fail("corrupt", "index is not readable JSON: %s" % exc)
            return {}
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            check.fail("corrupt", "index has no weight_map of tensor -> file name")
            return {}
        return weight_map

    def expect_required(self, required_files):
        for alternatives in required_files:
            names = [name for name in alternatives.split("|") if name]
            found = [name for name in names if name in self.present]
            for name in found or names[:1]:
                self.expect(name, "required file" if len(names) == 1
                            else "required file (any of %s)" % ", ".join(names))

    def expect_numbered_parts(self):
        for path in missing_split_parts(self.present):
            self.expect(path, "part of a numbered %s set" % os.path.splitext(path)[1])

    def check_files(self):
        weights = {p for p in self.present if p.endswith((".safetensors", ".gguf"))}
        for path in sorted(set(self.expected) | weights):
            check = self.check(path)
            if path not in self.present:
                check.fail("missing", "%s but absent" % self.expected[path])
                continue
            started = time.monotonic()
            self._check_size(check)
            try:
                self._check_content(path, check)
            except OSError as exc:
                check.fail("corrupt", "unreadable: %s" % exc)
            check.seconds += time.monotonic() - started

    @staticmethod
    def _check_size(check):
        if check.expected_size is None or check.size == check.expected_size:
            return
        if check.size < check.expected_size:
            check.fail("truncated", "%d bytes, expected %d (%d short)"
                       % (check.size, check.expected_size, check.expected_size - check.size))
        else:
            check.fail("oversize", "%d bytes, expected %d (%d over)"
                       % (check.size, check.expected_size, check.size - check.expected_size))

    def _check_content(self, path, check):
        full_path = os.path.join(self.model_dir, path)
        if path.endswith(".safetensors"):
            try:
                tensors = inspect_safetensors(full_path)
            except SafetensorsHeaderError as exc:
                check.fail(exc.status, exc.reason)
                return
            absent = self.index_tensors.get(path, set()).difference(tensors)
            if absent:
                check.fail("corrupt", "%d tensor(s) the index puts here are not in the header, e.g. %s"
                           % (len(absent), sorted(absent)[0]))
        elif path.endswith(".gguf"):
            try:
                check_split_metadata(path, inspect_gguf(full_path, check.size))
            except GGUFError as exc:
                check.fail(exc.status, exc.reason)
        elif path.rsplit("/", 1)[-1] == "config.json":
            try:
                with open(full_path, "rb") as handle:
                    json.load(handle)
            except ValueError as exc:
                check.fail("corrupt", "not valid JSON: %s" % exc)

    def _hash_targets(self, path, entry):
        """(file, algorithm, expected digest, what) to hash for one manifest entry."""
        algorithm = SHA256 if entry.get("sha256") else GIT_BLOB_SHA1 if entry.get("git_sha1") else None
        hub_digest = entry["sha256"] if algorithm == SHA256 else entry.get("git_sha1")
        patch = self.patched.get(path)
        if not patch:
            return [(os.path.join(self.model_dir, path), algorithm, hub_digest, "")] if algorithm else []
        targets = [(os.path.join(self.model_dir, path), SHA256, patch["patched_sha256"], "patched file: ")]
        if algorithm:
            targets.append((os.path.join(self.model_dir, patch["original"]), algorithm, hub_digest,
                            "kept original %s: " % patch["original"]))
        return targets

    def _from_ledger(self, ledger, path, full_path, algorithm, digest, what):
        """True when the ledger settles this target (a digest taken during the download, file unchanged since)."""
        if ledger is None or full_path != os.path.join(self.model_dir, path):
            return False
        recorded = ledger.digest(path, algorithm)
        if recorded is None:
            return False
        check = self.check(path)
        if recorded != digest:
            check.fail("hash_mismatch", "%s%s %s (hashed while downloading), expected %s" % (what, algorithm, recorded, digest))
        elif check.status == "ok":
            check.hash_checked = True
        return True

    def hash_files(self, workers, buffer_bytes, ledger=None):
        jobs, expected = [], {}
        from_ledger = [0, 0]
        for path, entry in self.manifest_entries.items():
            check = self.check(path)
            targets = self._hash_targets(path, entry)
            check.hash_algorithm = targets[-1][1] if targets else None
            # A file already known bad would only burn disk time.
            if check.status == "ok":
                for full_path, algorithm, digest, what in targets:
                    if self._from_ledger(ledger, path, full_path, algorithm, digest, what):
                        from_ledger[0] += 1
                        from_ledger[1] += check.size
                        continue
                    jobs.append((full_path, algorithm, os.path.getsize(full_path)))
                    expected[full_path] = (path, digest, what)
        workers = workers or default_workers()
        started = time.monotonic()
        results = hash_files(jobs, workers=workers, buffer_bytes=buffer_bytes)
        seconds = time.monotonic() - started
        bytes_hashed = 0
        for full_path, (path, digest, what) in sorted(expected.items()):
            result = results.get(full_path)
            if result is None:
                continue
            check = self.check(path)
            check.seconds += result.seconds
            bytes_hashed += result.bytes_read
            if result.error:
                check.fail("corrupt", "%sunreadable: %s" % (what, result.error))
            elif result.digest != digest:
                check.fail("hash_mismatch", "%s%s %s, expected %s" % (what, result.algorithm, result.digest, digest))
            elif check.status == "ok":
                check.hash_checked = True
        return _HashTotals(bytes_hashed, seconds, min(workers, max(1, len(jobs))), from_ledger[1], from_ledger[0])

    def extra(self, has_manifest):
        if has_manifest:
            return sorted(p for p in self.present if p not in self.expected)
        if not self.index_tensors:
            return []
        # Without a manifest only an index can tell a shard is unexpected.
        return sorted(p for p in self.present if p.endswith(".safetensors") and p not in self.expected)


def _result(model_dir, mode, manifest_path, survey, extra, hashing, fail_on_extra, started):
    files = [survey.checks[path] for path in sorted(survey.checks)]
    bad = [check for check in files if check.status != "ok"]
    seconds = time.monotonic() - started
    problems = ["%s: %s (%s)" % (check.path, check.status, check.reason) for check in bad]
    if fail_on_extra and extra:
        problems.extend("%s: extra (not in the manifest or index)" % path for path in extra)
    if problems:
        msg = "model %s failed %s verification, %d problem(s): %s" % (
            model_dir, mode, len(problems), "; ".join(problems))
    else:
        msg = "model %s passed %s verification (%d files)" % (model_dir, mode, len(files))
    return {
        "failed": bool(problems),
        "msg": msg,
        "mode": mode,
        "model_dir": model_dir,  # not "path": AnsibleModule would add stat fields (mode, size...)
        "manifest": manifest_path,
        "files": [check.as_dict() for check in files],
        "bad": [check.path for check in bad],
        "missing": [check.path for check in bad if check.status == "missing"],
        "extra": extra,
        "total_bytes": sum(survey.present.values()),
        "bytes_hashed": hashing.bytes_hashed,
        "bytes_hashed_while_downloading": hashing.bytes_from_ledger,
        "files_hashed_while_downloading": hashing.files_from_ledger,
        "hash_seconds": round(hashing.seconds, 6),
        "workers": hashing.workers,
        "seconds": round(seconds, 6),
        "throughput_mib_s": round(hashing.bytes_hashed / MIB / seconds, 1) if seconds > 0 else 0.0,
    }
