#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_snapshot
short_description: Download a pinned Hugging Face model snapshot into a directory, after a real disk-space check
description:
  - Reads the repo's file list with real sizes and hashes (C(model_info(files_metadata=True))), applies
    O(allow_patterns) / O(ignore_patterns) the way C(snapshot_download) does, and compares it with what is
    already in O(local_dir).
  - Fails before changing anything when the filesystem lacks the bytes still to download plus O(space_margin_bytes),
    saying how many GB are missing and which model directories under O(models_root) could be pruned (with sizes).
    It never deletes anything.
  - Downloads with C(huggingface_hub.snapshot_download) pinned to the commit the revision resolved to, then
    writes the C(.llmfleet-manifest.json) manifest (see the C(model_manifest) module_utils) that
    M(llmfleet.vllm.shard_verify) checks against.
  - When every file is present with its hub size and the manifest already matches, nothing is fetched and
    the task reports no change. A file whose size differs from the hub's is fetched again whole.
  - Runs on the target and needs C(huggingface_hub) in the interpreter that runs it (the C(model_fetch) role
    installs a small venv for this), except with O(offline=true), which only reads the local manifest.
version_added: 0.1.0
author:
  - llmfleet maintainers (@llmfleet)
options:
  repo_id:
    description: Hub repo id C(owner/name). Required unless O(offline=true).
    type: str
  revision:
    description: Branch, tag or commit sha; the download is pinned to the commit it resolves to.
    type: str
    default: main
  local_dir:
    description: Directory the files go to (created when missing).
    type: path
    required: true
  allow_patterns:
    description: Only files matching one of these globs (C(snapshot_download) semantics; C(*) crosses C(/)).
    type: list
    elements: str
  ignore_patterns:
    description: Files matching one of these globs are skipped.
    type: list
    elements: str
  max_workers:
    description: Files downloaded at once.
    type: int
    default: 8
  token:
    description: Hub token. Never logged or returned.
    type: str
  token_file:
    description:
      - File on the target holding the hub token. It must not be readable by group or others (mode C(0600)).
      - Used when O(token) is not given.
    type: path
  endpoint:
    description:
      - Hub endpoint (a mirror); C(HF_ENDPOINT) semantics. Defaults to the public hub.
      - With a token (O(token), O(token_file)) a plain C(http://) endpoint is refused unless it is this host's loopback
        (the token would cross the network in clear text); nothing is sent.
    type: str
  offline:
    description:
      - Never touch the network. Reports what the existing manifest in O(local_dir) lists and what of it is
        missing; fails without a manifest. Does not need C(huggingface_hub).
    type: bool
    default: false
  space_margin_bytes:
    description: Bytes that must stay free on the filesystem after the download.
    type: int
    default: 0
  check_space:
    description:
      - Fail when the filesystem lacks the bytes still to download plus O(space_margin_bytes). V(false) only reports
        RV(space), for a caller that plans the space itself (the pivot role, which may prune first); a download
        still checks the space before it starts.
    type: bool
    default: true
  models_root:
    description: Directory whose model dirs are listed as prune candidates when space is short. Defaults to the parent of O(local_dir).
    type: path
  resolve_only:
    description:
      - Only resolve O(revision) to the commit it points to (RV(revision)); list, plan and download nothing. Fails,
        naming the revision, when the hub does not know it.
      - When the hub cannot be reached (refused, unresolved, timed out) and O(revision) is a commit a directory under
        O(models_root) (C(<name>) or C(<name>--<sha12>)) holds by its manifest, returns it with RV(offline=true) (the
        caller goes on without the hub); otherwise fails saying the hub could not be reached and which commits this
        host holds.
    type: bool
    default: false
  progress_interval:
    description:
      - Seconds between updates of the progress file C(<local_dir>/.cache/llmfleet/progress.json)
        (bytes done and total, files, rate, ETA, and what was hashed so far) written while downloading.
    type: float
    default: 5
  hash_while_downloading:
    description:
      - Hash each file of the manifest (sha256, else git's blob sha1) as soon as it is complete (its final name with
        the hub's size), with O(hash_workers) threads, while the other files still download, and record each digest
        with the file's identity then (device, inode, size, mtime, ctime) in C(<local_dir>/.cache/llmfleet/hashed.json).
      - M(llmfleet.vllm.shard_verify) with O(llmfleet.vllm.shard_verify#module:use_download_hashes=true) then only hashes
        what was not hashed yet or changed since, so the verification after the last byte takes the last shard or two.
    type: bool
    default: true
  hash_workers:
    description: Threads hashing during the download; default the CPUs available to the module.
    type: int
  owner:
    description:
      - User each file of the manifest gets once complete, before it is hashed (a later C(chown) would change its ctime
        and the digest would no longer count). Unset leaves owners as they are.
    type: str
  group:
    description: Group each file of the manifest gets once complete, before it is hashed; unset leaves groups alone.
    type: str
  etag_timeout:
    description: Seconds to wait for the hub's metadata answers.
    type: float
    default: 10
attributes:
  check_mode:
    description: Reads hub metadata and reports what would be downloaded (RV(to_download), RV(bytes_to_download)) without downloading.
  diff_mode:
    description: No diff.
extends_documentation_fragment:
  - llmfleet.vllm.attributes
notes:
  - C(huggingface_hub) 2.4 resumes a transfer whose connection drops within the same run with an HTTP Range request
    from the last 10 MiB chunk it wrote; across runs it keeps completed files and fetches the interrupted file again
    from its start.
seealso:
  - module: llmfleet.vllm.shard_verify
"""

EXAMPLES = r"""
- name: Download a pinned model with a 20 GB margin
  llmfleet.vllm.hf_snapshot:
    repo_id: MiniMaxAI/MiniMax-M2.5
    revision: 3f1c0b6d5e0f4b7a8e2d1c9b8a7f6e5d4c3b2a10
    local_dir: /srv/models/minimax-m25
    allow_patterns: ['*.json', '*.safetensors', '*.py', '*.jinja']
    token_file: /etc/llmfleet/hf_token
    space_margin_bytes: 20000000000
  vars:
    ansible_python_interpreter: /opt/llmfleet-hf/bin/python

- name: What would be fetched (check mode)
  llmfleet.vllm.hf_snapshot:
    repo_id: llmfleet-test/tiny-llama-a
    local_dir: /srv/models/tiny-llama-a
    endpoint: http://127.0.0.1:18080
  check_mode: true
  register: plan
"""

RETURN = r"""
path:
  description: The model directory.
  returned: always
  type: str
repo_id:
  description: Repo the files come from (from the manifest in offline mode).
  returned: always
  type: str
revision:
  description: Commit sha the download is pinned to.
  returned: always
  type: str
files:
  description: Paths of the snapshot (after the patterns), sorted.
  returned: always
  type: list
  elements: str
bytes_total:
  description: Bytes of all files of the snapshot, from hub metadata.
  returned: always
  type: int
to_download:
  description: Files missing or with the wrong size before the run (what was or, in check mode, would be fetched).
  returned: always
  type: list
  elements: dict
  sample: [{path: model-00002-of-00004.safetensors, size: 1048656, present: false, local_size: null}]
bytes_to_download:
  description: Sum of the sizes of RV(to_download).
  returned: always
  type: int
bytes_downloaded:
  description: Bytes fetched by this run (0 in check mode and when everything was present).
  returned: always
  type: int
files_downloaded:
  description: Paths fetched by this run.
  returned: always
  type: list
  elements: str
changes_needed:
  description: Whether files had to be fetched or the manifest written when the run started (in check mode, the same as C(changed)).
  returned: when not offline
  type: bool
manifest_written:
  description: Whether the manifest was (or in check mode would be) written.
  returned: always
  type: bool
missing:
  description: Offline mode only, files of the manifest not present with their size.
  returned: when offline
  type: list
  elements: str
space:
  description: The disk check (free, required, missing bytes, prune candidates with sizes).
  returned: when not offline
  type: dict
seconds:
  description: Wall time of the run.
  returned: always
  type: float
progress:
  description: Last progress record (bytes_done, bytes_total, files_done, files_total, mb_per_s, eta_s, files_hashed, bytes_hashed).
  returned: when something was downloaded
  type: dict
offline:
  description: O(resolve_only) with an unreachable hub and a commit this host holds - go on without the hub.
  returned: when the hub could not be reached
  type: bool
hub_unreachable:
  description: The hub could not be reached (RV(endpoint) names it); the message says why and how to go on offline.
  returned: when the hub could not be reached
  type: bool
endpoint:
  description: The hub endpoint that could not be reached.
  returned: when the hub could not be reached
  type: str
held:
  description: The commits this host holds under O(models_root) for the model, C({path, revision}).
  returned: when the hub could not be reached
  type: list
  elements: dict
hashed_while_downloading:
  description:
    - What O(hash_while_downloading) hashed before the download ended (C(files_hashed), C(bytes_hashed), C(files_to_hash),
      C(bytes_to_hash), C(hash_mismatches)); null when off.
  returned: when something was downloaded
  type: dict
"""

import grp
import os
import pwd
import sys
import time
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.llmfleet.vllm.plugins.module_utils import hf_download as hfd
from ansible_collections.llmfleet.vllm.plugins.module_utils.hash_ledger import Ledger
from ansible_collections.llmfleet.vllm.plugins.module_utils.pipelined_hashing import PipelinedHasher
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_manifest import (
    MANIFEST_FILENAME, ManifestError, load_manifest, manifest_from_siblings, write_manifest)

HF_IMPORT_ERROR = None
HF_ENDPOINT = None
try:
    import huggingface_hub
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    from huggingface_hub.constants import ENDPOINT as HF_ENDPOINT
    from huggingface_hub.utils import filter_repo_objects
except ImportError:
    HF_IMPORT_ERROR = traceback.format_exc()


def _existing_manifest(path):
    if not os.path.isfile(path):
        return None
    try:
        return load_manifest(path)
    except (OSError, ManifestError):
        return None


def run_offline(module, local_dir, started):
    manifest_path = os.path.join(local_dir, MANIFEST_FILENAME)
    manifest = _existing_manifest(manifest_path)
    if manifest is None:
        module.fail_json(msg="offline mode: no valid manifest %s; nothing to verify against (run once online)" % manifest_path)
    complete, to_download = hfd.local_state(local_dir, manifest)
    module.exit_json(
        changed=False, path=local_dir, repo_id=manifest.get("repo_id"), revision=manifest.get("revision"),
        files=sorted(f["path"] for f in manifest["files"]), bytes_total=sum(f["size"] for f in manifest["files"]),
        to_download=to_download, bytes_to_download=sum(f["size"] for f in to_download), bytes_downloaded=0,
        files_downloaded=[], manifest_written=False, missing=[f["path"] for f in to_download],
        seconds=round(time.time() - started, 3))


def _hub_unreachable(module, p, local_dir, models_root, detail, started):
    """The hub was never reached. Resolving a commit this host already holds (a manifest names it) goes on without
    the hub (offline=true in the result: the caller fetches nothing and verifies the files on disk); anything else
    fails, saying that the hub could not be reached (not that the revision is unknown) and how to go on offline."""
    endpoint = p["endpoint"] or HF_ENDPOINT or hfd.PUBLIC_HUB
    held = hfd.local_commits(models_root, os.path.basename(local_dir))
    holding = [h for h in held if h["revision"] == p["revision"]]
    if p["resolve_only"] and holding:
        module.warn("the hub at %s could not be reached (%s); %s@%s is on this host (%s): going on without the hub"
                    % (endpoint, detail, p["repo_id"], p["revision"], holding[0]["path"]))
        module.exit_json(changed=False, path=local_dir, repo_id=p["repo_id"], revision=p["revision"], offline=True,
                         hub_unreachable=True, endpoint=endpoint, held=held, seconds=round(time.time() - started, 3))
    module.fail_json(msg=hfd.unreachable_message(endpoint, p["repo_id"], p["revision"], detail, held),
                     hub_unreachable=True, endpoint=endpoint, held=held)


def _hub_error(module, what, exc, **extra):
    # huggingface_hub messages name the repo, file and HTTP status; they never carry the token.
    module.fail_json(msg="%s %s: %s" % (what, type(exc).__name__, str(exc).strip()), **extra)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            repo_id=dict(type="str"),
            revision=dict(type="str", default="main"),
            local_dir=dict(type="path", required=True),
            allow_patterns=dict(type="list", elements="str"),
            ignore_patterns=dict(type="list", elements="str"),
            max_workers=dict(type="int", default=8),
            token=dict(type="str", no_log=True),
            token_file=dict(type="path"),
            endpoint=dict(type="str"),
            offline=dict(type="bool", default=False),
            space_margin_bytes=dict(type="int", default=0),
            models_root=dict(type="path"),
            check_space=dict(type="bool", default=True),
            resolve_only=dict(type="bool", default=False),
            progress_interval=dict(type="float", default=5),
            hash_while_downloading=dict(type="bool", default=True),
            hash_workers=dict(type="int"),
            owner=dict(type="str"),
            group=dict(type="str"),
            etag_timeout=dict(type="float", default=10),
        ),
        required_if=[("offline", False, ("repo_id",))],
        supports_check_mode=True,
    )
    p = module.params
    started = time.time()
    local_dir = p["local_dir"].rstrip("/") or "/"
    if p["max_workers"] < 1:
        module.fail_json(msg="max_workers must be at least 1, got %d" % p["max_workers"])
    if p["hash_workers"] is not None and p["hash_workers"] < 1:
        module.fail_json(msg="hash_workers must be at least 1, got %d" % p["hash_workers"])
    try:
        owner = None
        if p["owner"] or p["group"]:
            owner = (pwd.getpwnam(p["owner"]).pw_uid if p["owner"] else -1, grp.getgrnam(p["group"]).gr_gid if p["group"] else -1)
    except KeyError as exc:
        module.fail_json(msg="owner %r / group %r: no such user or group on the host (%s)" % (p["owner"], p["group"], exc))
    if p["space_margin_bytes"] < 0:
        module.fail_json(msg="space_margin_bytes must not be negative")
    if p["offline"]:
        run_offline(module, local_dir, started)
    if HF_IMPORT_ERROR:
        module.fail_json(msg=missing_required_lib("huggingface_hub") + " (interpreter %s)" % sys.executable,
                         exception=HF_IMPORT_ERROR)

    token = p["token"]
    if not token and p["token_file"]:
        try:
            token = hfd.read_token_file(p["token_file"])
        except (OSError, ValueError) as exc:
            module.fail_json(msg="cannot use token_file: %s" % exc)
    # False: never fall back to a token stored elsewhere on the host (~/.cache/huggingface/token).
    token = token or False
    bad_endpoint = hfd.endpoint_error(p["endpoint"], bool(token))
    if bad_endpoint:
        module.fail_json(msg=bad_endpoint)
    models_root = p["models_root"] or os.path.dirname(local_dir)

    try:
        info = HfApi(endpoint=p["endpoint"], token=token).model_info(
            p["repo_id"], revision=p["revision"], files_metadata=not p["resolve_only"], timeout=p["etag_timeout"])
    except Exception as exc:  # pylint: disable=broad-except
        unreachable = hfd.hub_unreachable(exc)
        if not unreachable:
            _hub_error(module, "reading metadata of %s at revision %s failed:" % (p["repo_id"], p["revision"]), exc)
        _hub_unreachable(module, p, local_dir, models_root, unreachable, started)
    commit = info.sha
    if p["resolve_only"]:
        module.exit_json(changed=False, path=local_dir, repo_id=p["repo_id"], revision=commit,
                         seconds=round(time.time() - started, 3))
    siblings = list(filter_repo_objects(info.siblings or [], allow_patterns=p["allow_patterns"],
                                        ignore_patterns=p["ignore_patterns"], key=lambda s: s.rfilename))
    if not siblings:
        module.fail_json(msg="no file of %s@%s matches allow_patterns %s / ignore_patterns %s"
                         % (p["repo_id"], commit, p["allow_patterns"], p["ignore_patterns"]))
    try:
        manifest = manifest_from_siblings(p["repo_id"], commit, siblings)
    except ManifestError as exc:
        module.fail_json(msg="hub metadata of %s is unusable: %s" % (p["repo_id"], exc))

    manifest_path = os.path.join(local_dir, MANIFEST_FILENAME)
    _complete, to_download = hfd.local_state(local_dir, manifest)
    need = sum(f["size"] for f in to_download)
    write_manifest_needed = not hfd.manifests_equal(manifest, _existing_manifest(manifest_path))
    space = hfd.space_check(local_dir, models_root, need, p["space_margin_bytes"])
    result = dict(
        path=local_dir, repo_id=p["repo_id"], revision=commit, files=sorted(f["path"] for f in manifest["files"]),
        bytes_total=sum(f["size"] for f in manifest["files"]), to_download=to_download, bytes_to_download=need,
        bytes_downloaded=0, files_downloaded=[], manifest_written=False, space=space,
    )
    changed = bool(to_download) or write_manifest_needed
    result["changes_needed"] = changed
    if not space["ok"] and (p["check_space"] or not module.check_mode):
        module.fail_json(msg=space["msg"], changed=False, seconds=round(time.time() - started, 3), **result)
    if module.check_mode or not changed:
        result["manifest_written"] = changed
        module.exit_json(changed=changed, seconds=round(time.time() - started, 3), **result)

    progress = None
    if to_download:
        os.makedirs(local_dir, exist_ok=True)
        hasher = None
        if p["hash_while_downloading"]:
            hasher = PipelinedHasher(Ledger(local_dir, fresh=True), manifest["files"], p["hash_workers"],
                                     owner=owner).start()
        progress = hfd.ProgressWriter(os.path.join(local_dir, hfd.PROGRESS_RELPATH), local_dir, to_download,
                                      p["progress_interval"], extra=hasher.progress if hasher else None).start()
        common = dict(repo_id=p["repo_id"], revision=commit, local_dir=local_dir, token=token,
                      endpoint=p["endpoint"], etag_timeout=p["etag_timeout"])
        try:
            # A present file with the wrong size: fetch it again (hf_hub_download replaces it once complete).
            for entry in to_download:
                if entry["present"]:
                    hf_hub_download(filename=entry["path"], force_download=True, **common)
            snapshot_download(allow_patterns=[f["path"] for f in to_download], max_workers=p["max_workers"], **common)
        except Exception as exc:  # pylint: disable=broad-except
            result["hashed_while_downloading"] = hasher.stop() if hasher else None
            last = progress.stop("failed")
            _complete_after, still = hfd.local_state(local_dir, manifest)
            result.update(progress=last, files_downloaded=sorted({f["path"] for f in to_download} - {f["path"] for f in still}))
            result["bytes_downloaded"] = sum(f["size"] for f in to_download if f["path"] in result["files_downloaded"])
            message = "downloading %s@%s into %s, %d file(s) not complete: %s:" % (
                p["repo_id"], commit, local_dir, len(still), ", ".join(f["path"] for f in still))
            _hub_error(module, message, exc, changed=bool(result["files_downloaded"]),
                       seconds=round(time.time() - started, 3), **dict(result, files_missing=[f["path"] for f in still]))
        result["hashed_while_downloading"] = hasher.stop() if hasher else None
        result["progress"] = progress.stop("done")
        _complete_after, still = hfd.local_state(local_dir, manifest)
        if still:
            module.fail_json(msg="after the download these files still differ from the hub's sizes: %s"
                             % ", ".join("%s (%s bytes, hub %d)" % (f["path"], f["local_size"], f["size"]) for f in still),
                             changed=True, **result)
        result["files_downloaded"] = [f["path"] for f in to_download]
        result["bytes_downloaded"] = need
    write_manifest(manifest, manifest_path)
    os.chmod(manifest_path, 0o644)
    result["manifest_written"] = True
    module.exit_json(changed=True, seconds=round(time.time() - started, 3), hf_hub_version=huggingface_hub.__version__, **result)


if __name__ == "__main__":
    main()
