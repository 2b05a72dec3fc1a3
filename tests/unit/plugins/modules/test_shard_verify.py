"""verify_model_dir (the core of llmfleet.vllm.shard_verify) on real model directories with injected faults."""
from __future__ import annotations

import os

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils.model_manifest import MANIFEST_FILENAME
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_verify import (
    EXTRA_RELDIR, VerifyError, extras_to_set_aside, move_aside, verify_model_dir)
from model_builders import (
    add_unknown_shard, build_gguf_model, build_safetensors_model, corrupt_header_json, flip_last_byte,
    header_length_past_eof, index_names_missing_file, shard_name, truncate, write_hub_manifest)

SHARD2 = shard_name(2, 3)


@pytest.fixture(name="model")
def fixture_model(tmp_path):
    return build_safetensors_model(str(tmp_path / "model"))


def status_of(result, path):
    return {entry["path"]: entry for entry in result["files"]}[path]["status"]


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_good_model_passes(model, mode):
    result = verify_model_dir(model, mode=mode)
    assert not result["failed"], result["msg"]
    assert result["bad"] == [] and result["missing"] == [] and result["extra"] == []
    assert {entry["status"] for entry in result["files"]} == {"ok"}
    assert result["manifest"] == os.path.join(model, MANIFEST_FILENAME)
    if mode == "full":
        assert result["bytes_hashed"] == result["total_bytes"]
        assert all(entry["hash_checked"] for entry in result["files"])
        algorithms = {entry["path"]: entry["hash_algorithm"] for entry in result["files"]}
        assert algorithms[SHARD2] == "sha256" and algorithms["config.json"] == "git_sha1"
    else:
        assert result["bytes_hashed"] == 0


def test_truncated_shard_fails_fast(model):
    truncate(os.path.join(model, SHARD2))
    result = verify_model_dir(model)
    assert result["failed"] and result["bad"] == [SHARD2]
    assert status_of(result, SHARD2) == "truncated"
    assert SHARD2 in result["msg"] and "1 short" in result["msg"]


def test_truncated_shard_without_manifest_caught_by_header(model):
    os.unlink(os.path.join(model, MANIFEST_FILENAME))
    truncate(os.path.join(model, SHARD2))
    result = verify_model_dir(model)
    assert result["bad"] == [SHARD2] and status_of(result, SHARD2) == "truncated"
    assert "1 missing" in result["msg"]


def test_flipped_byte_caught_by_full_not_fast(model):
    flip_last_byte(os.path.join(model, SHARD2))
    assert not verify_model_dir(model, mode="fast")["failed"]
    result = verify_model_dir(model, mode="full")
    assert result["failed"] and result["bad"] == [SHARD2]
    assert status_of(result, SHARD2) == "hash_mismatch"
    assert "sha256" in result["msg"]


def test_changed_byte_in_small_file_caught_by_git_sha1(model):
    path = os.path.join(model, "config.json")
    with open(path, "rb") as handle:
        content = handle.read()
    with open(path, "wb") as handle:
        handle.write(content.replace(b'"hidden_size": 16', b'"hidden_size": 17'))  # still valid JSON
    assert not verify_model_dir(model, mode="fast")["failed"]
    result = verify_model_dir(model, mode="full")
    assert result["bad"] == ["config.json"] and status_of(result, "config.json") == "hash_mismatch"
    assert "git_sha1" in result["msg"]


@pytest.mark.parametrize("with_manifest", [True, False])
def test_missing_shard(model, with_manifest):
    if not with_manifest:
        os.unlink(os.path.join(model, MANIFEST_FILENAME))
    os.unlink(os.path.join(model, SHARD2))
    result = verify_model_dir(model)
    assert result["missing"] == [SHARD2] and result["bad"] == [SHARD2]
    assert status_of(result, SHARD2) == "missing"


def test_extra_unknown_shard_reported_and_fails_when_asked(model):
    name = add_unknown_shard(model)
    result = verify_model_dir(model)
    assert result["extra"] == [name] and not result["failed"]
    result = verify_model_dir(model, fail_on_extra=True)
    assert result["failed"] and name in result["msg"]


def test_extra_files_moved_aside_leave_exactly_the_manifests_files(model):
    """Issue 43 item 1: a chat template beside the manifest's files (a loader takes it by its presence) and an unknown
    shard go to .cache/llmfleet/extra/, a second of the same name beside the first; nothing is deleted."""
    with open(os.path.join(model, "chat_template.jinja"), "w", encoding="utf-8") as handle:
        handle.write("{{ 'injected' }}")
    shard = add_unknown_shard(model)
    extra = verify_model_dir(model)["extra"]
    assert extra == sorted(["chat_template.jinja", shard])
    # Never the manifest or the collection's state under .cache/, which a caller's own ignore patterns could list.
    assert extras_to_set_aside(extra + [MANIFEST_FILENAME, ".cache/llmfleet/seed/files"]) == extra
    assert move_aside(model, extra, EXTRA_RELDIR) == extra
    assert verify_model_dir(model, fail_on_extra=True)["extra"] == []
    with open(os.path.join(model, "chat_template.jinja"), "w", encoding="utf-8") as handle:
        handle.write("again")
    move_aside(model, ["chat_template.jinja"], EXTRA_RELDIR)
    aside = os.path.join(model, EXTRA_RELDIR)
    assert sorted(os.listdir(aside)) == sorted(["chat_template.jinja", "chat_template.jinja.~1~", shard])
    with open(os.path.join(aside, "chat_template.jinja"), encoding="utf-8") as handle:
        assert handle.read() == "{{ 'injected' }}"


def test_extra_shard_without_manifest_is_one_no_index_names(model):
    os.unlink(os.path.join(model, MANIFEST_FILENAME))
    name = add_unknown_shard(model)
    assert verify_model_dir(model)["extra"] == [name]


def test_index_naming_missing_file(model):
    shard = index_names_missing_file(model)
    write_hub_manifest(model)  # the manifest agrees with the edited index: only the index can tell
    result = verify_model_dir(model)
    assert result["missing"] == [shard]
    assert "named by model.safetensors.index.json" in result["msg"]


def test_index_tensor_absent_from_its_shard(model):
    index_path = os.path.join(model, "model.safetensors.index.json")
    with open(index_path, encoding="utf-8") as handle:
        text = handle.read()
    with open(index_path, "w", encoding="utf-8") as handle:
        handle.write(text.replace('"layers.1.w0"', '"layers.1.renamed"'))
    write_hub_manifest(model)
    result = verify_model_dir(model)
    assert result["bad"] == [shard_name(1, 3)] and status_of(result, shard_name(1, 3)) == "corrupt"


def test_header_json_corrupted(model):
    corrupt_header_json(os.path.join(model, SHARD2))
    result = verify_model_dir(model)
    assert result["bad"] == [SHARD2] and status_of(result, SHARD2) == "header_invalid"
    assert "not valid JSON" in result["msg"]


def test_header_length_past_eof(model):
    header_length_past_eof(os.path.join(model, SHARD2))
    result = verify_model_dir(model)
    assert result["bad"] == [SHARD2] and status_of(result, SHARD2) == "header_invalid"
    assert "past end of file" in result["msg"]


def test_missing_config_json(model):
    os.unlink(os.path.join(model, "config.json"))
    result = verify_model_dir(model, required_files=["config.json"])
    assert result["missing"] == ["config.json"]
    os.unlink(os.path.join(model, MANIFEST_FILENAME))
    result = verify_model_dir(model)
    assert result["missing"] == ["config.json"] and "required file" in result["msg"]


def test_tokenizer_alternatives(model):
    os.unlink(os.path.join(model, MANIFEST_FILENAME))
    os.unlink(os.path.join(model, "tokenizer_config.json"))
    assert not verify_model_dir(model)["failed"]  # tokenizer.json still there
    os.unlink(os.path.join(model, "tokenizer.json"))
    assert verify_model_dir(model)["missing"] == ["tokenizer_config.json"]


def test_oversize_shard(model):
    with open(os.path.join(model, SHARD2), "ab") as handle:
        handle.write(b"\0")
    result = verify_model_dir(model)
    assert status_of(result, SHARD2) == "oversize"


def test_gguf_split_model_passes_and_part_missing_fails(tmp_path):
    model = build_gguf_model(str(tmp_path / "gguf"))
    assert not verify_model_dir(model, mode="full")["failed"]
    os.unlink(os.path.join(model, MANIFEST_FILENAME))
    os.unlink(os.path.join(model, "tiny-Q8_0-00002-of-00003.gguf"))
    result = verify_model_dir(model)
    assert result["missing"] == ["tiny-Q8_0-00002-of-00003.gguf"]
    assert "numbered .gguf set" in result["msg"]


def test_gguf_truncated_and_bad_magic(tmp_path):
    model = build_gguf_model(str(tmp_path / "gguf"))
    part = os.path.join(model, "tiny-Q8_0-00003-of-00003.gguf")
    truncate(part, 100)
    os.unlink(os.path.join(model, MANIFEST_FILENAME))
    assert status_of(verify_model_dir(model), "tiny-Q8_0-00003-of-00003.gguf") == "truncated"
    with open(part, "r+b") as handle:
        handle.write(b"GGUX")
    assert status_of(verify_model_dir(model), "tiny-Q8_0-00003-of-00003.gguf") == "header_invalid"


def test_full_mode_without_manifest_refuses(model):
    os.unlink(os.path.join(model, MANIFEST_FILENAME))
    with pytest.raises(VerifyError, match="needs a manifest"):
        verify_model_dir(model, mode="full")


def test_explicit_manifest_elsewhere(model, tmp_path):
    moved = str(tmp_path / "elsewhere.json")
    os.rename(os.path.join(model, MANIFEST_FILENAME), moved)
    result = verify_model_dir(model, mode="full", manifest_path=moved)
    assert not result["failed"] and result["manifest"] == moved
    with pytest.raises(VerifyError, match="does not exist"):
        verify_model_dir(model, manifest_path=str(tmp_path / "nope.json"))


def test_verify_writes_nothing(model):
    before = {name: os.stat(os.path.join(model, name)).st_mtime_ns for name in os.listdir(model)}
    truncate(os.path.join(model, SHARD2))
    before[SHARD2] = os.stat(os.path.join(model, SHARD2)).st_mtime_ns
    verify_model_dir(model, mode="full")
    assert {name: os.stat(os.path.join(model, name)).st_mtime_ns for name in os.listdir(model)} == before


def test_fast_mode_on_64_shards(tmp_path):
    # its wall time (< 1 s) is measured by bench/verify.py, not asserted here
    model = build_safetensors_model(str(tmp_path / "big"), shards=64, tensors_per_shard=8, manifest=True)
    result = verify_model_dir(model)
    assert not result["failed"] and len(result["files"]) == 64 + 4
