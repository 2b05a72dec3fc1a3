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
    """Every word random_prompt draws from, once, twice over: in as few prompts of at most ``max_words`` words as hold
    them, then in one prompt more. What the server's tokenizer makes of each set is the mean size of a random word
    exactly (one random prompt's size is a sample of it), and the difference between the two sets is what the server
    adds to every request (a BOS token, a chat template): words_for_tokens takes both apart.
    Returns [(set 0 or 1, prompt)]."""
    size = max(1, int(max_words))
    first = [" ".join(_WORDS[i:i + size]) for i in range(0, len(_WORDS), size)]
    parts = len(first) + 1
    if parts > len(_WORDS):  # one word a prompt already: no set of one prompt more
        return [(0, prompt) for prompt in first]
    second = [" ".join(_WORDS[i * len(_WORDS) // parts:(i + 1) * len(_WORDS) // parts]) for i in range(parts)]
    return [(0, prompt) for prompt in first] + [(1, prompt) for prompt in second]


def words_for_tokens(tokens, counted):
    """(words, tokens per word, tokens per request) for prompts of about ``tokens`` tokens of the server's tokenizer,
    from [(set, prompt tokens its usage counted, or None)] of vocabulary_prompts' requests: a set counts only when every
    one of its requests was counted. With both sets, per_word = words' tokens / words and per_request = the tokens one
    request more added; with one, per_request 0; with none, (tokens, None, None): the prompts stay ``tokens`` words.
    vLLM bench serve's random prompts are exact token counts: a prompt of words sized as tokens was 1.9 times as long
    on the test models' tokenizer, and the server's figures followed the longer prompts (docs/benchmarks.md)."""
    totals = {}
    for which in (0, 1):
        used = [count for index, count in counted if index == which]
        if used and all(count is not None and count > 0 for count in used):
            totals[which] = (len(used), sum(used))
    if 0 not in totals:
        return max(1, int(tokens)), None, None
    requests, total = totals[0]
    per_request = max(0.0, float(totals[1][1] - total) / (totals[1][0] - requests)) if 1 in totals else 0.0
    per_word = (total - requests * per_request) / len(_WORDS)
    if per_word <= 0:
        return max(1, int(tokens)), None, None
    return max(1, int(round((tokens - per_request) / per_word))), round(per_word, 4), round(per_request, 2)


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
