# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""STAND-IN -- not vLLM. An OpenAI-compatible server shaped like vLLM's (`vllm serve`), for the test bed's tests of the
collection's own logic (rollout order, refusals, gateway, heals), where a real engine's start (19-135 s on the CPU
test bed) is not what is tested. It loads nothing: it checks that the model directory holds a config.json, then
answers at once with deterministic text and logprobs derived from the prompt (the same prompt, the same answer).

tests/integration/test_standin_contract.py holds it to the real vLLM server's shape in every CI run (endpoints, error
bodies, SSE framing, /version, logprob fields, the metrics the collection reads). Standard library only: the test
bed puts it in /opt/vllm-standin (tools/testbed/testbed.sh standin); nothing in roles/ selects it.

Endpoints: /health, /version, /v1/models, /v1/completions, /v1/chat/completions (stream or not; logprobs,
prompt_logprobs), /tokenize, /metrics. VLLM_API_KEY guards /v1/* as vLLM does. LLMFLEET_STANDIN_TOKEN_DELAY_S (default
0.002) spaces the tokens of a stream; LLMFLEET_STANDIN_START_DELAY_S (default 0) waits before listening."""
from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import signal
import sys
import time
import uuid

VERSION = "0.0.0+standin"
WORDS = (" the", " a", " model", " answer", " is", " here", " and", " it", " works", " well", " on", " time", " fleet",
         " of", " hosts", " serving", " tokens", " quickly", ".", ",")
# vLLM's bucket bounds of each histogram the collection reads (vLLM 0.32 CPU, tests/standin/contract.py compares them).
_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
            1920.0, 7680.0)
BUCKETS = {
    "time_to_first_token_seconds": (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                                    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
    "inter_token_latency_seconds": (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                                    20.0, 40.0, 80.0),
    "request_queue_time_seconds": _LATENCY,
    "e2e_request_latency_seconds": _LATENCY,
}
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           500: "Internal Server Error"}
GET_PATHS = ("/health", "/version", "/metrics", "/v1/models")
POST_PATHS = ("/v1/completions", "/v1/chat/completions", "/tokenize")


def log(message):
    stamp = time.strftime("%m-%d %H:%M:%S")
    print("(APIServer pid=%d) INFO %s [standin_server.py] %s" % (os.getpid(), stamp, message), flush=True)


def token_id(piece):
    return 2 + int(hashlib.sha256(piece.encode()).hexdigest()[:6], 16) % 32000


def tokenize(text):
    """Word pieces and their ids: deterministic, roughly a token per word (and a BOS id 1)."""
    pieces, word = [], ""
    for char in text:
        if char in " \n\t" and word:
            pieces.append(word)
            word = ""
        word += char
    if word:
        pieces.append(word)
    return [1] + [token_id(p) for p in pieces], pieces


def generate(seed_text, n):
    """n (token, logprob, [(alternative, logprob)]) chosen from the prompt and the model's numerics (seed_text): the
    same prompt to the same model gives the same answer; another numeric setting gives another."""
    seed, out = int(hashlib.sha256(seed_text.encode()).hexdigest()[:12], 16), []
    for i in range(n):
        pick = (seed >> (i % 40)) + i * 7
        token = WORDS[pick % len(WORDS)]
        other = WORDS[(pick + 3) % len(WORDS)]
        logprob = -0.05 - (pick % 97) / 100.0
        out.append((token, logprob, [(token, logprob), (other, logprob - 0.5 - (pick % 13) / 10.0)]))
    return out


class ApiError(Exception):
    def __init__(self, status, message, kind, param=None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self):
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


class Metrics:
    def __init__(self, model):
        self.labels = 'engine="0",model_name="%s"' % model
        self.running = self.waiting = 0
        self.prompt_tokens = self.generation_tokens = 0
        self.histograms = {name: [] for name in BUCKETS}

    def observe(self, name, value):
        self.histograms[name].append(value)

    def exposition(self):
        lines = []
        for name, kind, value in (("num_requests_running", "gauge", self.running),
                                  ("num_requests_waiting", "gauge", self.waiting),
                                  ("kv_cache_usage_perc", "gauge", 0.01 * self.running),
                                  ("num_preemptions_total", "counter", 0),
                                  ("prompt_tokens_total", "counter", self.prompt_tokens),
                                  ("generation_tokens_total", "counter", self.generation_tokens)):
            lines += ["# TYPE vllm:%s %s" % (name, kind), "vllm:%s{%s} %s" % (name, self.labels, float(value))]
        for name, values in self.histograms.items():
            lines.append("# TYPE vllm:%s histogram" % name)
            for bound in BUCKETS[name] + (math.inf,):
                le = "+Inf" if bound == math.inf else repr(float(bound))
                lines.append('vllm:%s_bucket{%s,le="%s"} %s' % (name, self.labels, le, float(sum(v <= bound for v in values))))
            lines.append("vllm:%s_sum{%s} %s" % (name, self.labels, float(sum(values))))
            lines.append("vllm:%s_count{%s} %s" % (name, self.labels, float(len(values))))
        return "\n".join(lines) + "\n"


class Server:
    def __init__(self, model_path, names, max_model_len, api_key, token_delay, numerics=""):
        self.model_path, self.names, self.max_model_len = model_path, names, max_model_len
        self.numerics = numerics  # what vLLM's numbers would depend on: the model's config, --hf-overrides, --dtype
        self.api_key, self.token_delay = api_key, token_delay
        self.created = int(time.time())
        self.metrics = Metrics(names[0])
        self.writers, self.stopping = set(), False

    # -- requests ---------------------------------------------------------------------------------------------------
    def check(self, body, prompt_ids):
        if body.get("model") not in self.names:
            raise ApiError(404, "The model `%s` does not exist. Valid aliases: %s." % (body.get("model"), ", ".join(self.names)),
                           "NotFoundError", "model")
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise ApiError(400, "max_tokens must be at least 1, got %s. (parameter=max_tokens, value=%s)" % (max_tokens, max_tokens),
                           "BadRequestError", "max_tokens")
        if max_tokens is not None and max_tokens > self.max_model_len:
            raise ApiError(400, "max_tokens=%d cannot be greater than max_model_len=%d. Please request fewer output tokens. "
                           "(parameter=max_tokens, value=%d)" % (max_tokens, self.max_model_len, max_tokens),
                           "BadRequestError", "max_tokens")
        room = self.max_model_len - len(prompt_ids)
        if room < 1 or (max_tokens or 0) > room:
            raise ApiError(400, "This model's maximum context length is %d tokens. However, you requested %d output tokens and "
                           "your prompt contains %d input tokens." % (self.max_model_len, max_tokens or 0, len(prompt_ids)),
                           "BadRequestError", "input_tokens")
        return min(max_tokens or room, room)

    @staticmethod
    def chat_prompt(body):
        return "".join("<|%s|>%s\n" % (m.get("role"), m.get("content") if isinstance(m.get("content"), str)
                                       else json.dumps(m.get("content"))) for m in body.get("messages") or [])

    def usage(self, prompt_n, completion_n, full=True):
        usage = {"prompt_tokens": prompt_n, "total_tokens": prompt_n + completion_n, "completion_tokens": completion_n}
        if full:
            usage.update(prompt_tokens_details=None, completion_tokens_details=None)
        return usage

    @staticmethod
    def completion_logprobs(tokens, top, as_ids=False):
        offsets, at = [], 0
        for token, _lp, _alts in tokens:
            offsets.append(at)
            at += len(token)

        def name(token):
            return "token_id:%d" % token_id(token) if as_ids else token
        return {"text_offset": offsets, "token_logprobs": [lp for _t, lp, _a in tokens], "tokens": [name(t) for t, _l, _a in tokens],
                "top_logprobs": [{name(a): alp for a, alp in alts[:max(top, 1)]} for _t, _l, alts in tokens]}

    @staticmethod
    def chat_logprobs(tokens, top):
        def entry(token, logprob):
            return {"token": token, "logprob": logprob, "bytes": list(token.encode())}
        return {"content": [dict(entry(t, lp), top_logprobs=[entry(a, alp) for a, alp in alts[:top]]) for t, lp, alts in tokens]}

    @staticmethod
    def prompt_logprobs(prompt_ids, pieces):
        out = [None]
        for token_id, piece in zip(prompt_ids[1:], pieces):
            logprob = -1.0 - (token_id % 50) / 10.0
            out.append({str(token_id): {"logprob": logprob, "rank": 1 + token_id % 9, "decoded_token": piece}})
        return out

    def common(self, kind, body):
        return {"id": "%s-%s" % ("chatcmpl" if kind == "chat" else "cmpl", uuid.uuid4().hex[:16]),
                "object": "chat.completion" if kind == "chat" else "text_completion", "created": int(time.time()),
                "model": body["model"]}

    def answer(self, kind, body):
        """(prompt ids, generated tokens, the response for a non-streaming request)."""
        text = self.chat_prompt(body) if kind == "chat" else body.get("prompt", "")
        if isinstance(text, list):
            text = text[0] if text else ""
        prompt_ids, pieces = tokenize(text)
        n = self.check(body, prompt_ids)
        tokens = generate(self.numerics + "\n" + text, n)
        finish = "length"
        response = self.common(kind, body)
        if kind == "chat":
            top = int(body.get("top_logprobs") or 0)
            choice = {"index": 0, "message": {"role": "assistant", "content": "".join(t for t, _l, _a in tokens), "refusal": None,
                                              "annotations": None, "audio": None, "function_call": None, "reasoning": None},
                      "logprobs": self.chat_logprobs(tokens, top) if body.get("logprobs") else None,
                      "finish_reason": finish, "stop_reason": None, "token_ids": None, "routed_experts": None}
            response.update(choices=[choice], service_tier=None, system_fingerprint="vllm-%s" % VERSION,
                            usage=self.usage(len(prompt_ids), n), prompt_logprobs=None, prompt_token_ids=None,
                            prompt_text=None, kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        else:
            logprobs = body.get("logprobs")
            choice = {"index": 0, "text": "".join(t for t, _l, _a in tokens),
                      "logprobs": self.completion_logprobs(tokens, int(logprobs), bool(body.get("return_tokens_as_token_ids")))
                      if logprobs is not None else None,
                      "finish_reason": finish, "stop_reason": None, "token_ids": None,
                      "prompt_logprobs": self.prompt_logprobs(prompt_ids, pieces) if body.get("prompt_logprobs") is not None else None,
                      "prompt_token_ids": None, "routed_experts": None}
            response.update(choices=[choice], service_tier=None, system_fingerprint="vllm-%s" % VERSION,
                            usage=self.usage(len(prompt_ids), n), kv_transfer_params=None, ec_transfer_params=None, metrics=None)
        return prompt_ids, tokens, response

    async def stream(self, kind, body, write):
        prompt_ids, tokens, _response = self.answer(kind, body)
        base = self.common(kind, body)
        if kind == "chat":
            base["object"] = "chat.completion.chunk"
            await write(dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                             "finish_reason": None}], prompt_token_ids=None, prompt_text=None))
        started = last = time.monotonic()
        for i, (token, _lp, _alts) in enumerate(tokens):
            await asyncio.sleep(self.token_delay)
            now = time.monotonic()
            self.metrics.observe("time_to_first_token_seconds" if i == 0 else "inter_token_latency_seconds",
                                 now - (started if i == 0 else last))
            last = now
            self.metrics.generation_tokens += 1
            finish = "length" if i == len(tokens) - 1 else None
            if kind == "chat":
                choice = {"index": 0, "delta": {"content": token}, "logprobs": None, "finish_reason": finish, "token_ids": None}
            else:
                choice = {"index": 0, "text": token, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                          "prompt_token_ids": None, "token_ids": None}
            if finish:
                choice["stop_reason"] = None
            await write(dict(base, choices=[choice]))
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            await write(dict(base, choices=[], usage=self.usage(len(prompt_ids), len(tokens), full=False),
                             system_fingerprint="vllm-%s" % VERSION))

    # -- HTTP ---------------------------------------------------------------------------------------------------------
    async def handle(self, reader, writer):
        self.writers.add(writer)
        try:
            while not self.stopping:
                try:
                    request = await self.read_request(reader)
                except (ValueError, UnicodeDecodeError):
                    await self.send(writer, 400, ApiError(400, "malformed HTTP request", "BadRequestError").body(), keep=False)
                    break
                if request is None:
                    break
                keep = await self.respond(writer, *request)
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self.writers.discard(writer)
            writer.close()

    @staticmethod
    async def read_request(reader):
        line = await reader.readline()
        if not line:
            return None
        method, path, version = line.decode("latin-1").split(" ", 2)
        headers = {}
        while True:
            header = await reader.readline()
            if header in (b"\r\n", b"\n", b""):
                break
            name, _colon, value = header.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise ValueError("chunked request bodies are not read by the stand-in")
        body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
        if version.strip() == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
            headers["connection"] = "close"
        return method, path.split("?", 1)[0], headers, body

    @staticmethod
    async def send(writer, status, payload, content_type="application/json", keep=True):
        data = payload if isinstance(payload, bytes) else (json.dumps(payload, separators=(",", ":")).encode()
                                                           if content_type == "application/json" else payload.encode())
        head = "HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: %s\r\n\r\n" % (
            status, REASONS.get(status, "Error"), content_type, len(data), "keep-alive" if keep else "close")
        writer.write(head.encode() + data)
        await writer.drain()

    async def respond(self, writer, method, path, headers, raw):
        keep = headers.get("connection", "").lower() != "close"
        if (path in GET_PATHS and method != "GET") or (path in POST_PATHS and method != "POST"):
            await self.send(writer, 405, {"detail": "Method Not Allowed"}, keep=keep)
        elif path == "/health":
            await self.send(writer, 200, b"", keep=keep)
        elif path == "/version":
            await self.send(writer, 200, {"version": VERSION}, keep=keep)
        elif path == "/metrics":
            await self.send(writer, 200, self.metrics.exposition(), "text/plain; version=0.0.4; charset=utf-8", keep)
        elif path.startswith("/v1/") and self.api_key and headers.get("authorization") != "Bearer " + self.api_key:
            await self.send(writer, 401, {"error": "Unauthorized"}, keep=keep)
        elif path == "/v1/models":
            await self.send(writer, 200, {"object": "list", "data": [self.model_card(name) for name in self.names]}, keep=keep)
        elif path in ("/v1/completions", "/v1/chat/completions", "/tokenize") and method == "POST":
            try:
                body = json.loads(raw or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
            except ValueError as exc:
                await self.send(writer, 400, ApiError(400, "invalid request body: %s" % exc, "BadRequestError").body(), keep=keep)
                return keep
            try:
                return await self.generate(writer, path, body, keep)
            except (TypeError, ValueError, AttributeError, KeyError) as exc:  # what the stand-in cannot read: vLLM says 400
                await self.send(writer, 400, ApiError(400, "the stand-in cannot read this request: %s" % exc,
                                                      "BadRequestError").body(), keep=False)
                return False
        else:
            await self.send(writer, 404, {"detail": "Not Found"}, keep=keep)
        return keep

    def model_card(self, name):
        return {"id": name, "object": "model", "created": self.created, "owned_by": "vllm", "root": self.model_path,
                "parent": None, "max_model_len": self.max_model_len, "permission": [{
                    "id": "modelperm-%s" % uuid.uuid4().hex[:16], "object": "model_permission", "created": self.created,
                    "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                    "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
                    "group": None, "is_blocking": False}]}

    async def generate(self, writer, path, body, keep):
        kind = "chat" if path == "/v1/chat/completions" else "completion"
        try:
            if path == "/tokenize":
                ids, _pieces = tokenize(body.get("prompt") if "prompt" in body else self.chat_prompt(body))
                await self.send(writer, 200, {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids,
                                              "token_strs": None}, keep=keep)
                return keep
            if not body.get("stream"):
                prompt_ids, tokens, response = self.answer(kind, body)
                self.metrics.running += 1
                started = time.monotonic()
                try:
                    await asyncio.sleep(self.token_delay * len(tokens))
                finally:
                    self.metrics.running -= 1
                self.metrics.observe("e2e_request_latency_seconds", time.monotonic() - started)
                self.metrics.prompt_tokens += len(prompt_ids)
                self.metrics.generation_tokens += len(tokens)
                self.metrics.observe("request_queue_time_seconds", 0.0)
                await self.send(writer, 200, response, keep=keep)
                return keep
            self.answer(kind, body)  # refuse a bad request with its status before the stream starts
        except ApiError as err:
            await self.send(writer, err.status, err.body(), keep=keep)
            return keep
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                     b"transfer-encoding: chunked\r\nconnection: %s\r\n\r\n" % (b"keep-alive" if keep else b"close"))

        async def write(event):
            data = ("data: %s\n\n" % json.dumps(event, separators=(",", ":"))).encode()
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()

        self.metrics.running += 1
        started = time.monotonic()
        self.metrics.observe("request_queue_time_seconds", 0.0)
        self.metrics.prompt_tokens += len(tokenize(self.chat_prompt(body) if kind == "chat" else body.get("prompt", ""))[0])
        try:
            await self.stream(kind, body, write)
            data = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))
            await writer.drain()
        finally:
            self.metrics.running -= 1
            self.metrics.observe("e2e_request_latency_seconds", time.monotonic() - started)
        return keep


def max_model_len_of(model_path, given):
    """--max-model-len, else the model's; above the model's positions the start fails, as vLLM's does."""
    with open(os.path.join(model_path, "config.json")) as handle:
        config = json.load(handle)
    derived = int(config.get("max_position_embeddings") or 2048)
    if given and int(given) > derived:
        raise ValueError("User-specified max_model_len (%s) is greater than the derived max_model_len "
                         "(max_position_embeddings=%d in the model's config.json)" % (given, derived))
    return int(given) if given else derived


def serve(args):
    """`vllm serve` of the stand-in: args holds model, host, port, served_model_name, max_model_len."""
    try:
        max_model_len = max_model_len_of(args.model, args.max_model_len)
    except (OSError, ValueError) as exc:
        print("ERROR standin: cannot serve %s (config.json): %s" % (args.model, exc), file=sys.stderr, flush=True)
        return 1
    names = args.served_model_name or [args.model]
    with open(os.path.join(args.model, "config.json")) as handle:
        numerics = json.dumps([json.load(handle), args.hf_overrides, args.dtype], sort_keys=True)
    server = Server(args.model, names, max_model_len, os.environ.get("VLLM_API_KEY") or args.api_key,
                    float(os.environ.get("LLMFLEET_STANDIN_TOKEN_DELAY_S", "0.002")), numerics)
    log("vLLM API server version %s (STAND-IN, tests/standin)" % VERSION)
    log("non-default args: %s" % json.dumps({"model": args.model, "port": args.port, "served_model_name": names}))
    time.sleep(float(os.environ.get("LLMFLEET_STANDIN_START_DELAY_S", "0")))

    async def main():
        listener = await asyncio.start_server(server.handle, args.host or "0.0.0.0", args.port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log("Starting vLLM server on http://%s:%d" % (args.host or "0.0.0.0", args.port))
        log("Application startup complete.")
        await stop.wait()
        # As vLLM on SIGTERM: no new connection; the requests in flight get a few seconds to end, then every
        # connection (idle keep-alive ones too) is closed.
        server.stopping = True
        listener.close()
        deadline = time.monotonic() + 5
        while server.metrics.running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for writer in list(server.writers):
            writer.close()
        log("Shutting down")

    asyncio.run(main())
    return 0
