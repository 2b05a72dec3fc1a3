# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Catalog patches of model files (``applies_to: model``), applied so that nothing is lost.

A patched file keeps its hub original under ``.cache/llmfleet/originals/<path>``; the record
``.cache/llmfleet/patches.json`` says, per file, which patches changed it, the original's size and
sha256 and the patched file's sha256. Downloads compare the *original* with the hub (so a patched
file is neither fetched again nor reported missing), and verification hashes the original against
the manifest and the live file against the record. Stdlib only.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import time

RECORD_RELPATH = ".cache/llmfleet/patches.json"
ORIGINALS_RELDIR = ".cache/llmfleet/originals"


class PatchError(ValueError):
    """A patch cannot be applied (target not JSON, bad key path)."""


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_record(model_dir):
    """{relpath: {original, original_size, original_sha256, patched_sha256, patched_size, patches, deleted_keys}}."""
    try:
        with open(os.path.join(model_dir, RECORD_RELPATH)) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return files if isinstance(files, dict) else {}


def original_path(model_dir, relpath, record=None):
    """The file whose bytes are the hub's: the kept original when relpath is patched (and both the
    patched file and its original exist), else relpath itself."""
    entry = (load_record(model_dir) if record is None else record).get(relpath)
    if entry and os.path.isfile(os.path.join(model_dir, relpath)) \
            and os.path.isfile(os.path.join(model_dir, entry["original"])):
        return os.path.join(model_dir, entry["original"])
    return os.path.join(model_dir, relpath)


def _delete_key(document, dotted):
    node, parts = document, dotted.split(".")
    for part in parts[:-1]:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    if isinstance(node, dict) and parts[-1] in node:
        del node[parts[-1]]
        return True
    return False


def plan_file(model_dir, relpath, patches):
    """What patching relpath with ``patches`` (catalog items, all for this file) changes.

    Starts from the hub original (the kept copy when the file was patched before), so re-applying
    the same patches is idempotent and a changed patch list is applied to the original, not on top.
    Returns (new_text or None when the file is absent, deleted_keys).
    """
    source = original_path(model_dir, relpath)
    if not os.path.isfile(source):
        return None, []
    try:
        with open(source) as handle:
            document = json.load(handle)
    except ValueError as exc:
        raise PatchError("%s is not JSON, cannot delete keys from it: %s" % (relpath, exc)) from None
    patched, deleted = copy.deepcopy(document), []
    for patch in patches:
        for key in patch.get("delete_keys") or []:
            if _delete_key(patched, key):
                deleted.append(key)
    if not deleted:
        return None, []
    return json.dumps(patched, indent=2, sort_keys=False) + "\n", deleted


def apply(model_dir, patches, check_mode=False):
    """Apply every ``applies_to: model`` patch; return {changed, files: [{path, patches, deleted_keys, changed}]}.

    A file that none of its patches changes (keys already absent upstream) is left as it is; a file
    patched before and whose patch list no longer changes it is restored from its original.
    """
    by_file = {}
    for patch in patches:
        if patch.get("applies_to") == "model" and patch.get("delete_keys"):
            by_file.setdefault(patch["target"], []).append(patch)
    record = load_record(model_dir)
    report, changed = [], False
    for relpath in sorted(set(by_file) | set(record)):
        live = os.path.join(model_dir, relpath)
        text, deleted = plan_file(model_dir, relpath, by_file.get(relpath, []))
        entry = record.get(relpath)
        if text is None:
            if entry:  # no longer patched: put the original back
                changed = True
                if not check_mode:
                    os.replace(os.path.join(model_dir, entry["original"]), live)
                    record.pop(relpath)
            report.append({"path": relpath, "patches": [], "deleted_keys": [], "changed": bool(entry),
                           "present": os.path.isfile(live)})
            continue
        want_sha = hashlib.sha256(text.encode()).hexdigest()
        file_changed = not (entry and os.path.isfile(live) and sha256_file(live) == want_sha)
        if file_changed and not check_mode:
            original = os.path.join(model_dir, ORIGINALS_RELDIR, relpath)
            if not entry or not os.path.isfile(original):
                os.makedirs(os.path.dirname(original), exist_ok=True)
                shutil.copy2(live, original)
            tmp = live + ".llmfleet-tmp"
            with open(tmp, "w") as handle:
                handle.write(text)
            shutil.copymode(original, tmp)
            os.replace(tmp, live)
            record[relpath] = {
                "original": os.path.join(ORIGINALS_RELDIR, relpath), "original_size": os.path.getsize(original),
                "original_sha256": sha256_file(original), "patched_sha256": want_sha,
                "patched_size": len(text.encode()), "patches": [p["name"] for p in by_file[relpath]],
                "deleted_keys": deleted, "at": round(time.time(), 3)}
        changed = changed or file_changed
        report.append({"path": relpath, "patches": [p["name"] for p in by_file[relpath]], "deleted_keys": deleted,
                       "changed": file_changed, "present": True})
    if changed and not check_mode:
        path = os.path.join(model_dir, RECORD_RELPATH)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as handle:
            json.dump({"files": record}, handle, indent=2, sort_keys=True)
        os.replace(path + ".tmp", path)
    return {"changed": changed, "files": report}
