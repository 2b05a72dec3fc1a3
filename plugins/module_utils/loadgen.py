# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Streaming load generator for OpenAI-compatible endpoints (vLLM), stdlib only: the driver of one load level.

Used by the ``llmfleet.vllm.throughput_check`` module on the target host and by
``bench/client.py``.  Design notes (the client must not be the bottleneck at
high concurrency on a small box):

* one event loop; one keep-alive HTTP/1.1 connection per concurrent worker;
* the hot path is an ``asyncio.Protocol`` (loadgen_conn): bytes are parsed inside
  ``data_received`` (chunked transfer decoding in loadgen_http + SSE framing in
  loadgen_sse) and the worker coroutine is only woken once per request, not once per token;
* one ``time.perf_counter()`` per socket read, shared by every event in it;
* token chunks are classified with ``bytes.find`` on compact JSON; only the
  final ``usage`` chunk (and non-compact JSON) goes through ``json.loads``;
* per-request chunk timestamps go into ``array('d')`` (no per-token objects kept).

The parts: loadgen_workload (LoadSpec, prompts, bodies), loadgen_conn (Target, Connection), loadgen_http (the
response parser), loadgen_sse (events), loadgen_record (RequestRecord); bench_stats aggregates the records.
"""
from __future__ import annotations

import asyncio
import ssl
from time import perf_counter

from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_conn import Connection
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_http import ResponseParser
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_record import RequestRecord

try:  # pragma: no cover - optional accelerator on the target host
    import uvloop as _uvloop  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    _uvloop = None


class _Worker(object):
    """One concurrent client: its keep-alive connection (opened again when lost) and one request at a time."""

    __slots__ = ("target", "conn", "loop")

    def __init__(self, target, loop):
        self.target = target
        self.conn = None
        self.loop = loop

    async def _connect(self, timeout):
        t = self.target
        _transport, conn = await asyncio.wait_for(
            self.loop.create_connection(Connection, t.host, t.port, ssl=t.ssl,
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


def new_event_loop(prefer_uvloop=True):
    """uvloop's loop when importable (and preferred), else asyncio's default."""
    if prefer_uvloop and _uvloop is not None:
        return _uvloop.new_event_loop()
    return asyncio.new_event_loop()


def loop_name(loop=None):
    """``uvloop`` or ``asyncio``: the kind of ``loop``, else the kind new_event_loop() gives."""
    if loop is not None:
        return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
    return "uvloop" if _uvloop is not None else "asyncio"
