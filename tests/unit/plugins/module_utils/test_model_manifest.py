"""The model manifest: built from real huggingface_hub ModelInfo objects and from local files."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess

import pytest
from huggingface_hub.hf_api import ModelInfo

from ansible_collections.llmfleet.vllm.plugins.module_utils.file_hashing import (
    GIT_BLOB_SHA1, SHA256, hash_file, hash_files)
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_manifest import (
    MANIFEST_FILENAME, ManifestError, list_model_files, load_manifest, manifest_from_directory,
    manifest_from_siblings, validate_manifest, write_manifest)
from ansible_collections.llmfleet.vllm.plugins.module_utils import model_manifest as mm
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_verify import verify_model_dir
from model_builders import REPO_ID, REVISION, build_safetensors_model, hub_model_info, truncate


def test_from_hub_siblings_objects_and_dicts_agree(tmp_path):
    model = build_safetensors_model(str(tmp_path / "m"), manifest=False)
    info = hub_model_info(model)
    from_objects = manifest_from_siblings(info.id, info.sha, info.siblings)
    as_dicts = [{"rfilename": s.rfilename, "size": s.size, "blob_id": s.blob_id,
                 "lfs": {"size": s.lfs.size, "sha256": s.lfs.sha256} if s.lfs else None} for s in info.siblings]
    assert manifest_from_siblings(REPO_ID, REVISION, as_dicts) == from_objects
    entries = {entry["path"]: entry for entry in from_objects["files"]}
    shard = entries["model-00001-of-00003.safetensors"]
    with open(os.path.join(model, shard["path"]), "rb") as handle:
        assert shard["sha256"] == hashlib.sha256(handle.read()).hexdigest()
    assert entries["config.json"]["sha256"] is None
    assert from_objects["repo_id"] == REPO_ID and from_objects["revision"] == REVISION


def test_git_blob_sha1_matches_git(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"a": 1}\n' * 1000)
    expected = subprocess.run(["git", "hash-object", "--no-filters", str(path)], check=True,
                              capture_output=True, text=True).stdout.strip()
    assert hash_file(str(path), GIT_BLOB_SHA1)[0] == expected
    assert hash_file(str(path), SHA256, bytearray(7))[0] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_hash_files_parallel_matches_sha256sum(tmp_path):
    paths = []
    for index in range(6):
        path = tmp_path / ("f%d.bin" % index)
        path.write_bytes(os.urandom(300_000 * (index + 1)))
        paths.append(str(path))
    results = hash_files([(p, SHA256, os.path.getsize(p)) for p in paths], workers=3, buffer_bytes=65536)
    reference = subprocess.run(["sha256sum"] + paths, check=True, capture_output=True, text=True).stdout
    for line in reference.splitlines():
        digest, path = line.split()
        assert results[path].digest == digest and results[path].bytes_read == os.path.getsize(path)
    missing = hash_files([(str(tmp_path / "gone"), SHA256, 0)])
    assert missing[str(tmp_path / "gone")].error


def test_missing_size_needs_files_metadata():
    info = ModelInfo(id=REPO_ID, siblings=[{"rfilename": "config.json"}])
    with pytest.raises(ManifestError, match="files_metadata=True"):
        manifest_from_siblings(REPO_ID, None, info.siblings)


def test_from_directory_then_verify_catches_later_damage(tmp_path):
    model = build_safetensors_model(str(tmp_path / "m"), manifest=False)
    os.makedirs(os.path.join(model, ".cache", "huggingface"))
    (tmp_path / "m" / ".cache" / "huggingface" / "x.lock").write_text("")
    manifest = manifest_from_directory(model, workers=2)
    assert [entry["path"] for entry in manifest["files"]] == sorted(list_model_files(model))
    assert not any(entry["path"].startswith(".cache/") for entry in manifest["files"])
    write_manifest(manifest, os.path.join(model, MANIFEST_FILENAME))
    assert load_manifest(os.path.join(model, MANIFEST_FILENAME)) == manifest
    assert not verify_model_dir(model, mode="full")["failed"]
    truncate(os.path.join(model, "tokenizer.json"), 2)
    assert verify_model_dir(model)["bad"] == ["tokenizer.json"]


@pytest.mark.parametrize("broken, message", [
    ({"format": 2, "files": []}, "format 1"),
    ({"format": 1}, "files list"),
    ({"format": 1, "files": [{"path": "../x", "size": 1}]}, "invalid manifest path"),
    ({"format": 1, "files": [{"path": "a", "size": -1}]}, "invalid size"),
    ({"format": 1, "files": [{"path": "a", "size": 1}, {"path": "a", "size": 1}]}, "duplicate"),
    ({"format": 1, "files": [{"path": "a", "size": 1, "sha256": "abc"}]}, "invalid sha256"),
])
def test_malformed_manifests_rejected(broken, message):
    with pytest.raises(ManifestError, match=message):
        validate_manifest(broken)


def test_invalid_json_manifest(tmp_path):
    path = tmp_path / "m.json"
    path.write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        load_manifest(str(path))
    path.write_text(json.dumps({"format": 1, "files": []}))
    assert load_manifest(str(path))["files"] == []


# ------------------------------------------------------------- issue 43: a manifest enters the revision lock bound to it

_COMMIT = "c" * 40


def _lockable(**changes):
    manifest = {"format": 1, "repo_id": "org/model", "revision": _COMMIT,
                "files": [{"path": "model.safetensors", "size": 3, "sha256": "a" * 64, "git_sha1": "b" * 40}]}
    manifest.update(changes)
    return manifest


def test_a_manifest_of_the_locked_commit_and_repo_may_enter_the_lock():
    assert mm.lock_problem(_lockable(), "org/model", _COMMIT) == ""
    assert mm.lock_problem(json.dumps(_lockable()), "org/model", _COMMIT) == ""


@pytest.mark.parametrize("manifest, problem", [
    (_lockable(revision="d" * 40), 'its revision is "%s", not the locked commit %s' % ("d" * 40, _COMMIT)),
    (_lockable(revision="main"), 'its revision is "main", not the locked commit'),
    (_lockable(revision=None), "its revision is null, not the locked commit"),
    (_lockable(repo_id="evil/model"), 'its repo is "evil/model", not org/model'),
    (_lockable(files=[{"path": "../../etc/cron.d/x", "size": 1, "sha256": None, "git_sha1": None}]), "invalid manifest path"),
    (_lockable(files=[{"path": "a", "size": -1}]), "invalid size"),
    (_lockable(format=2), "not a format 1 manifest"),
    (_lockable(files=[{"path": "config.json", "size": 9, "sha256": None, "git_sha1": None}]), "it gives no hash for config.json"),
    ("{not json", "it is not JSON"),
])
def test_a_manifest_read_back_from_a_host_is_refused_unless_it_is_of_the_locked_commit(manifest, problem):
    """What the seeding host's .llmfleet-manifest.json could say instead (model_seed/tasks/manifest.yml asks first)."""
    assert problem in mm.lock_problem(manifest, "org/model", _COMMIT)
