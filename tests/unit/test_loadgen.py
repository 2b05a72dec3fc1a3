# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unit tests of plugins/module_utils/loadgen.py: stats math, HTTP chunked + SSE parsing, classification."""
from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time

import numpy as np
import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import loadgen as lg


# ------------------------------------------------------------------ stats

@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 99, 99.9, 100])
@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
def test_percentile_matches_numpy_linear(q, n):
    rng = random.Random(n * 1000 + int(q * 10))
    data = [rng.expovariate(3.0) for _i in range(n)]
    assert lg.percentile(data, q) == pytest.approx(float(np.percentile(data, q)), rel=1e-12, abs=1e-15)


def test_percentile_edges():
    assert lg.percentile([], 50) is None
    assert lg.percentile([7], 99) == 7.0
    assert lg.percentile([1, 2, 3, 4], 50) == 2.5
    assert lg.percentile([4, 1, 3, 2], 0) == 1.0          # unsorted input
    assert lg.percentile([1, 2, 3, 4], 100) == 4.0
    with pytest.raises(ValueError):
        lg.percentile([1], 101)


def test_summarize():
    s = lg.summarize([0.3, 0.1, 0.2, 0.4])
    assert s["count"] == 4 and s["min"] == 0.1 and s["max"] == 0.4
    assert s["mean"] == pytest.approx(0.25)
    assert s["p50"] == pytest.approx(0.25)
    assert s["p99"] == pytest.approx(np.percentile([0.1, 0.2, 0.3, 0.4], 99))
    empty = lg.summarize([])
    assert empty["count"] == 0 and empty["p99"] is None and empty["mean"] is None


def test_rate():
    assert lg.rate(1000, 2.0) == 500.0
    assert lg.rate(10, 0) == 0.0
    assert lg.rate(10, -1) == 0.0


def _rec(start, first, end, chunks, usage=-1, error=None, status=200):
    r = lg.RequestRecord(start)
    r.first_token, r.end, r.chunks, r.usage_tokens, r.error, r.status = first, end, chunks, usage, error, status
    step = (end - first) / max(chunks - 1, 1)
    for i in range(chunks):
        r.chunk_times.append(first + i * step)
    return r


def test_record_tpot_ttft():
    r = _rec(10.0, 10.5, 12.5, 5, usage=9)
    assert r.ttft == pytest.approx(0.5)
    assert r.latency == pytest.approx(2.5)
    assert r.output_tokens == 9                         # usage wins over chunks
    assert r.tpot == pytest.approx(2.0 / 8)
    r2 = _rec(0.0, 0.1, 0.1, 1)
    assert r2.tpot is None and r2.output_tokens == 1    # one token: no TPOT
    r3 = lg.RequestRecord(0.0)
    assert r3.ttft is None and r3.tpot is None


def test_level_stats_tok_s_and_errors():
    recs = [_rec(0.0, 0.1, 1.0, 10, usage=10), _rec(0.0, 0.2, 2.0, 10),
            _rec(0.5, 0.0, 0.6, 0, error="http", status=500),
            _rec(0.5, 0.7, 0.9, 3, error="stream_cut"), _rec(0, 0, 1, 0, error="timeout")]
    s = lg.level_stats(recs, 0.0, 4.0)
    assert s["requests"] == 5 and s["completed"] == 2 and s["failed"] == 3
    assert s["errors"] == {"http_500": 1, "stream_cut": 1, "timeout": 1}
    assert s["error_rate"] == pytest.approx(0.6)
    assert s["output_tokens"] == 20 and s["output_tokens_usage"] == 10 and s["requests_with_usage"] == 1
    assert s["partial_output_tokens"] == 3
    assert s["output_tok_s"] == pytest.approx(5.0)      # 20 tokens / 4 s
    assert s["request_s"] == pytest.approx(0.5)
    assert s["ttft_s"]["count"] == 2 and s["ttft_s"]["mean"] == pytest.approx(0.15)
    assert s["itl_s"]["count"] == 18
    assert s["itl_s"]["mean"] == pytest.approx(((0.9 / 9) * 9 + (1.8 / 9) * 9) / 18)
    assert s["tpot_s"]["p50"] == pytest.approx((0.1 + 0.2) / 2)


# ------------------------------------------------------------------ classification

@pytest.mark.parametrize("payload, kind", [
    (b"[DONE]", "done"),
    (b'{"id":"x","choices":[{"index":0,"text":" hi","finish_reason":null}]}', "token"),
    (b'{"id":"x","choices":[{"index":0,"text":"","finish_reason":"length"}]}', "empty"),
    (b'{"choices":[{"delta":{"role":"assistant","content":""}}]}', "empty"),
    (b'{"choices":[{"delta":{"role":"assistant"}}]}', "empty"),
    (b'{"choices":[{"delta":{"content":"\\"q"}}]}', "token"),
    (b'{"choices":[{"delta":{"reasoning_content":"think"}}]}', "token"),
    (b'{"choices":[{"delta":{"content":" x"}}]}', "token"),
    (b'{"choices": [{"delta": {"content": ""}}]}', "empty"),       # spaced JSON takes the json path
    (b'{"choices": [{"delta": {"content": "a"}}]}', "token"),
    (b'{"error":{"message":"boom","code":500}}', "error"),
    (b'{"object":"error","message":"x"}', "error"),
    (b'not json {', "empty"),
    (b'not json": {', "error"),
])
def test_classify_event(payload, kind):
    assert lg.classify_event(payload)[0] == kind


def test_classify_usage_chunk():
    kind, usage = lg.classify_event(b'{"id":"c","choices":[],"usage":{"prompt_tokens":3,"total_tokens":10,'
                                    b'"completion_tokens":7}}')
    assert kind == "empty" and usage["completion_tokens"] == 7
    kind, usage = lg.classify_event(b'{"choices":[{"text":"z"}],"usage":{"completion_tokens":1}}')
    assert kind == "token" and usage["completion_tokens"] == 1


# ------------------------------------------------------------------ HTTP + SSE parser

def chunk(b):
    return b"%x\r\n%s\r\n" % (len(b), b)


def sse(obj):
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")).encode()) + b"\n\n"


HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
TOK = {"choices": [{"index": 0, "text": " t"}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}}


def stream(n=3, usage=True):
    body = b"".join(chunk(sse(TOK)) for _i in range(n))
    if usage:
        body += chunk(sse(USAGE))
    return HEAD + body + chunk(sse(b"[DONE]")) + b"0\r\n\r\n"


def feed_all(data, splits):
    rec = lg.RequestRecord(0.0)
    p = lg.ResponseParser(rec)
    pos = 0
    for k, cut in enumerate(splits + [len(data)]):
        p.feed(data[pos:cut], float(k + 1))
        pos = cut
    return p, rec


def test_parser_whole_stream():
    p, rec = feed_all(stream(), [])
    assert p.complete and p.keep_alive and p.status == 200 and p.is_sse
    assert rec.chunks == 3 and rec.usage_tokens == 3 and rec.prompt_tokens == 2 and rec.done_marker
    assert rec.error is None and rec.end == 1.0


@pytest.mark.parametrize("seed", range(25))
def test_parser_any_split_points(seed):
    data = stream(5)
    rng = random.Random(seed)
    splits = sorted(rng.sample(range(1, len(data)), rng.randint(1, 40)))
    p, rec = feed_all(data, splits)
    assert p.complete and rec.chunks == 5 and rec.usage_tokens == 3 and rec.done_marker


def test_parser_byte_by_byte_and_timestamps():
    data = stream(2)
    p, rec = feed_all(data, list(range(1, len(data))))
    assert p.complete and rec.chunks == 2
    times = list(rec.chunk_times)
    assert times[0] == rec.first_token and times[0] < times[1]


def test_parser_event_split_across_http_chunks_and_multi_event_chunk():
    ev = sse(TOK) + sse(TOK) + sse(TOK)
    body = chunk(ev[:10]) + chunk(ev[10:50]) + chunk(ev[50:]) + chunk(sse(b"[DONE]")) + b"0\r\n\r\n"
    p, rec = feed_all(HEAD + body, [])
    assert p.complete and rec.chunks == 3 and rec.usage_tokens == -1 and rec.output_tokens == 3


def test_parser_crlf_events_comments_multiline_and_extensions():
    body = (b": ping\r\n\r\n"
            b"event: message\r\ndata: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\n"
            b"data:{\"choices\":[{\"text\":\"b\"}]}\r\rdata: {\"choices\":\r\ndata: [{\"text\":\"c\"}]}\n\n"
            b"id: 3\n\ndata: [DONE]\n\n")
    framed = b"%x;ext=1\r\n%s\r\n0\r\nx-trailer: 1\r\n\r\n" % (len(body), body)
    for splits in ([], [HEAD.__len__() + 30], list(range(len(HEAD), len(HEAD) + len(framed), 7))):
        p, rec = feed_all(HEAD + framed, splits)
        assert p.complete and rec.chunks == 3 and rec.done_marker, splits


def test_parser_content_length_error_body_keepalive():
    body = b'{"object":"error","message":"overloaded"}'
    data = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(body), body)
    p, rec = feed_all(data, [20, 60])
    assert p.complete and p.status == 503 and not p.is_sse and p.keep_alive
    assert bytes(p.body) == body and rec.chunks == 0


def test_parser_connection_close_and_http10():
    p, _rec = feed_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n", [])
    assert p.complete and not p.keep_alive
    p, _rec = feed_all(b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", [])
    assert not p.keep_alive


def test_parser_body_until_close():
    rec = lg.RequestRecord(0.0)
    p = lg.ResponseParser(rec)
    p.feed(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + sse(TOK) + sse(b"[DONE]"), 1.0)
    assert not p.complete and rec.chunks == 1 and rec.done_marker
    p.eof()
    assert p.complete and not p.keep_alive


def test_parser_stream_error_event():
    body = chunk(sse(TOK)) + chunk(sse({"error": {"message": "engine dead", "code": 500}})) + chunk(sse(b"[DONE]"))
    p, rec = feed_all(HEAD + body + b"0\r\n\r\n", [])
    assert p.complete and rec.error == "stream_error" and "engine dead" in rec.error_detail


def test_parser_truncated_stream_is_incomplete():
    data = stream(4)
    p, rec = feed_all(data[:len(data) // 2], [])
    assert not p.complete and not rec.done_marker and rec.chunks >= 1


@pytest.mark.parametrize("bad", [
    b"HTTX/1.1 200 OK\r\n\r\n",
    b"HTTP/1.1 abc OK\r\n\r\n",
    HEAD + b"zz\r\n",
    HEAD + b"3\r\nabcXY",
])
def test_parser_rejects_bad_framing(bad):
    p = lg.ResponseParser(lg.RequestRecord(0.0))
    with pytest.raises(lg.HTTPError):
        p.feed(bad, 1.0)


def test_parser_100_continue_then_response():
    data = b"HTTP/1.1 100 Continue\r\n\r\n" + stream(2)
    p, rec = feed_all(data, [10])
    assert p.complete and p.status == 200 and rec.chunks == 2


# ------------------------------------------------------------------ target / body / prometheus

def test_target_paths():
    t = lg.Target("http://h:8000/v1/", "chat", api_key="k")
    assert t.path == "/v1/chat/completions" and t.url("/metrics") == "http://h:8000/metrics"
    assert b"Authorization: Bearer k\r\n" in t.request_head(5) and b"Content-Length: 5\r\n" in t.request_head(5)
    t = lg.Target("https://example.org/prefix")
    assert t.port == 443 and t.path == "/prefix/v1/completions" and t.ssl is not None
    assert b"Authorization" not in t.request_head(1)
    assert lg.Target("http://[::1]:9000").host_header == "[::1]:9000"
    with pytest.raises(ValueError):
        lg.Target("ftp://x")
    with pytest.raises(ValueError):
        lg.Target("http://x", "embeddings")


def test_build_body():
    b = json.loads(lg.build_body("m", "chat", "hi", 16, True, {"temperature": 0}))
    assert b == {"model": "m", "max_tokens": 16, "stream": True, "stream_options": {"include_usage": True},
                 "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True, "temperature": 0}
    b = json.loads(lg.build_body("m", "completions", "hi", 4, False))
    assert b["prompt"] == "hi" and "ignore_eos" not in b


def test_random_prompt_length_and_seed():
    p1 = lg.random_prompt(lg.make_rng(1), 50)
    assert len(p1.split()) == 50 and p1 == lg.random_prompt(lg.make_rng(1), 50)
    assert p1 != lg.random_prompt(lg.make_rng(2), 50)


def test_parse_prometheus_counter():
    text = ("# HELP vllm:generation_tokens_total x\n# TYPE vllm:generation_tokens_total counter\n"
            'vllm:generation_tokens_total{engine="0",model_name="a"} 120.0\n'
            'vllm:generation_tokens_total{engine="1",model_name="a"} 5\n'
            'vllm:generation_tokens_total_created{model_name="a"} 1.7e9\n'
            "vllm:prompt_tokens_total 9\n")
    assert lg.parse_prometheus_counter(text, "vllm:generation_tokens_total") == 125.0
    assert lg.parse_prometheus_counter(text, "vllm:prompt_tokens_total") == 9.0
    assert lg.parse_prometheus_counter(text, "nope") is None


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
        t = lg.Target("http://127.0.0.1:%d" % port)
        spec = lg.LoadSpec(concurrency, requests=n, timeout_s=timeout)
        recs, t0, t1 = await lg.run_level(t, spec, lambda i: b"{}")
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
        target = lg.Target("http://127.0.0.1:%d" % listener.getsockname()[1])
        return (await lg.run_level(target, lg.LoadSpec(1, requests=1, timeout_s=0.2), lambda i: b"{}"))[0]

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
        spec = lg.LoadSpec(2, requests=3, timeout_s=2)
        return await lg.run_level(lg.Target("http://127.0.0.1:%d" % port), spec, lambda i: b"{}")
    recs = asyncio.run(main())[0]
    assert [r.error for r in recs] == ["connection"] * 3


def test_loadspec_validation():
    with pytest.raises(ValueError):
        lg.LoadSpec(0, requests=1)
    with pytest.raises(ValueError):
        lg.LoadSpec(1)
