"""Write small, real, randomly initialised Llama models that vLLM can load, for tests and demos.

    python tools/tinymodels/make_tiny_models.py OUTDIR [--only NAME]

Each model goes to OUTDIR/<name>/ in Hugging Face layout: config.json, generation_config.json,
sharded safetensors + model.safetensors.index.json, and a locally trained BPE tokenizer.
Output is byte-identical on every run (seeded weights, deterministic tokenizer training).
head_dim is 64 on purpose: vLLM's CPU attention kernel refuses smaller heads.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from llama_weights import LlamaSpec, random_weights, write_sharded  # noqa: E402
from tiny_tokenizer import BOS_TOKEN, EOS_TOKEN, train_tokenizer, write_tokenizer  # noqa: E402

TORCH_DTYPE = "float32"  # numpy has no bfloat16; float32 keeps the writer torch-free
MODELS = {
    # Two different shapes and seeds so that pivoting between them changes real weights.
    "tiny-llama-a": LlamaSpec(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                              seed=1, num_shards=4),
    "tiny-llama-b": LlamaSpec(hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                              num_attention_heads=2, num_key_value_heads=1, vocab_size=1024,
                              seed=2, num_shards=3),
}


def llama_config(spec, bos_id, eos_id):
    rope_theta = 10000.0
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-05,
        "rope_theta": rope_theta,
        # transformers >= 5 reads rope settings from here; older versions ignore it.
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "use_cache": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": TORCH_DTYPE,
        "dtype": TORCH_DTYPE,
    }


def _write_json(path, data):
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")


def make_model(name, outdir, tokenizer=None):
    """Write model `name` into outdir/<name>/ (replacing it) and return that path.

    The model is built in a temporary sibling folder and renamed into place, so a crash
    never leaves a half-written model under the final name.
    """
    spec = MODELS[name]
    tokenizer = tokenizer or train_tokenizer()
    if tokenizer.get_vocab_size() > spec.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.get_vocab_size()} tokens, model only {spec.vocab_size}")
    bos_id, eos_id = tokenizer.token_to_id(BOS_TOKEN), tokenizer.token_to_id(EOS_TOKEN)
    os.makedirs(outdir, exist_ok=True)
    final = os.path.join(outdir, name)
    work = tempfile.mkdtemp(prefix=f".{name}.", dir=outdir)
    try:
        _write_json(os.path.join(work, "config.json"), llama_config(spec, bos_id, eos_id))
        _write_json(os.path.join(work, "generation_config.json"),
                    {"bos_token_id": bos_id, "eos_token_id": eos_id, "do_sample": False})
        write_sharded(random_weights(spec), work, spec.num_shards)
        write_tokenizer(tokenizer, work, model_max_length=spec.max_position_embeddings)
        # safetensors creates its files 0600; the serving user is often not the writer.
        for entry in os.listdir(work):
            os.chmod(os.path.join(work, entry), 0o644)
        os.chmod(work, 0o755)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(work, final)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return final


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("outdir")
    parser.add_argument("--only", choices=sorted(MODELS), help="write just this model")
    args = parser.parse_args(argv)
    tokenizer = train_tokenizer()
    for name in [args.only] if args.only else sorted(MODELS):
        print(make_model(name, args.outdir, tokenizer=tokenizer))


if __name__ == "__main__":
    main()
