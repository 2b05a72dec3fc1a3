"""Fault plan of the local hub fixture: which repo/file misbehaves how, and how many times.

JSON shape (every key optional):

    {"uplink_rate": 1048576,           # bytes per second of every file body together: the site's link to the
                                       # hub, shared by all hosts downloading at once
     "repos": {"org/name": {
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
    if not isinstance(plan, dict) or set(plan) - {"repos", "uplink_rate"}:
        raise ValueError("fault plan must be an object with only 'repos' and 'uplink_rate' keys")
    rate = plan.get("uplink_rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or rate <= 0):
        raise ValueError(f"uplink_rate must be a positive number of bytes per second, got {rate!r}")
    for repo_id, repo in plan.get("repos", {}).items():
        unknown = set(repo) - REPO_FAULT_KEYS
        if unknown:
            raise ValueError(f"{repo_id}: unknown repo fault keys {sorted(unknown)}")
        for pattern, fault in repo.get("files", {}).items():
            unknown = set(fault) - FILE_FAULT_KEYS
            if unknown:
                raise ValueError(f"{repo_id}:{pattern}: unknown file fault keys {sorted(unknown)}")
    return plan


class Uplink:
    """One rate shared by every body the hub sends (a token bucket without burst): N hosts downloading at once each
    get about 1/N of it, as behind a site's one link to the hub."""

    def __init__(self):
        self._lock = threading.Lock()
        self._free_at = 0.0

    def wait_for(self, nbytes, rate, now, sleep):
        """Block until `nbytes` more may go out at `rate` bytes/s, all senders together."""
        with self._lock:
            self._free_at = max(self._free_at, now()) + nbytes / rate
            due = self._free_at
        sleep(max(0.0, due - now()))


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

    def uplink_rate(self):
        return self.current().get("uplink_rate")

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
