# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Planning helpers of llmfleet.vllm.hf_snapshot: what is missing locally, disk space, progress.

Stdlib only (the module imports huggingface_hub itself), so everything here is unit-testable
without a hub. Sizes are the hub's real file sizes, taken from a manifest built by
``model_manifest.manifest_from_siblings``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import ssl
import stat
import tempfile
import threading
import time
from urllib.parse import urlsplit

from ansible_collections.llmfleet.vllm.plugins.module_utils.fit_check import DISK_MARGIN_FRACTION, disk_plan
from ansible_collections.llmfleet.vllm.plugins.module_utils.models_root import existing_ancestor, free_bytes, model_dirs
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_patches import load_record as load_patch_record
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_patches import original_path
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_manifest import MANIFEST_FILENAME

GB = 1000 ** 3
# huggingface_hub keeps its local_dir bookkeeping (and in-flight *.incomplete files) here.
HF_LOCAL_CACHE = os.path.join(".cache", "huggingface")
PROGRESS_RELPATH = os.path.join(".cache", "llmfleet", "progress.json")


def gb(nbytes):
    return "%.3f GB" % (nbytes / GB)


def local_state(local_dir, manifest):
    """Split the manifest's files into complete (right size on disk) and to_download.

    A file whose size differs from the hub's is listed in ``to_download`` with ``present: true``:
    it is re-fetched whole, so the planner counts its full size. A file changed by a catalog patch
    is judged by its kept hub original (model_patches).
    """
    complete, to_download = [], []
    patched = load_patch_record(local_dir)
    for entry in manifest["files"]:
        full = original_path(local_dir, entry["path"], patched)
        try:
            size = os.stat(full).st_size if os.path.isfile(full) else None
        except OSError:
            size = None
        if size == entry["size"]:
            complete.append(entry["path"])
        else:
            to_download.append({"path": entry["path"], "size": entry["size"], "present": size is not None,
                                "local_size": size})
    return complete, to_download


def prune_candidates(models_root, exclude):
    """The model directories under models_root but ``exclude`` (the download target), oldest first."""
    return model_dirs(models_root, exclude)


def space_check(local_dir, models_root, to_download_bytes, margin_bytes, free=None):
    """{ok, free_bytes, required_bytes, missing_bytes, prune_suggested, candidates, msg} for a download."""
    free = free_bytes(local_dir) if free is None else free
    candidates = prune_candidates(models_root, local_dir) if models_root else []
    # The pivot's rule too: the margin is the larger of margin_bytes and DISK_MARGIN_FRACTION of what is downloaded.
    plan = disk_plan(to_download_bytes, free, 0, candidates, [local_dir], margin_bytes, DISK_MARGIN_FRACTION)
    required = plan["required_free_bytes"]
    margin_bytes = required - to_download_bytes if to_download_bytes else margin_bytes
    missing = max(required - free, 0)
    result = {
        "ok": missing == 0,
        "free_bytes": free,
        "to_download_bytes": to_download_bytes,
        "margin_bytes": margin_bytes,
        "required_bytes": required,
        "missing_bytes": missing,
        "missing_gb": round(missing / GB, 2),
        "candidates": candidates,
        "prune_suggested": plan.get("prune", []),
        "ok_after_prune": plan.get("ok_after_prune", False),
    }
    if missing:
        listed = ", ".join("%s (%s)" % (c["path"], gb(c["size_bytes"])) for c in candidates) or "none"
        result["msg"] = (
            "not enough disk space for %s: %s missing on the filesystem of %s (need %s = %s to download + %s margin,"
            " %s free). Nothing was changed. Model dirs under %s that could be pruned (oldest first): %s.%s"
            % (local_dir, gb(missing), existing_ancestor(local_dir), gb(required), gb(to_download_bytes),
               gb(margin_bytes), gb(free), models_root, listed,
               (" Pruning %s would be enough." % ", ".join(plan["prune"])) if plan.get("prune") and plan.get("ok_after_prune")
               else " Pruning all of them would not be enough." if candidates else ""))
    return result


PUBLIC_HUB = "https://huggingface.co"
COMMIT_RE = re.compile(r"\A[0-9a-f]{40}\Z")
# Exceptions (by class name, anywhere in the chain) that mean the hub was never reached: huggingface_hub 2.x raises
# httpx's (ConnectError, ConnectTimeout, ...: TransportError), 1.x requests' ConnectionError / Timeout.
_UNREACHABLE_NAMES = {"TransportError", "NetworkError", "ConnectError", "ConnectTimeout", "TimeoutException",
                      "ProxyError", "ConnectionError", "Timeout", "OfflineModeIsEnabled"}


def _is_loopback(host):
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def endpoint_error(endpoint, token_set):
    """Why the hub client must not use ``endpoint``, or None (none given: the public hub, https).

    A hub token goes to the endpoint with every request: over plain http only to this host's loopback (a mirror
    on the same machine), never across a network in clear text.
    """
    if not endpoint:
        return None
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in endpoint):
        return ("model_fetch_hf_endpoint must be an http(s) URL such as https://hf-mirror.example.org, got %r" % (endpoint,))
    if parts.scheme == "http" and token_set and not _is_loopback(parts.hostname):
        return ("model_fetch_hf_endpoint %s is plain http and a hub token is set (model_fetch_hf_token or"
                " model_fetch_hf_token_file): the token would cross the network in clear text. Use an https:// endpoint,"
                " a mirror on this host's loopback, or no token for this mirror. Nothing was sent." % endpoint)
    return None


def hub_unreachable(exc):
    """'<Class>: <detail>' when ``exc`` (or an exception it was raised from) says the hub was never reached - connection
    refused, no route, name not resolved, timeout, TLS failure, offline mode - else None (the hub answered)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        names = {cls.__name__ for cls in type(exc).__mro__}
        if names & _UNREACHABLE_NAMES or isinstance(exc, (ConnectionError, socket.gaierror, TimeoutError, ssl.SSLError)):
            return "%s: %s" % (type(exc).__name__, str(exc).strip() or repr(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def local_commits(models_root, name):
    """[{path, revision}] of the dirs under models_root that hold ``name`` (<name>, <name>--<sha12>) with a manifest
    (written by model_fetch after a verified download) naming a commit; sorted by path."""
    found = []
    try:
        entries = sorted(os.listdir(models_root))
    except OSError:
        return found
    for entry in entries:
        if entry != name and not entry.startswith(name + "--"):
            continue
        try:
            with open(os.path.join(models_root, entry, MANIFEST_FILENAME)) as handle:
                revision = json.load(handle).get("revision")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(revision, str) and COMMIT_RE.match(revision):
            found.append({"path": os.path.join(models_root, entry), "revision": revision})
    return found


def unreachable_message(endpoint, repo_id, revision, detail, held):
    """What to tell the user when the hub could not be reached to resolve ``revision``; ``held``: local_commits()."""
    msg = ("the hub at %s could not be reached to resolve revision %s of %s (%s); this is no answer about the"
           " revision." % (endpoint or PUBLIC_HUB, json.dumps(revision), repo_id, detail))
    if held:
        where = ", ".join("commit %s in %s" % (h["revision"], h["path"]) for h in held)
        msg += (" This host holds %s: to go on without the hub, give that commit as the revision (pivot: -e revision=%s;"
                " model_fetch: model_fetch_revision) - the run then goes on offline, verifying the files on disk against"
                " their manifest - or set model_fetch_offline=true." % (where, held[-1]["revision"]))
    else:
        msg += " No copy of it is on this host, so it cannot be fetched until the hub answers."
    return msg


def manifests_equal(a, b):
    """Same repo, revision and file list (path, size, hashes), whatever the order."""
    if not a or not b:
        return False

    def key(m):
        return (m.get("repo_id"), m.get("revision"),
                sorted((f["path"], f["size"], f.get("sha256"), f.get("git_sha1")) for f in m["files"]))
    return key(a) == key(b)


def incomplete_bytes(local_dir):
    """Bytes of huggingface_hub's in-flight *.incomplete files under local_dir/.cache/huggingface."""
    total = 0
    for root, _dirs, names in os.walk(os.path.join(local_dir, HF_LOCAL_CACHE)):
        for name in names:
            if name.endswith(".incomplete"):
                try:
                    total += os.stat(os.path.join(root, name)).st_size
                except OSError:
                    pass
    return total


def read_token_file(path):
    """The token in path; refuses files readable or writable by group/others (must be 0600 or stricter)."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("token_file %s is not a regular file" % path)
    if st.st_mode & 0o077:
        raise ValueError("token_file %s has mode %04o; it must not be accessible by group or others (use 0600)"
                         % (path, stat.S_IMODE(st.st_mode)))
    with open(path, encoding="utf-8") as handle:
        token = handle.read().strip()
    if not token:
        raise ValueError("token_file %s is empty" % path)
    return token


class ProgressWriter:
    """Writes {state, bytes_done, bytes_total, files_done, files_total, ...} to a JSON file every interval seconds.

    bytes_done counts files of the plan that reached their full size plus bytes of in-flight
    *.incomplete files, so it moves while a big shard streams in.
    """

    def __init__(self, path, local_dir, planned, interval=5.0, extra=None):
        self.path, self.local_dir, self.planned, self.interval = path, local_dir, planned, interval
        self.extra = extra  # callable adding fields (the pipelined hashing's progress)
        self.bytes_total = sum(f["size"] for f in planned)
        self.started = time.time()
        self._stop = threading.Event()
        self._thread = None

    def snapshot(self, state="downloading"):
        done_bytes, done_files = 0, 0
        for entry in self.planned:
            try:
                size = os.stat(os.path.join(self.local_dir, entry["path"])).st_size
            except OSError:
                continue
            if size == entry["size"]:
                done_bytes += size
                done_files += 1
        done_bytes = min(done_bytes + incomplete_bytes(self.local_dir), self.bytes_total)
        elapsed = max(time.time() - self.started, 1e-6)
        rate = done_bytes / elapsed
        data = {"state": state, "bytes_done": done_bytes, "bytes_total": self.bytes_total,
                "files_done": done_files, "files_total": len(self.planned),
                "percent": round(100.0 * done_bytes / self.bytes_total, 1) if self.bytes_total else 100.0,
                "seconds": round(elapsed, 1), "mb_per_s": round(rate / 1e6, 2),
                "eta_s": round((self.bytes_total - done_bytes) / rate, 1) if rate > 0 else None,
                "updated": int(time.time())}
        if self.extra is not None:
            data.update(self.extra())
        return data

    def write(self, state="downloading"):
        data = self.snapshot(state)
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".progress-", dir=directory)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle)
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.path)
        return data

    def _run(self):
        while not self._stop.wait(self.interval):
            try:
                self.write()
            except OSError:
                pass

    def start(self):
        self.write("starting")
        self._thread = threading.Thread(target=self._run, name="hf-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self, state):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            return self.write(state)
        except OSError:
            return None
