# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Unit tests of a streamed response's way into a RequestRecord: loadgen_record, loadgen_sse (event classification)
and loadgen_http (chunked HTTP/1.1 + SSE parsing)."""
from __future__ import annotations

import json
import random

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_http import HTTPError, ResponseParser
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_record import RequestRecord
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_sse import classify_event


# ------------------------------------------------------------------ record

def _rec(start, first, end, chunks, usage=-1):
    r = RequestRecord(start)
    r.first_token, r.end, r.chunks, r.usage_tokens = first, end, chunks, usage
    return r


def test_record_tpot_ttft():
    r = _rec(10.0, 10.5, 12.5, 5, usage=9)
    assert r.ttft == pytest.approx(0.5)
    assert r.latency == pytest.approx(2.5)
    assert r.output_tokens == 9                         # usage wins over chunks
    assert r.tpot == pytest.approx(2.0 / 8)
    r2 = _rec(0.0, 0.1, 0.1, 1)
    assert r2.tpot is None and r2.output_tokens == 1    # one token: no TPOT
    r3 = RequestRecord(0.0)
    assert r3.ttft is None and r3.tpot is None


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
    assert classify_event(payload)[0] == kind


def test_classify_usage_chunk():
    kind, usage = classify_event(b'{"id":"c","choices":[],"usage":{"prompt_tokens":3,"total_tokens":10,'
                                 b'"completion_tokens":7}}')
    assert kind == "empty" and usage["completion_tokens"] == 7
    kind, usage = classify_event(b'{"choices":[{"text":"z"}],"usage":{"completion_tokens":1}}')
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
    rec = RequestRecord(0.0)
    p = ResponseParser(rec)
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
    rec = RequestRecord(0.0)
    p = ResponseParser(rec)
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
    p = ResponseParser(RequestRecord(0.0))
    with pytest.raises(HTTPError):
        p.feed(bad, 1.0)


def test_parser_100_continue_then_response():
    data = b"HTTP/1.1 100 Continue\r\n\r\n" + stream(2)
    p, rec = feed_all(data, [10])
    assert p.complete and p.status == 200 and rec.chunks == 2
