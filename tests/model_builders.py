"""Builders of real model directories (safetensors via the safetensors library, GGUF via gguf-py)
and the faults the shard_verify tests inject into them. Shared by tests/unit and tests/integration
(tests/conftest.py puts tests/ on the path)."""
from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess

import numpy as np
from huggingface_hub.hf_api import ModelInfo
from safetensors.numpy import save_file

from ansible_collections.llmfleet.vllm.plugins.module_utils.model_manifest import (
    MANIFEST_FILENAME, manifest_from_siblings, write_manifest)

LFS_SUFFIXES = (".safetensors", ".gguf")
REPO_ID = "llmfleet-test/tiny-model"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def shard_name(number, count):
    return "model-%05d-of-%05d.safetensors" % (number, count)


def build_safetensors_model(model_dir, shards=3, tensors_per_shard=4, manifest=True, seed=0):
    """A HF-layout model: numbered shards, index, config and tokenizer files, hub-style manifest."""
    os.makedirs(model_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    dtypes = (np.float32, np.float16, np.int8, np.float64)
    weight_map = {}
    total_size = 0
    for number in range(1, shards + 1):
        tensors = {
            "layers.%d.w%d" % (number, t): (rng.standard_normal((8 + t, 16)) * 50).astype(dtypes[t % len(dtypes)])
            for t in range(tensors_per_shard)
        }
        save_file(tensors, os.path.join(model_dir, shard_name(number, shards)), metadata={"format": "pt"})
        weight_map.update({name: shard_name(number, shards) for name in tensors})
        total_size += sum(array.nbytes for array in tensors.values())
    _write_json(model_dir, "model.safetensors.index.json", {"metadata": {"total_size": total_size},
                                                            "weight_map": weight_map})
    _write_json(model_dir, "config.json", {"architectures": ["LlamaForCausalLM"], "hidden_size": 16})
    _write_json(model_dir, "tokenizer_config.json", {"model_max_length": 4096})
    _write_json(model_dir, "tokenizer.json", {"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}})
    if manifest:
        write_hub_manifest(model_dir)
    return model_dir


def build_gguf_model(model_dir, parts=3, manifest=True):
    """A llama.cpp split GGUF model written by gguf-py: <stem>-0000N-of-0000M.gguf."""
    import gguf  # pylint: disable=import-outside-toplevel

    os.makedirs(model_dir, exist_ok=True)
    writer = gguf.GGUFWriter(os.path.join(model_dir, "tiny-Q8_0.gguf"), "llama", split_max_tensors=2)
    writer.add_block_count(parts)
    writer.add_token_list(["<s>", "</s>", "hello"])
    for index in range(parts * 2):
        writer.add_tensor("blk.%d.weight" % index, np.arange(64 * (index + 1), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if manifest:
        write_hub_manifest(model_dir)
    return model_dir


def git_blob_sha1(path):
    """git's own object id of the file, as the hub reports it in blobId."""
    return subprocess.run(["git", "hash-object", "--no-filters", path], check=True,
                          capture_output=True, text=True).stdout.strip()


def hub_model_info(model_dir):
    """A real huggingface_hub ModelInfo built from the API payload the hub would send for these files."""
    siblings = []
    for name in sorted(os.listdir(model_dir)):
        path = os.path.join(model_dir, name)
        if name == MANIFEST_FILENAME or not os.path.isfile(path):
            continue
        sibling = {"rfilename": name, "size": os.path.getsize(path)}
        if name.endswith(LFS_SUFFIXES):
            with open(path, "rb") as handle:
                sha256 = hashlib.sha256(handle.read()).hexdigest()
            pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n" % (sha256, sibling["size"])
            sibling["blobId"] = hashlib.sha1(b"blob %d\0%s" % (len(pointer), pointer.encode())).hexdigest()
            sibling["lfs"] = {"size": sibling["size"], "sha256": sha256, "pointerSize": len(pointer)}
        else:
            sibling["blobId"] = git_blob_sha1(path)
        siblings.append(sibling)
    return ModelInfo(id=REPO_ID, sha=REVISION, siblings=siblings)


def write_hub_manifest(model_dir):
    info = hub_model_info(model_dir)
    manifest = manifest_from_siblings(info.id, info.sha, info.siblings)
    write_manifest(manifest, os.path.join(model_dir, MANIFEST_FILENAME))
    return manifest


def _write_json(model_dir, name, data):
    with open(os.path.join(model_dir, name), "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)


# --- faults -------------------------------------------------------------------------------

def truncate(path, missing_bytes=1):
    os.truncate(path, os.path.getsize(path) - missing_bytes)


def flip_last_byte(path):
    """Change one byte of tensor data, keeping size and header intact."""
    with open(path, "r+b") as handle:
        handle.seek(-1, os.SEEK_END)
        value = handle.read(1)[0]
        handle.seek(-1, os.SEEK_END)
        handle.write(bytes([value ^ 0x01]))


def corrupt_header_json(path):
    """Overwrite the opening brace of the safetensors header JSON."""
    with open(path, "r+b") as handle:
        handle.seek(8)
        handle.write(b"#")


def header_length_past_eof(path):
    with open(path, "r+b") as handle:
        handle.write(struct.pack("<Q", os.path.getsize(path)))


def add_unknown_shard(model_dir, name="model-extra.safetensors"):
    save_file({"stray": np.zeros((4, 4), dtype=np.float32)}, os.path.join(model_dir, name))
    return name


def index_names_missing_file(model_dir, shard="model-00009-of-00009.safetensors"):
    path = os.path.join(model_dir, "model.safetensors.index.json")
    with open(path, encoding="utf-8") as handle:
        index = json.load(handle)
    index["weight_map"]["lm_head.weight"] = shard
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(index, handle)
    return shard
