# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Confidence intervals of repeated measurements and the verdicts drawn from them (standard library only).

A level of a benchmark is measured in rounds; each round gives one throughput sample. The 95 % confidence
interval of their mean uses Student's t (the rounds are few), and two intervals that overlap mean the data
show no significant difference.
"""
from __future__ import annotations

import math

CONFIDENCE = 0.95
# Two-sided 95 % quantiles of Student's t by degrees of freedom; above 30 the nearest smaller tabulated row.
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
    return _T975[max(k for k in _T975 if k <= df)]


def interval(samples, stop=None):
    """Mean, spread and 95 % confidence interval of samples; low/high are None for fewer than two."""
    values = [float(v) for v in samples]
    n = len(values)
    if n == 0:
        raise ValueError("no samples")
    mean = sum(values) / n
    out = {"confidence": CONFIDENCE, "n": n, "mean": mean, "stdev": None, "cv": None, "half_width": None,
           "rel_half_width": None, "low": None, "high": None, "stop": stop}
    if n >= 2:
        stdev = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
        half = t_quantile_975(n - 1) * stdev / math.sqrt(n)
        out.update(stdev=stdev, half_width=half, low=mean - half, high=mean + half,
                   cv=(stdev / mean) if mean else None, rel_half_width=(half / mean) if mean else None)
    return out


def converged(ci, target_rel):
    """True when the interval's half-width is within target_rel of its mean."""
    return ci["rel_half_width"] is not None and ci["rel_half_width"] <= target_rel


def compare(current, previous):
    """Verdict on two intervals (dicts of ``interval``): faster, slower, no significant difference, or None
    (no interval on one side: a single run cannot tell noise from a difference)."""
    if not current or not previous or current.get("low") is None or previous.get("low") is None:
        return None
    if current["low"] > previous["high"]:
        return "faster"
    if current["high"] < previous["low"]:
        return "slower"
    return NO_DIFFERENCE


def below(ci, threshold):
    """True when the measurement is below threshold: its whole interval, or with one sample the value itself."""
    if ci.get("high") is not None:
        return ci["high"] < threshold
    return ci["mean"] < threshold


def _mean_and_bound(level, bound):
    """(point, bound) of a throughput_check level's output tok/s; bound is the interval's low or high, else the point."""
    ci = level.get("output_tok_s_ci") or {}
    point = ci.get("mean") if ci.get("mean") is not None else float(level.get("output_tok_s") or 0.0)
    return point, (ci.get(bound) if ci.get(bound) is not None else point)


def ratio_gate(new_levels, previous_levels, min_ratio):
    """Levels where new throughput is below min_ratio x previous beyond doubt.

    Per common concurrency: ratio of the means and its most favourable value the 95 % intervals allow (new high /
    previous low); a level is below when even that is under min_ratio. A level measured once on both sides falls
    back to the point ratio.
    """
    previous = dict((int(lv["concurrency"]), lv) for lv in previous_levels or [])
    levels = []
    for new in new_levels or []:
        prev = previous.get(int(new["concurrency"]))
        if prev is None:
            continue
        prev_mean, prev_low = _mean_and_bound(prev, "low")
        new_mean, new_high = _mean_and_bound(new, "high")
        if prev_mean <= 0 or prev_low <= 0:
            continue
        interval_known = new_high != new_mean or prev_low != prev_mean
        ratio, upper = round(new_mean / prev_mean, 3), round(new_high / prev_low, 3)
        levels.append({"concurrency": int(new["concurrency"]), "previous_tok_s": round(prev_mean, 1),
                       "new_tok_s": round(new_mean, 1), "ratio": ratio, "ratio_upper": upper if interval_known else None,
                       "decided_on": "interval" if interval_known else "point",
                       "text": "%s× at concurrency %d (%s)" % (ratio, int(new["concurrency"]), (
                           "at most %s× within the 95 %% intervals" % upper) if interval_known else "one round each: no interval")})
    below = [lv for lv in levels if (lv["ratio_upper"] if lv["ratio_upper"] is not None else lv["ratio"]) < min_ratio]
    return {"min_ratio": min_ratio, "levels": levels, "below": below}
