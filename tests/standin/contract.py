# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a vLLM OpenAI server looks like to the collection and its clients, as a comparable structure: the status and
the shape (keys and value types, not values) of every endpoint the collection reads, the SSE framing of a stream,
the error bodies, and the metric names and labels the drain, the gate and the dashboards read.

tests/integration/test_standin_contract.py compares `probe()` of the stand-in server (tests/standin/vllm) with
`probe()` of the real vLLM CPU server in every CI run."""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

# The metric families the collection reads (roles/pivot's drain, the gate, llmfleet.vllm.serving_metrics, the
# dashboards of roles/observability), and the labels each sample carries.
METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total",
           "vllm:prompt_tokens_total", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total",
           "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
           "vllm:request_queue_time_seconds_bucket")


def shape(value):
    """Keys and value types, recursively; a list by the shape of its first item; a mapping whose keys are tokens
    (the completions API's top_logprobs) by one '<token>' key."""
    if isinstance(value, dict):
        if value and all(isinstance(v, float) for v in value.values()) and not {"logprob", "prob"} & set(value):
            return {"<token>": "float"}
        if value and all(k.isdigit() for k in value):  # prompt_logprobs: {token id: {...}}
            return {"<token id>": shape(next(iter(value.values())))}
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        # By the item that says the most (a first prompt token has no logprob; a token may have no bytes).
        return [max((shape(v) for v in value), key=lambda s: len(json.dumps(s)))] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def _request(base, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read().decode()


def _json(base, path, body=None):
    status, _type, text = _request(base, path, body)
    return {"status": status, "shape": shape(json.loads(text)) if text.strip() else None}


def _stream(base, path, body):
    status, ctype, text = _request(base, path, dict(body, stream=True, stream_options={"include_usage": True}))
    events = text.split("\n\n")
    assert events[-1] == "", "a stream ends with a blank line"
    events = events[:-1]
    payloads = [e[len("data: "):] for e in events]
    chunks = [json.loads(p) for p in payloads[:-1]]
    return {"status": status, "content_type": ctype.split(";")[0],
            "framing": sorted({e.split(": ", 1)[0] + ": " for e in events}), "last": payloads[-1],
            "first_chunk": shape(chunks[0]), "second_chunk": shape(chunks[1]), "usage_chunk": shape(chunks[-1]),
            "usage_chunk_has_no_choices": chunks[-1]["choices"] == [],
            "text_chunks_have_usage_null": all(c.get("usage") is None for c in chunks[:-1])}


def _token_id_form(base, body):
    status, _type, text = _request(base, "/v1/completions", body)
    logprobs = json.loads(text)["choices"][0]["logprobs"]
    names = logprobs["tokens"] + [name for top in logprobs["top_logprobs"] for name in top]
    return {"status": status, "all_token_id_form": all(re.match(r"^token_id:\d+$", n) for n in names)}


def metric_labels(text):
    """{family: sorted label names} of the METRICS families in a Prometheus exposition."""
    found = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? ", line)
        if match and match.group(1) in METRICS:
            labels = sorted(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', match.group(3) or ""))
            found.setdefault(match.group(1), sorted(set(labels) | set(found.get(match.group(1), []))))
    return found


def probe(base, model):
    """The comparable structure of the server at base (http://host:port) serving model."""
    prompt = {"model": model, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    chat = {"model": model, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 4, "temperature": 0}
    status, _type, metrics = _request(base, "/metrics")
    return {
        "health": _request(base, "/health")[0],
        "version": _json(base, "/version"),
        "models": _json(base, "/v1/models"),
        "completion": _json(base, "/v1/completions", prompt),
        "completion_logprobs": _json(base, "/v1/completions", dict(prompt, logprobs=2)),
        "completion_prompt_logprobs": _json(base, "/v1/completions", dict(prompt, prompt_logprobs=1, max_tokens=1)),
        # As llmfleet.vllm.answer_parity asks: the tokens (and the top logprobs' keys) as "token_id:<id>".
        "completion_token_ids": _token_id_form(base, dict(prompt, logprobs=2, return_tokens_as_token_ids=True,
                                                          seed=0, ignore_eos=True)),
        "chat": _json(base, "/v1/chat/completions", chat),
        "chat_logprobs": _json(base, "/v1/chat/completions", dict(chat, logprobs=True, top_logprobs=2)),
        "completion_stream": _stream(base, "/v1/completions", prompt),
        "chat_stream": _stream(base, "/v1/chat/completions", chat),
        "unknown_model": _json(base, "/v1/completions", dict(prompt, model="no-such-model")),
        "bad_request": _json(base, "/v1/completions", dict(prompt, max_tokens=-1)),
        "tokenize": _json(base, "/tokenize", {"model": model, "prompt": "Hello world"}),
        "metrics_status": status,
        "metrics": metric_labels(metrics),
    }
