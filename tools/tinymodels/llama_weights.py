"""Seeded random Llama weights, named and shaped as transformers' LlamaForCausalLM expects,
written as sharded safetensors plus model.safetensors.index.json, without torch."""
import json
import os
from dataclasses import dataclass

import numpy as np
from safetensors.numpy import save_file

INDEX_FILE = "model.safetensors.index.json"
# transformers refuses safetensors whose header lacks a known "format".
SHARD_METADATA = {"format": "pt"}


@dataclass(frozen=True)
class LlamaSpec:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    seed: int
    num_shards: int
    max_position_embeddings: int = 2048

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads


def tensor_shapes(spec):
    """(name, shape) of every LlamaForCausalLM parameter, in module order."""
    hidden, inter, kv_dim = spec.hidden_size, spec.intermediate_size, spec.num_key_value_heads * spec.head_dim
    shapes = [("model.embed_tokens.weight", (spec.vocab_size, hidden))]
    for n in range(spec.num_hidden_layers):
        layer = f"model.layers.{n}"
        shapes += [
            (f"{layer}.self_attn.q_proj.weight", (hidden, hidden)),
            (f"{layer}.self_attn.k_proj.weight", (kv_dim, hidden)),
            (f"{layer}.self_attn.v_proj.weight", (kv_dim, hidden)),
            (f"{layer}.self_attn.o_proj.weight", (hidden, hidden)),
            (f"{layer}.mlp.gate_proj.weight", (inter, hidden)),
            (f"{layer}.mlp.up_proj.weight", (inter, hidden)),
            (f"{layer}.mlp.down_proj.weight", (hidden, inter)),
            (f"{layer}.input_layernorm.weight", (hidden,)),
            (f"{layer}.post_attention_layernorm.weight", (hidden,)),
        ]
    shapes += [("model.norm.weight", (hidden,)), ("lm_head.weight", (spec.vocab_size, hidden))]
    return shapes


def random_weights(spec, dtype=np.float32):
    """Norm weights are ones (as initialised by transformers); the rest N(0, 0.02) from spec.seed."""
    rng = np.random.default_rng(spec.seed)
    weights = {}
    for name, shape in tensor_shapes(spec):
        if name.endswith("norm.weight"):
            weights[name] = np.ones(shape, dtype=dtype)
        else:
            weights[name] = rng.normal(0.0, 0.02, size=shape).astype(dtype)
    return weights


def split_into_shards(names_and_sizes, num_shards):
    """Consecutive groups of tensor names of about equal byte size; never an empty shard."""
    total = sum(size for _name, size in names_and_sizes)
    if not 1 <= num_shards <= len(names_and_sizes):
        raise ValueError(f"cannot split {len(names_and_sizes)} tensors into {num_shards} shards")
    shards, current, filled = [], [], 0
    for i, (name, size) in enumerate(names_and_sizes):
        current.append(name)
        filled += size
        left_tensors, left_shards = len(names_and_sizes) - i - 1, num_shards - len(shards) - 1
        reached_share = filled >= total * (len(shards) + 1) / num_shards
        if left_shards and left_tensors >= left_shards and (reached_share or left_tensors == left_shards):
            shards.append(current)
            current = []
    shards.append(current)
    return shards


def shard_file_name(index, count):
    return f"model-{index:05d}-of-{count:05d}.safetensors"


def write_sharded(weights, outdir, num_shards):
    """Write the shards and the index; return the index dict."""
    groups = split_into_shards([(n, w.nbytes) for n, w in weights.items()], num_shards)
    weight_map = {}
    for i, names in enumerate(groups, start=1):
        file_name = shard_file_name(i, len(groups))
        save_file({n: weights[n] for n in names}, os.path.join(outdir, file_name), metadata=SHARD_METADATA)
        weight_map.update({n: file_name for n in names})
    index = {
        "metadata": {"total_size": sum(w.nbytes for w in weights.values())},
        "weight_map": dict(sorted(weight_map.items())),
    }
    with open(os.path.join(outdir, INDEX_FILE), "w", encoding="utf-8") as handle:
        json.dump(index, handle, indent=2)
        handle.write("\n")
    return index
