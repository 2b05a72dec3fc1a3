# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a load level sends: its shape (LoadSpec), seeded random prompts and the streaming request bodies."""
from __future__ import annotations

import json
import random


class LoadSpec(object):
    """One load level."""

    def __init__(self, concurrency, requests=None, duration_s=None, timeout_s=60.0,
                 keep_chunk_times=True, connect_timeout_s=None):
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if requests is None and duration_s is None:
            raise ValueError("one of requests or duration_s is needed")
        self.concurrency = int(concurrency)
        self.requests = requests
        self.duration_s = duration_s
        self.timeout_s = float(timeout_s)
        self.keep_chunk_times = keep_chunk_times
        self.connect_timeout_s = connect_timeout_s or min(self.timeout_s, 30.0)


def make_rng(seed):
    """The prompts' random source: the same seed, the same prompts."""
    return random.Random(seed)


_WORDS = (
    "the of and to in is was for on that with as by at from his her an were which are this be had not "
    "but they their one all has have there been more can when who will no would other into time some "
    "what them first new only then than its also two after could people over made most may many such "
    "where these years well very out just because any those state under both same between through "
    "while during before small large right left water light river stone garden window market engine "
    "signal number memory yellow silver orange purple winter summer autumn spring morning evening"
).split()


def random_prompt(rng, words):
    """``words`` random common words: about one token each for usual BPE vocabularies, up to two for small ones (the
    test models' 1,024 tokens); words_for_tokens sizes it from what the server counted."""
    n = max(1, int(words))
    return " ".join(rng.choice(_WORDS) for _i in range(n))


def vocabulary_prompts(max_words):
    """Every word random_prompt draws from, once, in prompts of at most ``max_words`` words: what the server's tokenizer
    makes of them is the mean size of a random word exactly, where one random prompt's size is a sample of it."""
    size = max(1, int(max_words))
    return [" ".join(_WORDS[i:i + size]) for i in range(0, len(_WORDS), size)]


def words_for_tokens(tokens, samples):
    """(words, tokens per word): how many random words make a prompt of about ``tokens`` tokens of the server's tokenizer,
    from (words sent, prompt tokens the server's usage counted) of requests it answered (vocabulary_prompts); (tokens,
    None) without any.
    vLLM bench serve's random prompts are exact token counts: a prompt of words sized as tokens was 1.9 times as long
    on the test models' tokenizer, and the server's figures followed the longer prompts (docs/benchmarks.md)."""
    counted = [(int(words), int(used)) for words, used in samples if words > 0 and used > 0]
    if not counted:
        return max(1, int(tokens)), None
    per_word = float(sum(used for _w, used in counted)) / sum(words for words, _u in counted)
    return max(1, int(round(tokens / per_word))), per_word


def build_body(model, endpoint, prompt, max_tokens, ignore_eos=True, extra=None):
    """Compact JSON (bytes) of one streaming request with usage reported; ``endpoint`` is completions or chat."""
    body = {"model": model, "max_tokens": int(max_tokens), "stream": True,
            "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if ignore_eos:
        body["ignore_eos"] = True
    if extra:
        body.update(extra)
    return json.dumps(body, separators=(",", ":")).encode("utf-8")
