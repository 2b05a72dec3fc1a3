# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one streamed request measured (RequestRecord), and the kinds of failure it can end in.

The response parser fills it in; bench_stats.level_stats and goodput aggregate a level's records.
Per-request chunk timestamps go into ``array('d')`` (no per-token objects kept).
"""
from __future__ import annotations

from array import array

ERROR_KINDS = ("http", "timeout", "connection", "stream_cut", "stream_error")


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
