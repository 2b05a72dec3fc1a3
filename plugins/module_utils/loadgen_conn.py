# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where requests go and the wire they travel on: Target (an endpoint parsed from base_url, the request head)
and Connection (the asyncio protocol of one keep-alive HTTP/1.1 connection, one request at a time).

Bytes are parsed inside ``data_received``; the waiting request is only woken once the response is complete (or
failed), not once per token.  One ``perf_counter()`` per socket read, shared by every event in it.
"""
from __future__ import annotations

import asyncio
import socket
import ssl
from time import perf_counter
from urllib.parse import urlsplit

from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_http import HTTPError


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


class Connection(asyncio.Protocol):
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
            if parser.awaiting_head:
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
