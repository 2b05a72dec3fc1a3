# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A Llama-3-8B-shaped model with random bf16 weights, for serving with the real vLLM CUDA engine.

    python3 tools/device/random_llama.py skeleton OUTDIR   # config, generation config, tokenizer (no torch)
    python3 tools/device/random_llama.py weights OUTDIR    # bf16 shards + index + manifest (torch, on the GPU)

Same layout as tools/tinymodels (LlamaForCausalLM names, consecutive shards of about equal size, the
index, the byte-level BPE tokenizer trained on the license texts), at the size of Llama-3-8B: hidden 4096,
32 layers, 32 heads / 8 KV heads, MLP 14336, vocabulary 128256, untied LM head, 4 shards (8.03e9
parameters, 16.06 GB). The tokenizer's 1024 trained tokens are padded to the model's vocabulary with
tokens that decode to " t<id>": every id the random model samples then decodes to text, so streamed
chunks carry text as a real model's would (encoding never produces the padding tokens).
The weights step also writes .llmfleet-manifest.json (sizes and sha256, model_manifest's format), so
shard_verify can check the directory in full mode, as it checks a download.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tinymodels"))

from llama_weights import (INDEX_FILE, SHARD_METADATA, LlamaSpec, shard_file_name,  # noqa: E402
                           split_into_shards, tensor_shapes)

LLAMA3_8B = LlamaSpec(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256, seed=8, num_shards=4,
                      max_position_embeddings=8192)
# Llama-3.2-1B's shape with an untied head (1.50e9 parameters, 3.0 GB): the systemd GPU host run
# (tools/device/gpuhost.sh), where two engines share the one GPU.
LLAMA32_1B = LlamaSpec(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, seed=1, num_shards=2,
                       max_position_embeddings=8192)
SHAPES = {"llama3-8b": LLAMA3_8B, "llama3.2-1b": LLAMA32_1B}
ROPE_THETA = 500000.0
DTYPE = "bfloat16"
BYTES_PER_PARAM = 2
PAD_PREFIX = "\u0120t"  # byte-level BPE spelling of " t"


def padded_tokenizer(tokenizer, vocab_size):
    """The trained tokenizer with its BPE vocabulary padded to vocab_size by " t<id>" tokens."""
    from tokenizers import Tokenizer
    doc = json.loads(tokenizer.to_str())
    vocab = doc["model"]["vocab"]
    taken = set(vocab) | {t["content"] for t in doc.get("added_tokens", [])}
    used = set(vocab.values()) | {t["id"] for t in doc.get("added_tokens", [])}
    for token_id in range(vocab_size):
        if token_id in used:
            continue
        text = "%s%d" % (PAD_PREFIX, token_id)
        if text in taken:
            raise ValueError("padding token %r already in the vocabulary" % text)
        vocab[text] = token_id
    return Tokenizer.from_str(json.dumps(doc))


def write_skeleton(outdir, spec=LLAMA3_8B):
    import make_tiny_models
    from tiny_tokenizer import BOS_TOKEN, EOS_TOKEN, train_tokenizer, write_tokenizer
    tokenizer = padded_tokenizer(train_tokenizer(), spec.vocab_size)
    if tokenizer.get_vocab_size() != spec.vocab_size:
        raise ValueError("tokenizer has %d tokens, model %d" % (tokenizer.get_vocab_size(), spec.vocab_size))
    bos_id, eos_id = tokenizer.token_to_id(BOS_TOKEN), tokenizer.token_to_id(EOS_TOKEN)
    os.makedirs(outdir, exist_ok=True)
    config = make_tiny_models.llama_config(spec, bos_id, eos_id)
    config.update(rope_theta=ROPE_THETA, rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
                  torch_dtype=DTYPE, dtype=DTYPE)
    make_tiny_models._write_json(os.path.join(outdir, "config.json"), config)
    make_tiny_models._write_json(os.path.join(outdir, "generation_config.json"),
                                 {"bos_token_id": bos_id, "eos_token_id": eos_id, "do_sample": False})
    write_tokenizer(tokenizer, outdir, model_max_length=spec.max_position_embeddings)
    return {"vocab_size": tokenizer.get_vocab_size(), "files": sorted(os.listdir(outdir))}


def write_weights(outdir, spec=LLAMA3_8B, device="cuda", repo_id="llmfleet-test/h200-llama3-8b-random"):
    """Random N(0, 0.02) bf16 weights (norms ones) drawn on the GPU, one shard in memory at a time."""
    import torch
    from safetensors.torch import save_file
    from ansible_collections.llmfleet.vllm.plugins.module_utils.model_manifest import (
        MANIFEST_FILENAME, manifest_from_directory, write_manifest)
    shapes = dict(tensor_shapes(spec))
    sizes = [(name, BYTES_PER_PARAM * _numel(shape)) for name, shape in shapes.items()]
    groups = split_into_shards(sizes, spec.num_shards)
    gen = torch.Generator(device=device).manual_seed(spec.seed)
    weight_map, timings = {}, []
    for i, names in enumerate(groups, start=1):
        t0 = time.monotonic()
        tensors = {}
        for name in names:
            if name.endswith("norm.weight"):
                tensors[name] = torch.ones(shapes[name], dtype=torch.bfloat16)
            else:
                t = torch.empty(shapes[name], dtype=torch.bfloat16, device=device)
                t.normal_(0.0, 0.02, generator=gen)
                tensors[name] = t.cpu()
        file_name = shard_file_name(i, len(groups))
        save_file(tensors, os.path.join(outdir, file_name), metadata=SHARD_METADATA)
        weight_map.update({n: file_name for n in names})
        timings.append({"shard": file_name, "tensors": len(names), "seconds": round(time.monotonic() - t0, 2)})
        del tensors
    index = {"metadata": {"total_size": sum(size for _n, size in sizes)}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(outdir, INDEX_FILE), "w", encoding="utf-8") as handle:
        json.dump(index, handle, indent=2)
        handle.write("\n")
    t0 = time.monotonic()
    manifest = manifest_from_directory(outdir, repo_id=repo_id, revision=None)
    write_manifest(manifest, os.path.join(outdir, MANIFEST_FILENAME))
    # safetensors and the manifest writer create their files 0600; the service user is not the writer.
    for entry in os.listdir(outdir):
        os.chmod(os.path.join(outdir, entry), 0o644)
    os.chmod(outdir, 0o755)
    return {"total_size": index["metadata"]["total_size"], "params": index["metadata"]["total_size"] // BYTES_PER_PARAM,
            "shards": timings, "manifest_seconds": round(time.monotonic() - t0, 2),
            "files": len(manifest["files"])}


def _numel(shape):
    n = 1
    for dim in shape:
        n *= dim
    return n


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["skeleton", "weights"])
    parser.add_argument("outdir")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    parser.add_argument("--seed", type=int, help="weights' seed (default: the shape's)")
    parser.add_argument("--repo-id", default="llmfleet-test/h200-llama3-8b-random", help="repo id in the manifest")
    args = parser.parse_args(argv)
    spec = SHAPES[args.shape]
    if args.seed is not None:
        spec = dataclasses.replace(spec, seed=args.seed)
    t0 = time.monotonic()
    result = (write_skeleton(args.outdir, spec) if args.step == "skeleton"
              else write_weights(args.outdir, spec, repo_id=args.repo_id))
    print(json.dumps({"step": args.step, "outdir": args.outdir, "seconds": round(time.monotonic() - t0, 2),
                      "result": result}, indent=1))


if __name__ == "__main__":
    main()
