"""Catalog model patches (module_utils/model_patches) and how verification and download planning see them."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import hf_download
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_manifest import MANIFEST_FILENAME, load_manifest
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_patches import (
    ORIGINALS_RELDIR, RECORD_RELPATH, PatchError, apply, load_record)
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_verify import verify_model_dir
from model_builders import build_safetensors_model, write_hub_manifest

PATCH = {"name": "drop-fp8-kv-cache", "applies_to": "model", "target": "config.json",
         "delete_keys": ["quantization_config.kv_cache_quant_algo"], "description": "seed 001"}
ENGINE_PATCH = {"name": "loader", "applies_to": "vllm", "target": "vllm/x.py", "description": "engine", "patch_file": None}


@pytest.fixture(name="model")
def fixture_model(tmp_path):
    """A model whose config asks for an FP8 KV cache, with a manifest that hashes config.json."""
    model = build_safetensors_model(str(tmp_path / "model"))
    config_path = os.path.join(model, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}
    with open(config_path, "w") as f:
        json.dump(config, f)
    write_hub_manifest(model)
    return model


def read(model, rel):
    with open(os.path.join(model, rel)) as f:
        return f.read()


def test_patch_removes_the_key_keeps_the_original_and_records_it(model):
    original = read(model, "config.json")
    result = apply(model, [PATCH, ENGINE_PATCH])
    assert result["changed"] and result["files"][0]["deleted_keys"] == PATCH["delete_keys"]
    patched = json.loads(read(model, "config.json"))
    assert patched["quantization_config"] == {"quant_method": "modelopt"}
    assert read(model, os.path.join(ORIGINALS_RELDIR, "config.json")) == original
    record = load_record(model)["config.json"]
    assert record["patches"] == ["drop-fp8-kv-cache"] and record["original_size"] == len(original.encode())
    assert apply(model, [PATCH])["changed"] is False  # idempotent


def test_check_mode_writes_nothing(model):
    before = read(model, "config.json")
    assert apply(model, [PATCH], check_mode=True)["changed"]
    assert read(model, "config.json") == before and not os.path.exists(os.path.join(model, RECORD_RELPATH))


def test_a_patch_dropped_from_the_catalog_puts_the_original_back(model):
    original = read(model, "config.json")
    apply(model, [PATCH])
    assert apply(model, [])["changed"]
    assert read(model, "config.json") == original and load_record(model) == {}


def test_missing_target_or_absent_key_changes_nothing(model):
    other = dict(PATCH, target="hf_quant_config.json")
    absent = dict(PATCH, delete_keys=["no.such.key"])
    assert apply(model, [other, absent])["changed"] is False


def test_non_json_target_is_a_clear_error(model):
    shard = sorted(p for p in os.listdir(model) if p.endswith(".safetensors"))[0]
    with pytest.raises(PatchError, match="not JSON"):
        apply(model, [dict(PATCH, target=shard)])


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_verification_accepts_a_patched_file(model, mode):
    apply(model, [PATCH])
    result = verify_model_dir(model, mode=mode)
    assert not result["failed"], result["msg"]


def test_verification_catches_a_changed_patched_file_and_a_changed_original(model):
    apply(model, [PATCH])
    with open(os.path.join(model, "config.json"), "a") as f:
        f.write(" ")
    assert verify_model_dir(model, mode="fast")["bad"] == ["config.json"]
    apply(model, [PATCH])  # puts the patched text back
    with open(os.path.join(model, ORIGINALS_RELDIR, "config.json"), "r+") as f:
        text = f.read()
        f.seek(0)
        f.write(text.replace("FP8", "FP9"))
    result = verify_model_dir(model, mode="full")
    assert result["bad"] == ["config.json"] and "kept original" in result["msg"]


def test_download_planning_compares_the_original_with_the_hub(model):
    apply(model, [PATCH])
    manifest = load_manifest(os.path.join(model, MANIFEST_FILENAME))
    _complete, to_download = hf_download.local_state(model, manifest)
    assert to_download == []
    os.unlink(os.path.join(model, "config.json"))  # the live file gone: fetch it again
    _complete, to_download = hf_download.local_state(model, manifest)
    assert [f["path"] for f in to_download] == ["config.json"]
