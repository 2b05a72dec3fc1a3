# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Statistics of benchmark measurements (standard library only): the collection's one home for them.

A load level's requests: latency distributions (mean, p50/p90/p99 by linear interpolation between closest ranks,
numpy's default), rates, error counts (``level_stats``) and goodput under SLOs.

Repeated measurements: a level of a benchmark is measured in rounds; each round gives one throughput sample. The 95 %
confidence interval of their mean uses Student's t. It is given from MIN_ROUNDS rounds on: with two, t is 12.7 and
the interval says next to nothing. Two runs whose intervals overlap show no significant difference (a conservative
test: it calls fewer differences than a t-test would).
"""
from __future__ import annotations

import math
from array import array

CONFIDENCE = 0.95
MIN_ROUNDS = 3
# Two-sided 95 % quantiles of Student's t by degrees of freedom; between rows the nearest smaller one.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
         29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
NO_DIFFERENCE = "no significant difference"


def t_quantile_975(df):
    if df < 1:
        raise ValueError("degrees of freedom must be >= 1 (got %r)" % (df,))
    if df > 120:
        return 1.960
    return _T975[max(k for k in _T975 if k <= int(df))]


def _mean_var(values):
    n = len(values)
    mean = sum(values) / n
    return mean, (sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None


def interval(samples, stop=None):
    """Mean, spread and 95 % confidence interval of samples; no interval (low/high None) below MIN_ROUNDS."""
    values = [float(v) for v in samples]
    n = len(values)
    if n == 0:
        raise ValueError("no samples")
    mean, var = _mean_var(values)
    out = {"confidence": CONFIDENCE, "n": n, "mean": mean, "stdev": None, "cv": None, "half_width": None,
           "rel_half_width": None, "low": None, "high": None, "stop": stop}
    if var is not None:
        stdev = math.sqrt(var)
        out.update(stdev=stdev, cv=(stdev / mean) if mean else None)
    if n >= MIN_ROUNDS:
        half = t_quantile_975(n - 1) * out["stdev"] / math.sqrt(n)
        out.update(half_width=half, low=mean - half, high=mean + half, rel_half_width=(half / mean) if mean else None)
    return out


def converged(ci, target_rel):
    """True when the interval's half-width is within target_rel of its mean."""
    return ci["rel_half_width"] is not None and ci["rel_half_width"] <= target_rel


def compare(current, previous):
    """Verdict on two intervals (dicts of ``interval``): faster, slower, no significant difference, or None
    (no interval on one side: too few rounds to tell noise from a difference)."""
    if not current or not previous or current.get("low") is None or previous.get("low") is None:
        return None
    if current["low"] > previous["high"]:
        return "faster"
    if current["high"] < previous["low"]:
        return "slower"
    return NO_DIFFERENCE


def below(ci, threshold):
    """True when the measurement is below threshold: its whole interval, or without one its mean."""
    if ci.get("high") is not None:
        return ci["high"] < threshold
    return ci["mean"] < threshold


def ratio_interval(new_samples, previous_samples):
    """(ratio of the means, 95 % upper bound of new/previous) from the rounds' samples: Welch's interval on the
    logarithms (a ratio is a difference of logs). The bound is None below MIN_ROUNDS on a side or with a sample <= 0."""
    new, prev = [float(v) for v in new_samples], [float(v) for v in previous_samples]
    if not new or not prev or sum(prev) <= 0:
        return None, None
    point = (sum(new) / len(new)) / (sum(prev) / len(prev))
    if min(len(new), len(prev)) < MIN_ROUNDS or min(new + prev) <= 0:
        return point, None
    (m_new, v_new), (m_prev, v_prev) = _mean_var([math.log(v) for v in new]), _mean_var([math.log(v) for v in prev])
    s_new, s_prev = v_new / len(new), v_prev / len(prev)
    se2 = s_new + s_prev
    if se2 == 0:
        return point, point
    df = se2 ** 2 / (s_new ** 2 / (len(new) - 1) + s_prev ** 2 / (len(prev) - 1))
    return point, math.exp(m_new - m_prev + t_quantile_975(max(1, df)) * math.sqrt(se2))


def _samples(level):
    samples = [s.get("output_tok_s") for s in level.get("samples") or []]
    return samples if samples and None not in samples else [level.get("output_tok_s") or 0.0]


def ratio_gate(new_levels, previous_levels, min_ratio):
    """Levels where new throughput is below min_ratio x previous beyond noise.

    Per common concurrency: the ratio of the means and the 95 % upper bound of the ratio (Welch's interval on the
    logs of the rounds' samples); a level is below when that bound is under min_ratio. A level with fewer than
    MIN_ROUNDS rounds on a side is decided on the ratio of the means. A previous level that served nothing gives no
    ratio and is listed as not comparable.
    """
    previous = dict((int(lv["concurrency"]), lv) for lv in previous_levels or [])
    levels, not_comparable = [], []
    for new in new_levels or []:
        conc = int(new["concurrency"])
        prev = previous.get(conc)
        if prev is None:
            continue
        point, upper = ratio_interval(_samples(new), _samples(prev))
        if point is None:
            not_comparable.append(conc)
            continue
        ratio = round(point, 3)
        levels.append({"concurrency": conc, "previous_tok_s": round(sum(_samples(prev)) / len(_samples(prev)), 1),
                       "new_tok_s": round(sum(_samples(new)) / len(_samples(new)), 1), "ratio": ratio,
                       "ratio_upper": round(upper, 3) if upper is not None else None,
                       "decided_on": "interval" if upper is not None else "point",
                       "text": "%s× at concurrency %d (%s)" % (ratio, conc, (
                           "at most %s× within the 95 %% interval of the ratio" % round(upper, 3)) if upper is not None
                           else "fewer than %d rounds: the ratio of the means" % MIN_ROUNDS)})
    below_min = [lv for lv in levels if (lv["ratio_upper"] if lv["ratio_upper"] is not None else lv["ratio"]) < min_ratio]
    return {"min_ratio": min_ratio, "levels": levels, "below": below_min, "not_comparable": not_comparable}


# ---------------------------------------------------------------------------
# a load level's requests (the RequestRecords of loadgen_record)
# ---------------------------------------------------------------------------


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
    """Percentile q (0-100) of sorted, non-empty data: linear interpolation between closest ranks."""
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


def goodput(records, duration_s, slo_ttft_s=None, slo_tpot_s=None):
    """Completed requests within both SLOs (as ``vllm bench serve --goodput``) and their rates; None without SLOs."""
    if slo_ttft_s is None and slo_tpot_s is None:
        return None
    good = [r for r in records if r.ok
            and (slo_ttft_s is None or (r.chunks and r.ttft <= slo_ttft_s))
            and (slo_tpot_s is None or r.tpot is None or r.tpot <= slo_tpot_s)]
    return {"slo_ttft_s": slo_ttft_s, "slo_tpot_s": slo_tpot_s, "requests_met": len(good),
            "request_s": rate(len(good), duration_s), "output_tok_s": rate(sum(r.output_tokens for r in good), duration_s)}
