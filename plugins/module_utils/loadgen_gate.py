# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Option checks, threshold evaluation and the blocking HTTP helpers of throughput_check (its models, the server's
Prometheus token counter), used between levels: no load in flight."""
from __future__ import annotations

import json
import re
import ssl
import time
from urllib.error import HTTPError, URLError

from ansible.module_utils.urls import open_url

from ansible_collections.llmfleet.vllm.plugins.module_utils import bench_stats

GEN_COUNTER = "vllm:generation_tokens_total"
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


def validate_params(p):
    """Problems with the module's options, each naming the option (empty list when fine)."""
    problems = []
    conc = p.get("concurrency")
    if not conc:
        problems.append("concurrency must be a non-empty list of positive integers (got %r)" % (conc,))
    else:
        bad = [c for c in conc if c is None or c < 1]
        if bad:
            problems.append("concurrency values must be >= 1 (got %s)" % ", ".join(repr(b) for b in bad))
    positive = ("requests_per_level", "prompt_tokens", "max_tokens")
    for k in positive:
        v = p.get(k)
        if v is not None and v < 1:
            problems.append("%s must be >= 1 (got %r)" % (k, v))
    for k in ("duration_s", "timeout_s"):
        v = p.get(k)
        if v is not None and not v > 0:
            problems.append("%s must be > 0 (got %r)" % (k, v))
    for k in ("min_repeats", "max_repeats"):
        v = p.get(k)
        if v is not None and v < 1:
            problems.append("%s must be >= 1 (got %r)" % (k, v))
    # max_repeats 1 (the default) with a larger min_repeats means min_repeats rounds; other maxima must not be smaller.
    if (p.get("min_repeats") or 1) > (p.get("max_repeats") or 1) > 1:
        problems.append("max_repeats %r must be at least min_repeats %r" % (p["max_repeats"], p["min_repeats"]))
    for k in ("target_ci_rel", "repeat_budget_s", "slo_ttft_s", "slo_tpot_s"):
        v = p.get(k)
        if v is not None and not v > 0:
            problems.append("%s must be > 0 (got %r)" % (k, v))
    if p.get("warmup_requests") is not None and p["warmup_requests"] < 0:
        problems.append("warmup_requests must be >= 0 (got %r)" % (p["warmup_requests"],))
    for k in ("min_output_tok_s", "max_ttft_p99_s", "max_tpot_p99_s", "max_metrics_deviation"):
        v = p.get(k)
        if v is not None and v < 0:
            problems.append("%s must be >= 0 (got %r)" % (k, v))
    v = p.get("max_error_rate")
    if v is not None and not 0 <= v <= 1:
        problems.append("max_error_rate must be within 0..1 (got %r)" % (v,))
    base = p.get("base_url") or ""
    if not (base.startswith("http://") or base.startswith("https://")):
        problems.append("base_url must start with http:// or https:// (got %r)" % (base,))
    peer_url = (p.get("peer") or {}).get("base_url")
    if p.get("peer") is not None and not (peer_url or "").startswith(("http://", "https://")):
        problems.append("peer.base_url must start with http:// or https:// (got %r)" % (peer_url,))
    for i, lt in enumerate(p.get("level_thresholds") or []):
        if conc and lt.get("concurrency") not in conc:
            problems.append("level_thresholds[%d].concurrency %r is not one of concurrency %r"
                            % (i, lt.get("concurrency"), conc))
        for k in ("min_output_tok_s", "max_ttft_p99_s", "max_tpot_p99_s"):
            if lt.get(k) is not None and lt[k] < 0:
                problems.append("level_thresholds[%d].%s must be >= 0 (got %r)" % (i, k, lt[k]))
        if lt.get("max_error_rate") is not None and not 0 <= lt["max_error_rate"] <= 1:
            problems.append("level_thresholds[%d].max_error_rate must be within 0..1 (got %r)"
                            % (i, lt["max_error_rate"]))
    return problems


def _fmt(v, unit=""):
    if v is None:
        return "n/a"
    return ("%.4g" % v) + unit


def check_level(lvl, th):
    """Threshold messages for one measured level (empty list: passed)."""
    c = lvl["concurrency"]
    out = []
    where = "concurrency %d" % c
    if lvl["requests"] == 0:
        out.append("%s: no request was sent" % where)
        return out
    v = th.get("max_error_rate")
    if v is not None and lvl["error_rate"] > v:
        kinds = ", ".join("%s=%d" % kv for kv in sorted(lvl["errors"].items()))
        out.append("%s: error rate %.1f%% (%d of %d failed: %s) is above max_error_rate %.1f%%"
                   % (where, 100.0 * lvl["error_rate"], lvl["failed"], lvl["requests"], kinds, 100.0 * v))
    v = th.get("min_output_tok_s")
    ci = lvl.get("output_tok_s_ci")
    if v is not None and ci and ci.get("low") is not None:
        if bench_stats.below(ci, v):
            out.append("%s: output %.1f tok/s (95%% CI %.1f to %.1f over %d rounds) is below min_output_tok_s %s"
                       % (where, ci["mean"], ci["low"], ci["high"], ci["n"], _fmt(v)))
    elif v is not None and lvl["output_tok_s"] < v:
        out.append("%s: output %.1f tok/s is below min_output_tok_s %s (%d tokens in %.2f s, %d/%d requests ok)"
                   % (where, lvl["output_tok_s"], _fmt(v), lvl["output_tokens"], lvl["duration_s"],
                      lvl["completed"], lvl["requests"]))
    for key, stat, label in (("max_ttft_p99_s", "ttft_s", "TTFT"), ("max_tpot_p99_s", "tpot_s", "TPOT")):
        v = th.get(key)
        if v is None:
            continue
        p99 = lvl[stat]["p99"]
        if p99 is None:
            out.append("%s: no %s sample (no completed request with output) for %s %s" % (where, label, key, _fmt(v)))
        elif p99 > v:
            out.append("%s: %s p99 %s s is above %s %s s (p50 %s s, %d samples)"
                       % (where, label, _fmt(p99), key, _fmt(v), _fmt(lvl[stat]["p50"]), lvl[stat]["count"]))
    v = th.get("max_metrics_deviation")
    if v is not None and lvl.get("server_generation_tokens") is not None:
        srv = lvl["server_generation_tokens"]
        cli = lvl["output_tokens"]
        dev = abs(cli - srv) / srv if srv else (0.0 if cli == 0 else float("inf"))
        if dev > v:
            out.append("%s: client counted %d output tokens, server counter %s grew by %.0f (deviation %.2f%% "
                       "> max_metrics_deviation %.2f%%)" % (where, cli, GEN_COUNTER, srv, 100.0 * dev, 100.0 * v))
    return out


def _get(url, target, timeout):
    headers = {"Accept": "*/*"}
    if target.api_key:
        headers["Authorization"] = "Bearer %s" % target.api_key
    validate_certs = target.ssl is None or target.ssl.verify_mode != ssl.CERT_NONE
    resp = open_url(url, headers=headers, timeout=timeout, validate_certs=validate_certs)
    try:
        return resp.read()
    finally:
        resp.close()


def fetch_models(target, timeout):
    """Model ids listed by GET /v1/models."""
    url = target.url("/v1/models")
    try:
        data = json.loads(_get(url, target, timeout).decode("utf-8"))
    except HTTPError as exc:
        raise RuntimeError("GET %s failed: HTTP %s" % (url, exc.code))
    except (URLError, OSError, ValueError) as exc:
        raise RuntimeError("GET %s failed: %s" % (url, exc))
    return [m.get("id") for m in data.get("data") or [] if isinstance(m, dict) and m.get("id")]


def fetch_generation_tokens(metrics_url, target, timeout):
    """(value, None) or (None, reason)."""
    try:
        text = _get(metrics_url, target, min(timeout, 10.0)).decode("utf-8", "replace")
    except HTTPError as exc:
        return None, "GET %s: HTTP %s" % (metrics_url, exc.code)
    except (URLError, OSError, ValueError) as exc:
        return None, "GET %s: %s" % (metrics_url, exc)
    v = parse_prometheus_counter(text, GEN_COUNTER)
    if v is None:
        return None, "%s not found in %s" % (GEN_COUNTER, metrics_url)
    return v, None


def settle_counter(metrics_url, target, timeout, interval=0.1, max_wait=3.0):
    """Read the counter until two reads agree (the server may record stats just after the last byte)."""
    v, err = fetch_generation_tokens(metrics_url, target, timeout)
    if v is None:
        return v, err
    deadline = time.time() + max_wait
    while time.time() < deadline:
        time.sleep(interval)
        v2, err = fetch_generation_tokens(metrics_url, target, timeout)
        if v2 is None:
            return v2, err
        if v2 == v:
            return v, None
        v = v2
    return v, None
