"""Train the tiny models' byte-level BPE tokenizer locally and write it in Hugging Face layout.

The corpus is the license texts every Debian system ships, so no download is needed.
Byte-level BPE covers every input byte, so no text is ever out of vocabulary.
"""
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CORPUS_DIR = "/usr/share/common-licenses"
VOCAB_SIZE = 1024
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
SPECIAL_TOKENS = [BOS_TOKEN, EOS_TOKEN]  # ids 0 and 1, in this order
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def corpus_lines(corpus_dir=CORPUS_DIR):
    """Lines of the regular files in corpus_dir, in name order (symlinks are aliases, so skipped)."""
    names = sorted(n for n in os.listdir(corpus_dir) if not os.path.islink(os.path.join(corpus_dir, n)))
    if not names:
        raise FileNotFoundError(f"no corpus files in {corpus_dir}")
    for name in names:
        with open(os.path.join(corpus_dir, name), encoding="utf-8", errors="replace") as handle:
            yield from handle


def train_tokenizer(corpus_dir=CORPUS_DIR, vocab_size=VOCAB_SIZE):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(corpus_dir), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    # Prepend BOS like Llama does; ByteLevel offsets are kept for byte-exact decoding.
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single=f"{BOS_TOKEN} $A",
            pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
            special_tokens=[(BOS_TOKEN, bos_id)],
        ),
    ])
    return tokenizer


def _write_json(path, data):
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")


def write_tokenizer(tokenizer, outdir, model_max_length):
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into outdir."""
    tokenizer.save(os.path.join(outdir, "tokenizer.json"))
    added_tokens_decoder = {
        str(tokenizer.token_to_id(tok)): {
            "content": tok, "lstrip": False, "normalized": False,
            "rstrip": False, "single_word": False, "special": True,
        }
        for tok in SPECIAL_TOKENS
    }
    _write_json(os.path.join(outdir, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "added_tokens_decoder": added_tokens_decoder,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    })
    _write_json(os.path.join(outdir, "special_tokens_map.json"), {
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
    })
