# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unit tests of the load client: loadgen_conn (Target), loadgen_workload (bodies, prompts, LoadSpec) and the driver
loadgen.run_level against a raw in-test socket server (keep-alive, errors, cuts, timeouts)."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen import run_level
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_conn import Target
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_workload import (LoadSpec, build_body, make_rng,
                                                                                     random_prompt, vocabulary_prompts, words_for_tokens)

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
TOK = {"choices": [{"index": 0, "text": " t"}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}}


def chunk(b):
    return b"%x\r\n%s\r\n" % (len(b), b)


def sse(obj):
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")).encode()) + b"\n\n"


def stream(n=3):
    """A whole streamed answer: n token events, the usage event, [DONE], the terminal chunk."""
    return HEAD + b"".join(chunk(sse(TOK)) for _i in range(n)) + chunk(sse(USAGE)) + chunk(sse(b"[DONE]")) + b"0\r\n\r\n"


# ------------------------------------------------------------------ target / workload

def test_target_paths():
    t = Target("http://h:8000/v1/", "chat", api_key="k")
    assert t.path == "/v1/chat/completions" and t.url("/metrics") == "http://h:8000/metrics"
    assert b"Authorization: Bearer k\r\n" in t.request_head(5) and b"Content-Length: 5\r\n" in t.request_head(5)
    t = Target("https://example.org/prefix")
    assert t.port == 443 and t.path == "/prefix/v1/completions" and t.ssl is not None
    assert b"Authorization" not in t.request_head(1)
    assert Target("http://[::1]:9000").host_header == "[::1]:9000"
    with pytest.raises(ValueError):
        Target("ftp://x")
    with pytest.raises(ValueError):
        Target("http://x", "embeddings")


def test_build_body():
    b = json.loads(build_body("m", "chat", "hi", 16, True, {"temperature": 0}))
    assert b == {"model": "m", "max_tokens": 16, "stream": True, "stream_options": {"include_usage": True},
                 "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True, "temperature": 0}
    b = json.loads(build_body("m", "completions", "hi", 4, False))
    assert b["prompt"] == "hi" and "ignore_eos" not in b


def test_random_prompt_length_and_seed():
    p1 = random_prompt(make_rng(1), 50)
    assert len(p1.split()) == 50 and p1 == random_prompt(make_rng(1), 50)
    assert p1 != random_prompt(make_rng(2), 50)


# ------------------------------------------------------------------ client against a raw in-test socket server

def _serve(responses):
    """A raw asyncio TCP server replying with canned bytes per request (in-test stand-in)."""
    state = {"n": 0, "conns": 0}

    async def handle(reader, writer):
        state["conns"] += 1
        while True:
            head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
            if not head:
                break
            length = int([h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0])
            await reader.readexactly(length)
            action = responses[state["n"] % len(responses)]
            state["n"] += 1
            if callable(action):
                await action(writer)
                if writer.is_closing():
                    return
            else:
                writer.write(action)
                await writer.drain()

    return handle, state


def _run_client(responses, n, concurrency=1, timeout=2.0):
    async def main():
        handle, state = _serve(responses)
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        t = Target("http://127.0.0.1:%d" % port)
        spec = LoadSpec(concurrency, requests=n, timeout_s=timeout)
        recs, t0, t1 = await run_level(t, spec, lambda i: b"{}")
        server.close()
        return recs, state
    return asyncio.run(main())


def test_client_keepalive_reuses_one_connection():
    recs, state = _run_client([stream(3)], 5)
    assert all(r.ok for r in recs) and state["conns"] == 1
    assert [r.output_tokens for r in recs] == [3] * 5


def test_client_http_error_then_success_same_connection():
    err = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\noops"
    recs, state = _run_client([err, stream(2)], 4)
    assert [r.error for r in recs] == ["http", None, "http", None]
    assert recs[0].status == 500 and "oops" in recs[0].error_detail and state["conns"] == 1


def test_client_stream_cut_and_reconnect():
    async def cut(writer):
        data = stream(4)
        writer.write(data[:len(data) // 2])
        await writer.drain()
        writer.close()
    recs, state = _run_client([cut, stream(2)], 4)
    assert [r.error for r in recs] == ["stream_cut", None, "stream_cut", None]
    assert recs[0].chunks >= 1 and state["conns"] == 3


def test_client_missing_done_marker_is_stream_cut():
    no_done = HEAD + chunk(sse(TOK)) + b"0\r\n\r\n"
    recs, _state = _run_client([no_done], 1)
    assert recs[0].error == "stream_cut" and "[DONE]" in recs[0].error_detail


def test_client_timeout():
    async def stall(writer):
        writer.write(HEAD + chunk(sse(TOK)))
        await asyncio.sleep(1.5)
    recs, _state = _run_client([stall], 2, concurrency=2, timeout=0.3)
    assert [r.error for r in recs] == ["timeout", "timeout"]
    assert all(0.25 < r.latency < 1.0 for r in recs)


def test_client_timeout_holds_when_the_loop_wakes_up_late():
    """A loaded machine: the event loop is held up past the request's deadline, and when it wakes the whole answer
    is already in the socket, so it is read before the timer fires. The request still took too long: a timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer():
        conn, _addr = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n{}" not in data:
                data += conn.recv(65536)
            time.sleep(0.1)
            conn.sendall(stream(3))
            time.sleep(1.0)

    server = threading.Thread(target=answer, daemon=True)
    server.start()

    async def main():
        asyncio.get_running_loop().call_later(0.05, time.sleep, 0.5)  # the loop is held up from 0.05 to 0.55 s
        target = Target("http://127.0.0.1:%d" % listener.getsockname()[1])
        return (await run_level(target, LoadSpec(1, requests=1, timeout_s=0.2), lambda i: b"{}"))[0]

    recs = asyncio.run(main())
    listener.close()
    assert recs[0].error == "timeout" and "0.2" in recs[0].error_detail and recs[0].latency > 0.2, (recs[0].error, recs[0].error_detail, recs[0].latency)


def test_client_not_sse_response():
    plain = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    recs, _state = _run_client([plain], 1)
    assert recs[0].error == "stream_error"


def test_client_connection_refused():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()

    async def main():
        spec = LoadSpec(2, requests=3, timeout_s=2)
        return await run_level(Target("http://127.0.0.1:%d" % port), spec, lambda i: b"{}")
    recs = asyncio.run(main())[0]
    assert [r.error for r in recs] == ["connection"] * 3


def test_loadspec_validation():
    with pytest.raises(ValueError):
        LoadSpec(0, requests=1)
    with pytest.raises(ValueError):
        LoadSpec(1)


def test_words_for_tokens_sizes_prompts_by_what_the_server_counted():
    """A server whose tokenizer makes 2 tokens of each word and adds 3 to each request (a chat template): the
    vocabulary's two sets tell the two apart, so that a prompt of 41 tokens is 19 words."""
    prompts = vocabulary_prompts(16)
    assert [which for which, _p in prompts] == [0] * 7 + [1] * 8
    for which in (0, 1):  # every word once in each set, each prompt at most 16 words
        words = [w for index, prompt in prompts if index == which for w in prompt.split()]
        assert sorted(words) == sorted(set(words)) and len(words) == 108
    assert max(len(prompt.split()) for _i, prompt in prompts) <= 16
    counted = [(which, 2 * len(prompt.split()) + 3) for which, prompt in prompts]
    assert words_for_tokens(41, counted) == (19, 2.0, 3.0)
    # Without the second set, nothing is taken off a request; a set with a request not counted (failed, no usage) is
    # not used; without the first, the prompts stay `tokens` words.
    assert words_for_tokens(40, [c for c in counted if c[0] == 0]) == (18, 2.1944, 0.0)
    assert words_for_tokens(40, counted[:-1] + [(1, None)]) == (18, 2.1944, 0.0)
    assert words_for_tokens(16, [(0, None)] + counted[1:]) == (16, None, None) and words_for_tokens(16, []) == (16, None, None)
    assert words_for_tokens(1, counted)[0] == 1  # never an empty prompt
    assert [which for which, _p in vocabulary_prompts(1)] == [0] * 108  # one word a prompt: no second set
