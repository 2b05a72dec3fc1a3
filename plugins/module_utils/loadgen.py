# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Streaming load generator for OpenAI-compatible endpoints (vLLM), stdlib only.

Used by the ``llmfleet.vllm.throughput_check`` module on the target host and by
``bench/client.py``.  Design notes (the client must not be the bottleneck at
high concurrency on a small box):

* one event loop; one keep-alive HTTP/1.1 connection per concurrent worker;
* the hot path is an ``asyncio.Protocol``: bytes are parsed inside
  ``data_received`` (chunked transfer decoding + SSE framing) and the worker
  coroutine is only woken once per request, not once per token;
* one ``time.perf_counter()`` per socket read, shared by every event in it;
* token chunks are classified with ``bytes.find`` on compact JSON; only the
  final ``usage`` chunk (and non-compact JSON) goes through ``json.loads``;
* per-request chunk timestamps go into ``array('d')`` (no per-token objects kept).
"""
from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import ssl
import time
from array import array
from urllib.parse import urlsplit

try:  # pragma: no cover - optional accelerator on the target host
    import uvloop as _uvloop  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    _uvloop = None

perf_counter = time.perf_counter

ERROR_KINDS = ("http", "timeout", "connection", "stream_cut", "stream_error")

# ---------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------


def percentile(values, q):
    """Percentile with linear interpolation between closest ranks (numpy's default).

    ``values`` need not be sorted; ``q`` is in [0, 100].  Returns None for no values.
    """
    if q < 0 or q > 100:
        raise ValueError("percentile q must be within [0, 100], got %r" % (q,))
    n = len(values)
    if n == 0:
        return None
    data = sorted(values)
    if n == 1:
        return float(data[0])
    pos = (n - 1) * (q / 100.0)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return float(data[lo] + (data[hi] - data[lo]) * frac)


def summarize(values):
    """mean/p50/p90/p99/min/max of a sequence of floats (None entries when empty)."""
    n = len(values)
    if n == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "min": None, "max": None, "count": 0}
    data = sorted(values)
    out = {"mean": float(sum(data) / n), "min": float(data[0]), "max": float(data[-1]), "count": n}
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        out[name] = _sorted_percentile(data, q)
    return out


def _sorted_percentile(data, q):
    n = len(data)
    if n == 1:
        return float(data[0])
    pos = (n - 1) * (q / 100.0)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    return float(data[lo] + (data[hi] - data[lo]) * (pos - lo))


def rate(count, seconds):
    """count / seconds, 0.0 when the interval is empty."""
    if not seconds or seconds <= 0:
        return 0.0
    return float(count) / float(seconds)


# ---------------------------------------------------------------------------
# per-request record
# ---------------------------------------------------------------------------


class RequestRecord(object):
    """What one request measured.  Times are perf_counter seconds."""

    __slots__ = ("start", "first_token", "end", "chunk_times", "chunks", "usage_tokens",
                 "prompt_tokens", "status", "error", "error_detail", "done_marker")

    def __init__(self, start, keep_chunk_times=True):
        self.start = start
        self.first_token = 0.0
        self.end = 0.0
        self.chunk_times = array("d") if keep_chunk_times else None
        self.chunks = 0          # SSE events that carried generated text
        self.usage_tokens = -1   # usage.completion_tokens, -1 when not reported
        self.prompt_tokens = -1
        self.status = 0
        self.error = None        # None or one of ERROR_KINDS
        self.error_detail = ""
        self.done_marker = False

    @property
    def ok(self):
        return self.error is None

    @property
    def output_tokens(self):
        """Tokens from the stream's usage block, else the number of text chunks."""
        return self.usage_tokens if self.usage_tokens >= 0 else self.chunks

    @property
    def ttft(self):
        return self.first_token - self.start if self.chunks else None

    @property
    def latency(self):
        return self.end - self.start

    @property
    def tpot(self):
        """(latency - ttft) / (output_tokens - 1), vLLM's definition; None below 2 tokens."""
        n = self.output_tokens
        if not self.chunks or n < 2:
            return None
        return (self.end - self.first_token) / (n - 1)


# ---------------------------------------------------------------------------
# SSE event classification
# ---------------------------------------------------------------------------

_TEXT_MARKERS = (b'"text":"', b'"content":"', b'"reasoning_content":"', b'"reasoning":"')
_QUOTE = ord('"')


def classify_event(payload):
    """Classify one SSE ``data:`` payload (bytes) cheaply.

    Returns a tuple (kind, usage) where kind is one of ``done``, ``token``,
    ``empty``, ``error`` and usage is a dict (``completion_tokens``...) or None.
    """
    if payload == b"[DONE]":
        return "done", None
    if b'": ' in payload or b'"usage":{' in payload or b'"error"' in payload[:40]:
        return _classify_json(payload)
    for marker in _TEXT_MARKERS:
        i = payload.find(marker)
        if i >= 0 and payload[i + len(marker):i + len(marker) + 1] not in (b'"', b""):
            return "token", None
    if b'"object":"error"' in payload:
        return "error", None
    return "empty", None


def _has_text(choice):
    if not isinstance(choice, dict):
        return False
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"))
    return False


def _classify_json(payload):
    try:
        obj = json.loads(payload)
    except ValueError:
        return "error", None
    if not isinstance(obj, dict):
        return "error", None
    if "error" in obj or obj.get("object") == "error":
        return "error", None
    usage = obj.get("usage")
    choices = obj.get("choices") or []
    kind = "token" if any(_has_text(c) for c in choices) else "empty"
    return kind, usage if isinstance(usage, dict) else None


# ---------------------------------------------------------------------------
# incremental HTTP/1.1 response parser (chunked / content-length / until close) + SSE
# ---------------------------------------------------------------------------

(_S_HEAD, _S_CHUNK_SIZE, _S_CHUNK_DATA, _S_CHUNK_DATA_END, _S_TRAILER, _S_LENGTH, _S_UNTIL_CLOSE,
 _S_DONE) = range(8)


class HTTPError(Exception):
    """Malformed HTTP framing."""


class ResponseParser(object):
    """Incremental parser of one HTTP/1.1 response carrying an SSE stream.

    ``feed(data, t)`` consumes bytes received at time ``t``; SSE events are
    applied to ``record`` as they complete.  ``complete`` is True once the body
    ended (terminal chunk / Content-Length reached).  ``keep_alive`` tells whether
    the connection can carry another request.
    """

    __slots__ = ("record", "state", "buf", "sse", "status", "headers", "chunk_left",
                 "length_left", "keep_alive", "complete", "body", "is_sse", "max_head")

    def __init__(self, record, max_head=65536):
        self.record = record
        self.state = _S_HEAD
        self.buf = bytearray()
        self.sse = bytearray()
        self.status = 0
        self.headers = {}
        self.chunk_left = 0
        self.length_left = 0
        self.keep_alive = True
        self.complete = False
        self.body = bytearray()   # non-SSE bodies (errors), bounded
        self.is_sse = False
        self.max_head = max_head

    # -- framing -----------------------------------------------------------
    def feed(self, data, t):
        buf = self.buf
        buf += data
        pos = 0
        n = len(buf)
        while pos < n:
            state = self.state
            if state == _S_CHUNK_SIZE:
                i = buf.find(b"\r\n", pos)
                if i > pos:
                    # Fast path, the common case of a stream: a whole chunk (size line, data, CRLF) is here.
                    try:
                        size = int(buf[pos:i], 16)
                    except ValueError:
                        size = 0   # chunk extensions or junk: the careful path below decides
                    end = i + 2 + size
                    if size > 0 and end + 2 <= n and buf[end] == 13 and buf[end + 1] == 10:
                        if self.is_sse:
                            self.sse += buf[i + 2:end]
                        else:
                            self._body(buf[i + 2:end], t)
                        pos = end + 2
                        continue
                if i < 0:
                    if n - pos > 1024:
                        raise HTTPError("chunk size line too long")
                    break
                line = bytes(buf[pos:i])
                semi = line.find(b";")
                if semi >= 0:
                    line = line[:semi]
                try:
                    size = int(line.strip(), 16)
                except ValueError:
                    raise HTTPError("bad chunk size %r" % (line[:40],))
                if size < 0:
                    raise HTTPError("negative chunk size")
                pos = i + 2
                if size == 0:
                    self.state = _S_TRAILER
                else:
                    self.chunk_left = size
                    self.state = _S_CHUNK_DATA
            elif state == _S_CHUNK_DATA:
                take = min(self.chunk_left, n - pos)
                self._body(buf[pos:pos + take], t)
                pos += take
                self.chunk_left -= take
                if self.chunk_left == 0:
                    # chunk data is followed by CRLF
                    if n - pos < 2:
                        self.state = _S_CHUNK_DATA_END
                        break
                    if buf[pos:pos + 2] != b"\r\n":
                        raise HTTPError("missing CRLF after chunk data")
                    pos += 2
                    self.state = _S_CHUNK_SIZE
            elif state == _S_CHUNK_DATA_END:
                if n - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise HTTPError("missing CRLF after chunk data")
                pos += 2
                self.state = _S_CHUNK_SIZE
            elif state == _S_HEAD:
                i = buf.find(b"\r\n\r\n", pos)
                if i < 0:
                    if n - pos > self.max_head:
                        raise HTTPError("response head too large")
                    break
                self._head(bytes(buf[pos:i]))
                pos = i + 4
            elif state == _S_LENGTH:
                take = min(self.length_left, n - pos)
                self._body(buf[pos:pos + take], t)
                pos += take
                self.length_left -= take
                if self.length_left == 0:
                    self._finish(t)
            elif state == _S_UNTIL_CLOSE:
                self._body(buf[pos:n], t)
                pos = n
            elif state == _S_TRAILER:
                i = buf.find(b"\r\n", pos)
                if i < 0:
                    break
                empty = i == pos
                pos = i + 2
                if empty:
                    self._finish(t)
            else:  # _S_DONE: bytes after the response (pipelining is not used)
                pos = n
                self.keep_alive = False
        if pos:
            del buf[:pos]
        if self.is_sse and not self.complete and self.sse:
            self._events(t)

    def _head(self, head):
        lines = head.split(b"\r\n")
        status_line = lines[0]
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise HTTPError("bad status line %r" % (status_line[:80],))
        try:
            self.status = int(parts[1])
        except ValueError:
            raise HTTPError("bad status code %r" % (parts[1][:10],))
        headers = {}
        for line in lines[1:]:
            k, sep, v = line.partition(b":")
            if not sep:
                continue
            headers[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
        self.headers = headers
        self.record.status = self.status
        if parts[0] == b"HTTP/1.0":
            self.keep_alive = headers.get("connection", "").lower() == "keep-alive"
        else:
            self.keep_alive = "close" not in headers.get("connection", "").lower()
        self.is_sse = self.status == 200 and "text/event-stream" in headers.get("content-type", "")
        if 100 <= self.status < 200:
            # interim response (100 Continue): wait for the real one
            self.state = _S_HEAD
            return
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.state = _S_CHUNK_SIZE
        elif "content-length" in headers:
            try:
                self.length_left = int(headers["content-length"])
            except ValueError:
                raise HTTPError("bad content-length")
            self.state = _S_LENGTH
            if self.length_left == 0:
                self._finish(0.0)
        elif self.status in (204, 304):
            self._finish(0.0)
        else:
            self.state = _S_UNTIL_CLOSE
            self.keep_alive = False

    def _body(self, data, t):
        # SSE bytes are only collected here; feed() parses the events once per read.
        if self.is_sse:
            self.sse += data
        elif len(self.body) < 65536:
            self.body += data

    def _events(self, t):
        sse = self.sse
        if b"\r" in sse:
            # normalise CRLF / CR line ends; keep a trailing CR (its LF may follow)
            tail = b""
            if sse[-1:] == b"\r":
                tail = b"\r"
                del sse[-1:]
            norm = bytes(sse).replace(b"\r\n", b"\n").replace(b"\r", b"\n") + tail
            sse[:] = norm
        start = 0
        rec = self.record
        while True:
            i = sse.find(b"\n\n", start)
            if i < 0:
                break
            block = bytes(sse[start:i])
            start = i + 2
            if block.startswith(b"data: ") and b"\n" not in block:
                payload = block[6:]          # fast path: one data line
            else:
                payload = _event_data(block)
                if payload is None:
                    continue
            kind, usage = classify_event(payload)
            if kind == "token":
                if rec.chunks == 0:
                    rec.first_token = t
                rec.chunks += 1
                if rec.chunk_times is not None:
                    rec.chunk_times.append(t)
            elif kind == "done":
                rec.done_marker = True
            elif kind == "error":
                if rec.error is None:
                    rec.error = "stream_error"
                    rec.error_detail = payload[:300].decode("utf-8", "replace")
            if usage is not None:
                ct = usage.get("completion_tokens")
                if isinstance(ct, int):
                    rec.usage_tokens = ct
                pt = usage.get("prompt_tokens")
                if isinstance(pt, int):
                    rec.prompt_tokens = pt
        if start:
            del sse[:start]

    def _finish(self, t):
        self.state = _S_DONE
        self.complete = True
        self.record.end = t or perf_counter()
        if self.is_sse and self.sse:
            self._events(t)
            if self.sse:
                # a last event without its blank line: the stream ended mid-event
                self.sse += b"\n\n"
                self._events(t)

    def eof(self):
        """The peer closed the connection: a body delimited by close ends here."""
        if self.state == _S_UNTIL_CLOSE:
            self._finish(perf_counter())
        self.keep_alive = False


def _event_data(block):
    """The joined ``data`` field of one SSE event block (bytes, LF line ends) or None."""
    out = []
    for line in block.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        field, sep, value = line.partition(b":")
        if field != b"data":
            continue
        if value.startswith(b" "):
            value = value[1:]
        out.append(value)
    if not out:
        return None
    return b"\n".join(out)


# ---------------------------------------------------------------------------
# connection
# ---------------------------------------------------------------------------


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self):
        self.transport = None
        self.parser = None
        self.waiter = None
        self.closed = False
        self.received = 0
        self.used = 0

    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except (OSError, AttributeError):
                pass

    def data_received(self, data):
        parser = self.parser
        if parser is None:
            return
        self.received += len(data)
        try:
            parser.feed(data, perf_counter())
        except HTTPError as exc:
            self._fail("connection", "bad HTTP response: %s" % exc)
            self.transport.abort()
            return
        if parser.complete:
            self._resolve()

    def eof_received(self):
        if self.parser is not None:
            self.parser.eof()
            if self.parser.complete:
                self._resolve()
        return False

    def connection_lost(self, exc):
        self.closed = True
        parser = self.parser
        if parser is not None and not parser.complete:
            rec = parser.record
            if parser.state == _S_HEAD:
                self._fail("connection", "connection closed before response%s" % (": %s" % exc if exc else ""))
            elif rec.done_marker:
                self._resolve()   # everything arrived; only the framing tail is missing
            else:
                self._fail("stream_cut", "connection closed mid-stream%s" % (": %s" % exc if exc else ""))

    def _fail(self, kind, detail):
        rec = self.parser.record
        if rec.error is None or kind == "timeout":
            rec.error = kind
            rec.error_detail = detail
        self._wake()

    def _resolve(self):
        self._wake()

    def _wake(self):
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def timeout(self, seconds):
        if self.parser is not None and not self.parser.complete:
            self._fail("timeout", "no complete response within %ss" % seconds)
            if self.transport is not None:
                self.transport.abort()


# ---------------------------------------------------------------------------
# target / request building
# ---------------------------------------------------------------------------


class Target(object):
    """Where to send requests: parsed from base_url (server root or .../v1)."""

    def __init__(self, base_url, endpoint="completions", api_key=None, validate_certs=True):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("base_url must be an http(s) URL with a host, got %r" % (base_url,))
        if endpoint not in ("completions", "chat"):
            raise ValueError("endpoint must be 'completions' or 'chat', got %r" % (endpoint,))
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        root = parts.path.rstrip("/")
        if root.endswith("/v1"):
            root = root[:-3]
        self.root_path = root
        self.endpoint = endpoint
        self.path = root + ("/v1/chat/completions" if endpoint == "chat" else "/v1/completions")
        self.api_key = api_key
        self.ssl = None
        if self.scheme == "https":
            ctx = ssl.create_default_context()
            if not validate_certs:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self.ssl = ctx
        hostport = self.host if parts.port is None else "%s:%d" % (self.host, self.port)
        if ":" in self.host and parts.port is None:
            hostport = "[%s]" % self.host
        elif ":" in self.host:
            hostport = "[%s]:%d" % (self.host, self.port)
        self.host_header = hostport
        self.root_url = "%s://%s%s" % (self.scheme, hostport, root)

    def url(self, path):
        return self.root_url + path

    def request_head(self, length):
        auth = "Authorization: Bearer %s\r\n" % self.api_key if self.api_key else ""
        return ("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                "Accept: text/event-stream\r\n%sContent-Length: %d\r\n\r\n"
                % (self.path, self.host_header, auth, length)).encode("latin-1")


_WORDS = (
    "the of and to in is was for on that with as by at from his her an were which are this be had not "
    "but they their one all has have there been more can when who will no would other into time some "
    "what them first new only then than its also two after could people over made most may many such "
    "where these years well very out just because any those state under both same between through "
    "while during before small large right left water light river stone garden window market engine "
    "signal number memory yellow silver orange purple winter summer autumn spring morning evening"
).split()


def random_prompt(rng, approx_tokens):
    """Random common words, about one token each for usual BPE vocabularies."""
    n = max(1, int(approx_tokens))
    return " ".join(rng.choice(_WORDS) for _i in range(n))


def build_body(model, endpoint, prompt, max_tokens, ignore_eos=True, extra=None):
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


# ---------------------------------------------------------------------------
# load run
# ---------------------------------------------------------------------------


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


class _Worker(object):
    __slots__ = ("target", "conn", "loop")

    def __init__(self, target, loop):
        self.target = target
        self.conn = None
        self.loop = loop

    async def _connect(self, timeout):
        t = self.target
        _transport, conn = await asyncio.wait_for(
            self.loop.create_connection(_Conn, t.host, t.port, ssl=t.ssl,
                                        server_hostname=t.host if t.ssl else None),
            timeout)
        return conn

    def close(self):
        if self.conn is not None and self.conn.transport is not None:
            self.conn.transport.close()
        self.conn = None

    async def request(self, body, spec):
        """Send one streaming request on this worker's connection; returns a RequestRecord."""
        for attempt in (0, 1):
            rec = RequestRecord(perf_counter(), spec.keep_chunk_times)
            reused = self.conn is not None and not self.conn.closed
            if not reused:
                self.close()
                try:
                    self.conn = await self._connect(spec.connect_timeout_s)
                except asyncio.TimeoutError:
                    rec.error, rec.error_detail = "timeout", "connect timed out after %ss" % spec.connect_timeout_s
                    rec.end = perf_counter()
                    return rec
                except (OSError, ssl.SSLError) as exc:
                    rec.error, rec.error_detail = "connection", "connect failed: %s" % exc
                    rec.end = perf_counter()
                    return rec
            conn = self.conn
            conn.parser = ResponseParser(rec)
            conn.received = 0
            waiter = conn.waiter = self.loop.create_future()
            remaining = spec.timeout_s - (perf_counter() - rec.start)
            handle = self.loop.call_later(max(remaining, 0.0), conn.timeout, spec.timeout_s)
            conn.transport.write(self.target.request_head(len(body)) + body)
            conn.used += 1
            try:
                await waiter
            finally:
                handle.cancel()
                conn.waiter = None
            if not rec.end:
                rec.end = perf_counter()
            if rec.error is None and rec.end - rec.start > spec.timeout_s:
                # The loop woke up late (a loaded machine) with the whole answer already read: the timer had no chance.
                rec.error = "timeout"
                rec.error_detail = "no complete response within %ss (took %.3fs)" % (spec.timeout_s, rec.end - rec.start)
            parser = conn.parser
            conn.parser = None
            if rec.error == "connection" and reused and conn.received == 0 and attempt == 0:
                # the server closed an idle keep-alive connection as we sent: retry once
                self.close()
                continue
            if rec.error is None:
                if parser.status != 200:
                    rec.error = "http"
                    rec.error_detail = "HTTP %d: %s" % (parser.status, bytes(parser.body[:300]).decode("utf-8", "replace"))
                elif not parser.is_sse:
                    rec.error = "stream_error"
                    rec.error_detail = "response is not text/event-stream (%s)" % parser.headers.get("content-type", "?")
                elif not rec.done_marker:
                    rec.error = "stream_cut"
                    rec.error_detail = "stream ended without data: [DONE]"
            if not parser.keep_alive or rec.error in ("timeout", "stream_cut", "connection") or conn.closed:
                self.close()
            return rec
        return rec  # pragma: no cover


async def run_level(target, spec, body_fn, loop=None):
    """Run one load level.  ``body_fn(i)`` returns the JSON body (bytes) of request i.

    Returns (records, started_at, finished_at) with perf_counter times.
    """
    loop = loop or asyncio.get_running_loop()
    records = []
    state = {"next": 0}
    total = spec.requests
    t0 = perf_counter()
    deadline = t0 + spec.duration_s if spec.duration_s is not None else None

    async def work():
        w = _Worker(target, loop)
        try:
            while True:
                i = state["next"]
                if total is not None and i >= total:
                    return
                if deadline is not None and perf_counter() >= deadline:
                    return
                state["next"] = i + 1
                rec = await w.request(body_fn(i), spec)
                records.append(rec)
        finally:
            w.close()

    n_workers = spec.concurrency if total is None else min(spec.concurrency, total)
    await asyncio.gather(*[work() for _w in range(max(n_workers, 0))])
    t1 = perf_counter()
    return records, t0, t1


def level_stats(records, started, finished):
    """Aggregate one level's RequestRecords into the module's result dict."""
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    duration = finished - started
    errors = {}
    samples = []
    for r in failed:
        key = "http_%d" % r.status if r.error == "http" else r.error
        errors[key] = errors.get(key, 0) + 1
        if len(samples) < 5:
            samples.append("%s: %s" % (key, r.error_detail))
    out_usage = sum(r.usage_tokens for r in ok if r.usage_tokens >= 0)
    with_usage = sum(1 for r in ok if r.usage_tokens >= 0)
    out_chunks = sum(r.chunks for r in ok)
    out_tokens = sum(r.output_tokens for r in ok)
    partial = sum(r.output_tokens for r in failed)
    ttfts = [r.ttft for r in ok if r.chunks]
    tpots = [r.tpot for r in ok if r.tpot is not None]
    itls = array("d")
    for r in ok:
        ct = r.chunk_times
        if ct is not None and len(ct) > 1:
            prev = ct[0]
            for t in ct[1:]:
                itls.append(t - prev)
                prev = t
    lat = [r.latency for r in ok]
    n = len(records)
    return {
        "requests": n,
        "completed": len(ok),
        "failed": len(failed),
        "error_rate": (float(len(failed)) / n) if n else 0.0,
        "errors": errors,
        "error_samples": samples,
        "duration_s": duration,
        "output_tokens": out_tokens,
        "output_tokens_usage": out_usage,
        "requests_with_usage": with_usage,
        "output_chunks": out_chunks,
        "partial_output_tokens": partial,
        "prompt_tokens": sum(r.prompt_tokens for r in ok if r.prompt_tokens >= 0),
        "output_tok_s": rate(out_tokens, duration),
        "request_s": rate(len(ok), duration),
        "ttft_s": summarize(ttfts),
        "tpot_s": summarize(tpots),
        "itl_s": summarize(itls),
        "latency_s": summarize(lat),
    }


# ---------------------------------------------------------------------------
# small blocking helpers (between levels; no load in flight)
# ---------------------------------------------------------------------------

_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEInfNa]+)")


def parse_prometheus_counter(text, name):
    """Sum of all samples of metric ``name`` in a Prometheus text exposition (None if absent)."""
    total = None
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _METRIC_LINE.match(line)
        if m and m.group(1) == name:
            try:
                v = float(m.group(3))
            except ValueError:
                continue
            total = v if total is None else total + v
    return total


def new_event_loop(prefer_uvloop=True):
    """uvloop's loop when importable (and preferred), else asyncio's default."""
    if prefer_uvloop and _uvloop is not None:
        return _uvloop.new_event_loop()
    return asyncio.new_event_loop()


def loop_name(loop=None):
    if loop is not None:
        return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
    return "uvloop" if _uvloop is not None else "asyncio"


def make_rng(seed):
    return random.Random(seed)
