"""The tiny test models: real Llama layout on disk, complete index, deterministic output."""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors import safe_open
from tokenizers import Tokenizer

TOOLS_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tools", "tinymodels")
sys.path.insert(0, os.path.abspath(TOOLS_DIR))

import make_tiny_models  # noqa: E402
from llama_weights import INDEX_FILE, split_into_shards, tensor_shapes  # noqa: E402

GENERATOR = os.path.join(TOOLS_DIR, "make_tiny_models.py")
MODEL_NAMES = ["tiny-llama-a", "tiny-llama-b"]


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    outdir = tmp_path_factory.mktemp("tiny")
    subprocess.run([sys.executable, GENERATOR, str(outdir)], check=True, capture_output=True)
    return outdir


def read_json(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def shard_tensors(model_dir):
    """name -> (shape, dtype, nbytes, shard file) read from the safetensors files themselves."""
    found = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(model_dir, name), framework="numpy") as handle:
                assert handle.metadata() == {"format": "pt"}
                for key in handle.keys():
                    array = handle.get_tensor(key)
                    assert key not in found, f"{key} stored twice"
                    found[key] = (array.shape, array.dtype, array.nbytes, name)
    return found


def tree_digest(root):
    digest = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as handle:
                digest[os.path.relpath(path, root)] = hashlib.sha256(handle.read()).hexdigest()
    return digest


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_config_describes_a_llama_with_head_dim_64(models_dir, name):
    config = read_json(models_dir / name / "config.json")
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert config["torch_dtype"] in ("float32", "bfloat16")
    assert config["hidden_size"] // config["num_attention_heads"] == config["head_dim"] == 64
    assert config["num_attention_heads"] % config["num_key_value_heads"] == 0
    generation = read_json(models_dir / name / "generation_config.json")
    assert generation["eos_token_id"] == config["eos_token_id"]


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_tensors_have_the_names_and_shapes_transformers_expects(models_dir, name):
    config = read_json(models_dir / name / "config.json")
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    expected = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
                "lm_head.weight": (vocab, hidden)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}."
        expected.update({
            p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
        })
    found = shard_tensors(models_dir / name)
    assert {k: v[0] for k, v in found.items()} == expected
    assert {v[1] for v in found.values()} == {np.dtype(config["torch_dtype"])}


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_index_maps_every_tensor_to_its_shard_and_totals_its_bytes(models_dir, name):
    model_dir = models_dir / name
    index = read_json(model_dir / INDEX_FILE)
    found = shard_tensors(model_dir)
    assert index["weight_map"] == {k: v[3] for k, v in found.items()}
    assert index["metadata"]["total_size"] == sum(v[2] for v in found.values())
    shards = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    assert len(shards) >= 2
    assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    assert set(index["weight_map"].values()) == set(shards)


def test_models_differ_in_shape_and_weights(models_dir):
    a, b = (shard_tensors(models_dir / n) for n in MODEL_NAMES)
    assert a["model.embed_tokens.weight"][0] != b["model.embed_tokens.weight"][0]
    assert tree_digest(models_dir / MODEL_NAMES[0]) != tree_digest(models_dir / MODEL_NAMES[1])


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_each_model_is_a_few_megabytes(models_dir, name):
    size = sum(os.path.getsize(models_dir / name / f) for f in os.listdir(models_dir / name))
    assert 1_000_000 < size < 16_000_000


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_tokenizer_round_trips_text_and_fits_the_embedding(models_dir, name):
    model_dir = models_dir / name
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    config = read_json(model_dir / "config.json")
    assert 512 < tokenizer.get_vocab_size() <= config["vocab_size"]
    text = "The GNU General Public License, vLLM and ünïcode 日本語!"
    encoding = tokenizer.encode(text)
    assert encoding.ids[0] == config["bos_token_id"]
    assert tokenizer.decode(encoding.ids) == text
    tok_config = read_json(model_dir / "tokenizer_config.json")
    assert tokenizer.token_to_id(tok_config["bos_token"]) == config["bos_token_id"]
    assert tokenizer.token_to_id(tok_config["eos_token"]) == config["eos_token_id"]
    assert "messages" in tok_config["chat_template"]
    assert read_json(model_dir / "special_tokens_map.json")["eos_token"] == tok_config["eos_token"]


def test_two_runs_in_separate_processes_write_identical_bytes(models_dir, tmp_path):
    # Separate processes: the Rust tokenizer trainer hashes with per-process random state.
    subprocess.run([sys.executable, GENERATOR, str(tmp_path)], check=True, capture_output=True)
    assert tree_digest(tmp_path) == tree_digest(models_dir)


def test_only_writes_the_named_model(tmp_path):
    subprocess.run([sys.executable, GENERATOR, str(tmp_path), "--only", "tiny-llama-b"], check=True,
                   capture_output=True)
    assert sorted(os.listdir(tmp_path)) == ["tiny-llama-b"]


def test_make_model_replaces_a_damaged_model(models_dir, tmp_path):
    damaged = tmp_path / "tiny-llama-a"
    damaged.mkdir()
    (damaged / "model-00001-of-00009.safetensors").write_bytes(b"junk")
    make_tiny_models.make_model("tiny-llama-a", str(tmp_path))
    assert tree_digest(damaged) == tree_digest(models_dir / "tiny-llama-a")
    assert [n for n in os.listdir(tmp_path) if n.startswith(".")] == []  # no work folder left behind


def test_unknown_model_name_is_refused(tmp_path):
    result = subprocess.run([sys.executable, GENERATOR, str(tmp_path), "--only", "tiny-gpt"],
                            capture_output=True, check=False)
    assert result.returncode != 0
    assert not os.listdir(tmp_path)


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path):
    class HugeTokenizer:
        def get_vocab_size(self):
            return 1_000_000

    with pytest.raises(ValueError, match="tokenizer has"):
        make_tiny_models.make_model("tiny-llama-a", str(tmp_path), tokenizer=HugeTokenizer())


@pytest.mark.parametrize("count", [1, 2, 3, 7, 21])
def test_shard_split_keeps_order_and_fills_every_shard(count):
    spec = make_tiny_models.MODELS["tiny-llama-a"]
    names_and_sizes = [(n, int(np.prod(s)) * 4) for n, s in tensor_shapes(spec)]
    shards = split_into_shards(names_and_sizes, count)
    assert len(shards) == count and all(shards)
    assert [n for shard in shards for n in shard] == [name for name, _size in names_and_sizes]


def test_shard_split_refuses_more_shards_than_tensors():
    with pytest.raises(ValueError):
        split_into_shards([("a", 1), ("b", 1)], 3)
