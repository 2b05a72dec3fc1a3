#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: peer_copy
short_description: Copy a model from hosts that hold a verified copy, and verify it against the lock's manifest
description:
  - Pulls the files of O(manifest) (and the hub original a source kept of a file it patched, nothing else) from the
    first of O(sources) with rsync over ssh, using a per-rollout key (rsync's own
    C(rrsync) on the source limits that key to a read-only copy of its model directory) and the source's host key
    only. Each file is hashed as soon as rsync has put it in place, while the others still arrive; then the whole
    directory is verified against O(manifest) (full mode of M(llmfleet.vllm.shard_verify)), re-reading only what
    changed since it was hashed.
  - A source that fails (unreachable, killed mid-copy, stalled past O(io_timeout_s)) is followed by the next one,
    which resumes the partial files (rsync's delta against them), so the next source sends only what is missing.
  - A file that fails verification is moved to C(.cache/llmfleet/quarantine/) (nothing is deleted), the source that
    sent it is named in RV(bad_sources), and the file is fetched from the next source.
  - The manifest comes from the caller (the revision lock of a rollout), never from the source, and becomes the
    directory's C(.llmfleet-manifest.json) only once the copy is verified.
  - One copy into a directory at a time (a lock under C(.cache/llmfleet/seed/)); while another runs, nothing is
    touched and the attempt says so.
  - Ends with RV(verified) true or false; it fails only on bad input, so that the caller can fall back to the hub.
version_added: 0.9.0
author:
  - llmfleet maintainers (@llmfleet)
options:
  dest:
    description: Model directory to fill (created, 0755, when missing).
    type: path
    required: true
  manifest:
    description:
      - The manifest the copy must match (format of the C(model_manifest) module_utils), written to
        C(.llmfleet-manifest.json) in O(dest) once the copy is verified.
    type: dict
    required: true
  sources:
    description:
      - Hosts to copy from, in order; each with C(name), C(address) and C(port) (its sshd).
      - Empty checks the copy that is there (every byte read again) and moves the files that fail aside.
    type: list
    elements: dict
    required: true
  user:
    description: The account on the sources whose authorized_keys lets the key in.
    type: str
    default: llmfleet-seed
  identity_file:
    description: Private key of this host for the rollout (0600).
    type: path
    required: true
  known_hosts_file:
    description: Host keys of the sources; nothing else is trusted.
    type: path
    required: true
  bwlimit_kbps:
    description: rsync's C(--bwlimit) in KiB/s for this host's copy; 0 is none.
    type: int
    default: 0
  io_timeout_s:
    description: A source that sends nothing for this long counts as failed.
    type: int
    default: 60
  connect_timeout_s:
    description: ssh's connect timeout.
    type: int
    default: 10
  hash_workers:
    description: Files hashed at once while the copy runs. Defaults to the CPUs available.
    type: int
  rsync_path:
    description: The rsync program on this host.
    type: str
    default: rsync
  ssh_path:
    description: The ssh program on this host.
    type: str
    default: ssh
attributes:
  check_mode:
    support: full
    description: Changes nothing; says what it would copy from which sources.
  diff_mode:
    support: none
    description: Nothing to diff.
notes:
  - Needs rsync on both ends and rrsync on the sources (Debian's rsync package has both).
"""

EXAMPLES = r"""
- name: Copy the model from the peers that hold it
  llmfleet.vllm.peer_copy:
    dest: /srv/models/MiniMax-M2.5-0a1b2c3d4e5f
    manifest: "{{ lock.manifest }}"
    sources:
      - {name: gpu-01, address: 10.0.0.11, port: 22}
      - {name: gpu-02, address: 10.0.0.12, port: 22}
    identity_file: /run/llmfleet-seed/20261205T1200-ab12/id_ed25519
    known_hosts_file: /run/llmfleet-seed/20261205T1200-ab12/known_hosts
    bwlimit_kbps: 1048576
  register: copy
"""

RETURN = r"""
verified:
  description: Whether the directory matches the manifest at the end.
  returned: always
  type: bool
source:
  description: The source of the attempt that completed the copy (null when none did).
  returned: always
  type: str
attempts:
  description: One entry per source tried, in order.
  returned: always
  type: list
  elements: dict
  contains:
    source:
      description: The source's name.
      type: str
    result:
      description: C(verified), C(failed) (rsync ended with an error), C(bad) (it sent files that failed verification)
        or C(incomplete) (its copy lacked files).
      type: str
    bytes:
      description: File bytes this source sent (rsync's literal data; after a failure, what landed on disk).
      type: int
    bytes_matched:
      description: Bytes rsync did not send because the partial file of an earlier attempt held them.
      type: int
    seconds:
      description: Wall time of the attempt.
      type: float
    files:
      description: Files this source completed.
      type: list
      elements: str
    bad_files:
      description: Files from this source that failed verification (moved to quarantine).
      type: list
      elements: str
    error:
      description: rsync's error, or the verification's message.
      type: str
    rc:
      description: rsync's exit status (255 when ssh could not connect or was refused).
      type: int
bad_sources:
  description: "{source: [files]} of sources that sent files failing verification."
  returned: always
  type: dict
quarantined:
  description: Files of a check without sources that failed verification and were moved aside.
  returned: always
  type: list
  elements: str
set_aside:
  description:
    - Files of the verified directory that its manifest does not list (left by an earlier run or by hand), moved to
      C(.cache/llmfleet/extra/) so that the directory holds exactly the manifest's files; nothing is deleted.
  returned: always
  type: list
  elements: str
bytes_by_source:
  description: "{source: bytes} of file bytes each source sent."
  returned: always
  type: dict
seconds:
  description: Wall time of the copy and its verification.
  returned: always
  type: float
verify:
  description: The last verification (shard_verify's figures, without the per-file list).
  returned: when a copy finished
  type: dict
msg:
  description: What happened, in a line.
  returned: always
  type: str
"""

import errno
import fcntl
import os
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmfleet.vllm.plugins.module_utils.hash_ledger import Ledger
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_manifest import (
    MANIFEST_FILENAME, ManifestError, list_model_files, validate_manifest, write_manifest)
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_verify import (
    EXTRA_RELDIR, QUARANTINE_RELDIR, VerifyError, extras_to_set_aside, move_aside, verify_model_dir)
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_patches import ORIGINALS_RELDIR
from ansible_collections.llmfleet.vllm.plugins.module_utils.peer_seeding import (
    PARTIAL_DIR, SeedError, copy_list, finished_files, parse_stats, rsync_argv)
from ansible_collections.llmfleet.vllm.plugins.module_utils.pipelined_hashing import PipelinedHasher

SEED_STATE = ".cache/llmfleet/seed"


def bytes_on_disk(dest):
    """Bytes of the model's files plus rsync's partial files under ``dest`` (those of subdirectories are model files
    to list_model_files already)."""
    total = sum(list_model_files(dest).values()) if os.path.isdir(dest) else 0
    partial = os.path.join(dest, PARTIAL_DIR)
    if os.path.isdir(partial):
        total += sum(os.path.getsize(os.path.join(partial, name)) for name in os.listdir(partial))
    return total


def restore_originals(dest, manifest):
    """A source that patched a file sent its hub original too: put it in the file's place (the local catalog patches
    are applied again after the copy). Returns {original's path: the file's path} of what was moved."""
    moved = {}
    for entry in manifest["files"]:
        original = os.path.join(ORIGINALS_RELDIR, entry["path"])
        if os.path.isfile(os.path.join(dest, original)):
            os.replace(os.path.join(dest, original), os.path.join(dest, entry["path"]))
            moved[original] = entry["path"]
    return moved


def lock_dir(dest):
    """An exclusive lock on the directory's copy (another copy into it, e.g. of a killed run, may still be running);
    None when another holds it."""
    os.makedirs(os.path.join(dest, SEED_STATE), mode=0o755, exist_ok=True)
    handle = open(os.path.join(dest, SEED_STATE, "lock"), "a")  # pylint: disable=consider-using-with
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return None
        raise
    return handle


def _summary(verify):
    return dict((k, v) for k, v in verify.items() if k not in ("files", "failed"))


def _error_tail(text, lines=3):
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def copy_from_peers(params, run=subprocess.run):
    dest, manifest = params["dest"].rstrip("/"), params["manifest"]
    started = time.monotonic()
    os.makedirs(dest, mode=0o755, exist_ok=True)
    lock = lock_dir(dest)
    if lock is None:
        return {"changed": False, "verified": False, "source": None, "bad_sources": {}, "bytes_by_source": {},
                "quarantined": [], "set_aside": [], "seconds": 0.0, "verify": None,
                "attempts": [{"source": s["name"], "result": "failed", "rc": None, "bytes": 0, "bytes_matched": 0,
                              "files": [], "bad_files": [], "seconds": 0.0,
                              "error": "another copy into %s is still running" % dest} for s in params["sources"][:1]],
                "msg": "another copy into %s is still running (a killed run's?): not touched" % dest}
    try:
        return _copy_locked(params, dest, manifest, started, run)
    finally:
        lock.close()


def _copy_locked(params, dest, manifest, started, run):
    # The lock's manifest is what the copy is checked against; it becomes the directory's manifest (which other
    # tools read as "a verified copy of this commit") only once the copy is verified.
    check_manifest = os.path.join(dest, SEED_STATE, "manifest.json")
    write_manifest(manifest, check_manifest)
    files_from = os.path.join(dest, SEED_STATE, "files")
    with open(files_from, "w", encoding="utf-8") as handle:
        handle.write("\n".join(copy_list(manifest)) + "\n")
    ledger = Ledger(dest, fresh=True)
    attempts, brought_by, bad_sources, verify = [], {}, {}, None
    verified, source_done = False, None
    for source in params["sources"]:
        argv = rsync_argv(params["user"], source["address"], source["port"], dest, params["identity_file"],
                          params["known_hosts_file"], params["bwlimit_kbps"], params["io_timeout_s"],
                          params["connect_timeout_s"], params["rsync_path"], params["ssh_path"], files_from)
        before = bytes_on_disk(dest)
        began = time.monotonic()
        hasher = PipelinedHasher(ledger, manifest["files"], workers=params["hash_workers"]).start()
        try:
            proc = run(argv, capture_output=True, text=True, check=False)
        finally:
            hasher.stop()
        stats, files = parse_stats(proc.stdout), finished_files(proc.stdout)
        for original, path in restore_originals(dest, manifest).items():
            files[path] = files.pop(original, 0) + files.pop(path, 0)
        for path in files:
            brought_by[path] = source["name"]
        attempt = {"source": source["name"], "files": sorted(files), "bad_files": [],
                   "bytes": stats["literal"] if proc.returncode == 0 else max(0, bytes_on_disk(dest) - before),
                   "bytes_matched": stats["matched"], "seconds": 0.0, "result": "failed", "error": "",
                   "rc": proc.returncode}
        attempts.append(attempt)
        if proc.returncode != 0:
            attempt["error"] = "rsync exited %d: %s" % (proc.returncode, _error_tail(proc.stderr))
            attempt["seconds"] = round(time.monotonic() - began, 3)
            continue
        verify = verify_model_dir(dest, mode="full", manifest_path=check_manifest, ledger=ledger)
        attempt["seconds"] = round(time.monotonic() - began, 3)
        if not verify["failed"]:
            attempt["result"], verified, source_done = "verified", True, source["name"]
            break
        wrong = [path for path in verify["bad"] if path not in verify["missing"]]
        move_aside(dest, wrong, QUARANTINE_RELDIR)
        for path in wrong:
            sender = brought_by.pop(path, None)
            if sender is not None:
                bad_sources.setdefault(sender, []).append(path)
                for earlier in attempts:
                    if earlier["source"] == sender and path in earlier["files"]:
                        earlier["bad_files"].append(path)
                        earlier["result"] = "bad"
        if attempt["result"] != "bad":
            attempt["result"] = "incomplete"
        attempt["error"] = verify["msg"]
    quarantined = []
    if not params["sources"]:
        # No source: check the copy that is there (left by an earlier run, or of a source named bad).
        verify = verify_model_dir(dest, mode="full", manifest_path=check_manifest, ledger=ledger)
        verified = not verify["failed"]
        quarantined = [path for path in verify["bad"] if path not in verify["missing"]]
        move_aside(dest, quarantined, QUARANTINE_RELDIR)
    set_aside = []
    if verified:
        # The directory holds exactly the manifest's files: what an earlier run or a hand left beside them goes aside.
        set_aside = move_aside(dest, extras_to_set_aside(verify["extra"]), EXTRA_RELDIR)
        write_manifest(manifest, os.path.join(dest, MANIFEST_FILENAME))
    bytes_by_source = {}
    for attempt in attempts:
        bytes_by_source[attempt["source"]] = bytes_by_source.get(attempt["source"], 0) + attempt["bytes"]
    tried = ", ".join("%s (%s)" % (a["source"], a["result"]) for a in attempts) or "no source"
    return {
        "changed": any(a["files"] for a in attempts) or bool(sum(bytes_by_source.values())) or bool(bad_sources)
        or bool(quarantined) or bool(set_aside), "quarantined": quarantined, "set_aside": set_aside,
        "verified": verified, "source": source_done, "attempts": attempts, "bad_sources": bad_sources,
        "bytes_by_source": bytes_by_source, "seconds": round(time.monotonic() - started, 3),
        "verify": _summary(verify) if verify else None,
        "msg": "%s %s after %s" % (dest, "verified" if verified else "NOT verified",
                                   tried if params["sources"] else "checking what is there: %s" % verify["msg"]),
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            manifest=dict(type="dict", required=True),
            sources=dict(type="list", elements="dict", required=True),
            user=dict(type="str", default="llmfleet-seed"),
            identity_file=dict(type="path", required=True),
            known_hosts_file=dict(type="path", required=True),
            bwlimit_kbps=dict(type="int", default=0),
            io_timeout_s=dict(type="int", default=60),
            connect_timeout_s=dict(type="int", default=10),
            hash_workers=dict(type="int"),
            rsync_path=dict(type="str", default="rsync"),
            ssh_path=dict(type="str", default="ssh"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        validate_manifest(params["manifest"])
        for source in params["sources"]:
            if not isinstance(source, dict) or not {"name", "address", "port"} <= set(source):
                raise SeedError("each source needs name, address and port, got %r" % (source,))
        if params["bwlimit_kbps"] < 0 or params["io_timeout_s"] < 1 or params["connect_timeout_s"] < 1:
            raise SeedError("bwlimit_kbps must be >= 0, io_timeout_s and connect_timeout_s >= 1")
    except (ManifestError, SeedError) as exc:
        module.fail_json(msg=str(exc))
    if module.check_mode:
        module.exit_json(changed=True, verified=False, source=None, attempts=[], bad_sources={}, bytes_by_source={},
                         quarantined=[], set_aside=[],
                         seconds=0.0, msg="would copy %s from %s" % (
                             params["dest"], ", ".join(s["name"] for s in params["sources"]) or "no source"))
    try:
        result = copy_from_peers(params)
    except (OSError, SeedError, VerifyError, ManifestError) as exc:
        module.fail_json(msg="copy into %s failed: %s" % (params["dest"], exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
