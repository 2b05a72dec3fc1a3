# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Server-sent events of an OpenAI-compatible stream: framing, classification, and their effect on a RequestRecord.

Token chunks are classified with ``bytes.find`` on compact JSON; only the final ``usage`` chunk (and non-compact
JSON) goes through ``json.loads``.  Every event of one socket read shares that read's timestamp.
"""
from __future__ import annotations

import json

_TEXT_MARKERS = (b'"text":"', b'"content":"', b'"reasoning_content":"', b'"reasoning":"')


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


def event_data(block):
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


def apply_events(sse, rec, t):
    """Apply every complete event in ``sse`` (a bytearray of stream body, consumed in place) to ``rec`` at time t."""
    if b"\r" in sse:
        # normalise CRLF / CR line ends; keep a trailing CR (its LF may follow)
        tail = b""
        if sse[-1:] == b"\r":
            tail = b"\r"
            del sse[-1:]
        norm = bytes(sse).replace(b"\r\n", b"\n").replace(b"\r", b"\n") + tail
        sse[:] = norm
    start = 0
    while True:
        i = sse.find(b"\n\n", start)
        if i < 0:
            break
        block = bytes(sse[start:i])
        start = i + 2
        if block.startswith(b"data: ") and b"\n" not in block:
            payload = block[6:]          # fast path: one data line
        else:
            payload = event_data(block)
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
