"""Fault plan of the local hub fixture: which repo/file misbehaves how, and how many times.

JSON shape (every key optional):

    {"repos": {"org/name": {
        "token": "hf_secret",          # gated: resolve needs "Authorization: Bearer hf_secret"
        "api_status": 500,             # /api/models/... answers this status
        "files": {"model-0000*.safetensors": {   # fnmatch pattern on the path in the repo
            "corrupt": true,           # flip one byte (at "corrupt_offset", default size // 2);
                                       # metadata still gives the original sha256 and size
            "drop_at": 4096,           # close the connection when the body reaches this file offset
            "drop_times": 1,           # ... for the first N GETs only (absent/null: every GET)
            "status": 500,             # HEAD/GET resolve answers this status
            "status_times": 1,         # ... for the first N requests only (absent/null: always)
            "rate": 65536              # serve at most this many bytes per second
        }}}}}

Counters for *_times start from zero whenever a new plan is loaded.
"""
import fnmatch
import json
import os
import threading

FILE_FAULT_KEYS = {"corrupt", "corrupt_offset", "drop_at", "drop_times", "status", "status_times", "rate"}
REPO_FAULT_KEYS = {"token", "api_status", "files"}
TRIGGER_KEYS = {"drop": "drop_at", "status": "status"}  # fault kind -> the key that switches it on


def validate(plan):
    """Raise ValueError on keys the fixture does not know, so a typo cannot silently disable a fault."""
    if not isinstance(plan, dict) or set(plan) - {"repos"}:
        raise ValueError("fault plan must be an object with only a 'repos' key")
    for repo_id, repo in plan.get("repos", {}).items():
        unknown = set(repo) - REPO_FAULT_KEYS
        if unknown:
            raise ValueError(f"{repo_id}: unknown repo fault keys {sorted(unknown)}")
        for pattern, fault in repo.get("files", {}).items():
            unknown = set(fault) - FILE_FAULT_KEYS
            if unknown:
                raise ValueError(f"{repo_id}:{pattern}: unknown file fault keys {sorted(unknown)}")
    return plan


class FaultPlan:
    """Thread-safe holder of the current plan; optionally re-read from a file when it changes."""

    def __init__(self, path=None):
        self._path = path
        self._file_stamp = None
        self._plan = {}
        self._counters = {}
        self._lock = threading.Lock()

    def replace(self, plan):
        validate(plan)
        with self._lock:
            self._plan, self._counters = plan, {}

    def current(self):
        with self._lock:
            self._reload_file_if_changed()
            return self._plan

    def _reload_file_if_changed(self):
        if self._path is None:
            return
        try:
            stat = os.stat(self._path)
        except FileNotFoundError:
            stamp, plan = None, {}
        else:
            stamp = (stat.st_mtime_ns, stat.st_size)
            if stamp == self._file_stamp:
                return
            with open(self._path, encoding="utf-8") as handle:
                plan = validate(json.load(handle))
        if stamp != self._file_stamp:
            self._file_stamp, self._plan, self._counters = stamp, plan, {}

    def repo_faults(self, repo_id):
        return self.current().get("repos", {}).get(repo_id, {})

    def file_faults(self, repo_id, path):
        """Merged faults of every pattern matching path, each tagged with its pattern for counting."""
        merged = {}
        for pattern, fault in self.repo_faults(repo_id).get("files", {}).items():
            if fnmatch.fnmatchcase(path, pattern):
                merged.update({key: (pattern, value) for key, value in fault.items()})
        return merged

    def take(self, repo_id, path, faults, kind):
        """Whether fault `kind` ("drop" or "status") applies to this request; counts it if so."""
        trigger = TRIGGER_KEYS[kind]
        if trigger not in faults:
            return False
        pattern = faults[trigger][0]
        limit = faults[f"{kind}_times"][1] if f"{kind}_times" in faults else None
        counter = (repo_id, path, pattern, kind)
        with self._lock:
            used = self._counters.get(counter, 0)
            if limit is not None and used >= limit:
                return False
            self._counters[counter] = used + 1
        return True
