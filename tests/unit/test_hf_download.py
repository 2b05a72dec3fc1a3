"""Planning helpers of llmfleet.vllm.hf_snapshot (plugins/module_utils/hf_download.py) on real files."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import hf_download as hfd
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_manifest import manifest_from_siblings

SHA = "a" * 64


def manifest(files):
    return manifest_from_siblings("org/m", "c" * 40, [
        {"rfilename": path, "size": size, "blob_id": "b" * 40, "lfs": {"sha256": SHA, "size": size}} for path, size in files])


def write(path, size):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(b"x" * size)


def test_local_state_splits_complete_missing_and_wrong_size(tmp_path):
    write(tmp_path / "a.safetensors", 10)
    write(tmp_path / "b.safetensors", 7)  # truncated
    m = manifest([("a.safetensors", 10), ("b.safetensors", 9), ("sub/c.json", 3)])
    complete, todo = hfd.local_state(str(tmp_path), m)
    assert complete == ["a.safetensors"]
    assert todo == [{"path": "b.safetensors", "size": 9, "present": True, "local_size": 7},
                    {"path": "sub/c.json", "size": 3, "present": False, "local_size": None}]


def test_space_check_ok_and_short_lists_prune_candidates(tmp_path):
    root = tmp_path / "models"
    write(root / "old" / "w.bin", 5000)
    write(root / "older" / "w.bin", 9000)
    os.utime(root / "older", (1, 1))
    target = str(root / "new")
    ok = hfd.space_check(target, str(root), 1000, 0, free=10_000)
    assert ok["ok"] and ok["missing_bytes"] == 0 and "msg" not in ok

    short = hfd.space_check(target, str(root), 3 * hfd.GB, 2 * hfd.GB, free=1 * hfd.GB)
    assert not short["ok"] and short["missing_bytes"] == 4 * hfd.GB and short["missing_gb"] == 4.0
    assert [c["path"] for c in short["candidates"]] == [str(root / "older"), str(root / "old")]  # oldest first
    assert short["candidates"][0]["size_bytes"] >= 9000
    assert "4.000 GB missing" in short["msg"] and "Nothing was changed" in short["msg"]
    assert "%s (0.000 GB)" % (root / "older") in short["msg"]
    assert "would not be enough" in short["msg"]


def test_space_check_nothing_to_download_is_ok_on_a_full_disk(tmp_path):
    assert hfd.space_check(str(tmp_path / "m"), str(tmp_path), 0, 10 * hfd.GB, free=0)["ok"]


def test_space_check_never_lists_the_target(tmp_path):
    write(tmp_path / "m" / "half" / "x", 100)
    result = hfd.space_check(str(tmp_path / "m" / "half"), str(tmp_path / "m"), 10, 0, free=0)
    assert result["candidates"] == [] and "pruned (oldest first): none" in result["msg"]


def test_free_bytes_of_a_path_not_yet_created(tmp_path):
    assert hfd.free_bytes(str(tmp_path / "a" / "b" / "c")) > 0


def test_manifests_equal_ignores_order():
    a = manifest([("x", 1), ("y", 2)])
    b = manifest([("y", 2), ("x", 1)])
    assert hfd.manifests_equal(a, b)
    assert not hfd.manifests_equal(a, manifest([("x", 1), ("y", 3)]))
    assert not hfd.manifests_equal(a, None)


@pytest.mark.parametrize("mode, error", [(0o600, None), (0o400, None), (0o640, "mode 0640"), (0o604, "mode 0604")])
def test_token_file_mode(tmp_path, mode, error):
    path = tmp_path / "token"
    path.write_text("hf_abc\n")
    os.chmod(path, mode)
    if error:
        with pytest.raises(ValueError, match=error):
            hfd.read_token_file(str(path))
    else:
        assert hfd.read_token_file(str(path)) == "hf_abc"


def test_token_file_empty(tmp_path):
    path = tmp_path / "token"
    path.write_text("\n")
    os.chmod(path, 0o600)
    with pytest.raises(ValueError, match="empty"):
        hfd.read_token_file(str(path))


def test_progress_counts_complete_files_and_incomplete_bytes(tmp_path):
    planned = [{"path": "a", "size": 100, "present": False}, {"path": "b", "size": 300, "present": False}]
    writer = hfd.ProgressWriter(str(tmp_path / hfd.PROGRESS_RELPATH), str(tmp_path), planned, interval=0.05)
    write(tmp_path / "a", 100)
    write(tmp_path / ".cache" / "huggingface" / "download" / "xyz.etag.1234.incomplete", 120)
    data = writer.start().snapshot()
    assert (data["bytes_done"], data["bytes_total"], data["files_done"], data["files_total"]) == (220, 400, 1, 2)
    assert data["percent"] == 55.0
    final = writer.stop("done")
    assert json.load(open(tmp_path / hfd.PROGRESS_RELPATH)) == final and final["state"] == "done"
