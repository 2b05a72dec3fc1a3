"""tools/traffic/continuous_client.py against a real local HTTP server: every request counted with its status and
Retry-After, a cut stream counted as a failure, and the pause after a failure kept apart from the pause after a
success (back-to-back streams need none; a closed gateway's 503s must not be hammered)."""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))), "tools", "traffic"))
from continuous_client import ContinuousClient  # noqa: E402  pylint: disable=wrong-import-position


class _Handler(BaseHTTPRequestHandler):
    mode = "503"  # "503": closed gateway; "cut": a stream closed before its finish_reason; "stream": a whole stream

    def do_POST(self):  # noqa: N802  (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.mode == "503":
            body = b"The model is being switched on this host; retry after 5 s."
            self.send_response(503)
            self.send_header("Retry-After", "5")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for index in range(3):
            finish = "length" if index == 2 and self.mode == "stream" else None
            chunk = {"id": "c", "object": "text_completion", "created": 0, "model": "m",
                     "choices": [{"index": 0, "text": "x", "finish_reason": finish, "logprobs": None}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if self.mode == "stream":
            self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()


def _run(httpd, mode, seconds, **kwargs):
    _Handler.mode = mode
    client = ContinuousClient("http://127.0.0.1:%d/v1" % httpd.server_address[1], "m", **kwargs).start()
    time.sleep(seconds)
    client.stop()
    return client


def test_503_is_counted_with_its_retry_after_and_the_pause_after_failures_applies(server):
    unpaused = _run(server, "503", 0.6, interval_s=0)
    paused = _run(server, "503", 0.6, interval_s=0, failure_interval_s=0.25)
    assert all((r["ok"], r["status"], r["retry_after"]) == (False, 503, "5") for r in unpaused.requests + paused.requests)
    # 0.6 s with a 0.25 s pause after each failure leaves room for 3 requests at most; none leaves room for dozens.
    assert len(paused.requests) <= 3 < 10 < len(unpaused.requests), (len(paused.requests), len(unpaused.requests))


def test_a_whole_stream_is_ok_and_a_cut_one_is_a_failure_with_status_200(server):
    whole = _run(server, "stream", 0.3, interval_s=0.1, stream=True, max_tokens=3)
    cut = _run(server, "cut", 0.3, interval_s=0.1, stream=True, max_tokens=3)
    assert whole.requests and all(r["ok"] and r["chunks"] == 3 and r["finish_reason"] == "length" for r in whole.requests)
    assert cut.requests and all(not r["ok"] and r["status"] == 200 and r["error"].startswith("cut after 3 chunks")
                                for r in cut.requests), cut.requests[:2]
