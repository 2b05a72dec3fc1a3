# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Incremental HTTP/1.1 response parser: chunked, Content-Length or until-close bodies, keep-alive.

Bytes are parsed as they arrive (``feed`` once per socket read, with that read's timestamp); the body of an SSE
response goes to loadgen_sse, once per read, which applies its events to the request's record.
"""
from __future__ import annotations

from time import perf_counter

from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_sse import apply_events


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

    @property
    def awaiting_head(self):
        """True until the response's status line and headers are in."""
        return self.state == _S_HEAD

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
            apply_events(self.sse, self.record, t)

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

    def _finish(self, t):
        self.state = _S_DONE
        self.complete = True
        self.record.end = t or perf_counter()
        if self.is_sse and self.sse:
            apply_events(self.sse, self.record, t)
            if self.sse:
                # a last event without its blank line: the stream ended mid-event
                self.sse += b"\n\n"
                apply_events(self.sse, self.record, t)

    def eof(self):
        """The peer closed the connection: a body delimited by close ends here."""
        if self.state == _S_UNTIL_CLOSE:
            self._finish(perf_counter())
        self.keep_alive = False
