# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a vLLM OpenAI server looks like to the collection and its clients, as a comparable structure: the status and
the shape (keys and value types, not values) of every endpoint the collection reads, the SSE framing of a stream,
the error bodies, and the metric names and labels the drain, the gate and the dashboards read.

tests/integration/test_standin_contract.py compares `probe()` of the stand-in server (tests/standin/vllm) with
`probe()` of the real vLLM CPU server in every CI run."""
from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The vLLM metric families the dashboards and alerts read (roles/observability's metric contract, built from them),
# and those the drain and the gate read.
with open(os.path.join(REPO, "roles", "observability", "files", "metric-contract.json")) as _handle:
    METRICS = tuple(sorted({m["metric"] for m in json.load(_handle)["metrics"] if m["source"] == "vllm"}
                           | {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total"}))


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


def _json(base, path, body=None, values=None):
    """Status and shape; values: {name: function of the decoded body} for the few values clients act on."""
    status, _type, text = _request(base, path, body)
    decoded = json.loads(text) if text.strip() else None
    found = {"status": status, "shape": shape(decoded) if decoded is not None else None}
    if values:
        found["values"] = {name: pick(decoded) for name, pick in sorted(values.items())}
    return found


COMPLETION_VALUES = {"object": lambda b: b["object"], "finish_reason": lambda b: b["choices"][0]["finish_reason"],
                     "choices": lambda b: len(b["choices"]), "completion_tokens": lambda b: b["usage"]["completion_tokens"]}
ERROR_VALUES = {"type": lambda b: b["error"]["type"], "code": lambda b: b["error"]["code"], "param": lambda b: b["error"]["param"]}


def _stream(base, path, body):
    status, ctype, text = _request(base, path, dict(body, stream=True, stream_options={"include_usage": True}))
    events = text.split("\n\n")
    assert events[-1] == "", "a stream ends with a blank line"
    events = events[:-1]
    payloads = [e[len("data: "):] for e in events]
    chunks = [json.loads(p) for p in payloads[:-1]]
    return {"status": status, "content_type": ctype.split(";")[0],
            "framing": sorted({e.split(": ", 1)[0] + ": " for e in events}), "last": payloads[-1],
            "first_chunk": shape(chunks[0]), "usage_chunk": shape(chunks[-1]),
            # every chunk's shape, the last text chunk (the one with finish_reason) included
            "chunk_shapes": sorted({json.dumps(shape(c), sort_keys=True) for c in chunks}),
            "last_finish_reason": [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1],
            "completion_tokens": chunks[-1]["usage"]["completion_tokens"],
            "usage_chunk_has_no_choices": chunks[-1]["choices"] == [],
            "text_chunks_have_usage_null": all(c.get("usage") is None for c in chunks[:-1])}


def _token_id_form(base, body):
    status, _type, text = _request(base, "/v1/completions", body)
    logprobs = json.loads(text)["choices"][0]["logprobs"]
    names = logprobs["tokens"] + [name for top in logprobs["top_logprobs"] for name in top]
    return {"status": status, "all_token_id_form": all(re.match(r"^token_id:\d+$", n) for n in names)}


def metric_labels(text):
    """{family: {labels: every label name of its samples, le: the bucket bounds}} of the METRICS in an exposition."""
    found = {}
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})? ", line)
        if match and match.group(1) in METRICS:
            family = found.setdefault(match.group(1), {"labels": [], "le": []})
            family["labels"] = sorted(set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', match.group(3) or "")) | set(family["labels"]))
            family["le"] += re.findall(r'le="([^"]+)"', match.group(3) or "")
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
        "completion": _json(base, "/v1/completions", prompt, COMPLETION_VALUES),
        "completion_logprobs": _json(base, "/v1/completions", dict(prompt, logprobs=2)),
        "completion_prompt_logprobs": _json(base, "/v1/completions", dict(prompt, prompt_logprobs=1, max_tokens=1)),
        # As llmfleet.vllm.answer_parity asks: the tokens (and the top logprobs' keys) as "token_id:<id>".
        "completion_token_ids": _token_id_form(base, dict(prompt, logprobs=2, return_tokens_as_token_ids=True,
                                                          seed=0, ignore_eos=True)),
        "chat": _json(base, "/v1/chat/completions", chat, dict(COMPLETION_VALUES)),
        "chat_logprobs": _json(base, "/v1/chat/completions", dict(chat, logprobs=True, top_logprobs=2)),
        "completion_stream": _stream(base, "/v1/completions", prompt),
        "chat_stream": _stream(base, "/v1/chat/completions", chat),
        "unknown_model": _json(base, "/v1/completions", dict(prompt, model="no-such-model"), ERROR_VALUES),
        "bad_request": _json(base, "/v1/completions", dict(prompt, max_tokens=-1), ERROR_VALUES),
        "too_long": _json(base, "/v1/completions", dict(prompt, max_tokens=100000), ERROR_VALUES),
        "unknown_path": _request(base, "/v1/no-such-path")[0],
        "wrong_method": _request(base, "/v1/completions")[0],
        "tokenize": _json(base, "/tokenize", {"model": model, "prompt": "Hello world"}),
        "metrics_status": status,
        "metrics": metric_labels(metrics),
    }
