# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Confidence intervals of repeated measurements and the verdicts drawn from them (standard library only).

A level of a benchmark is measured in rounds; each round gives one throughput sample. The 95 % confidence
interval of their mean uses Student's t. It is given from MIN_ROUNDS rounds on: with two, t is 12.7 and the interval
says next to nothing. Two runs whose intervals overlap show no significant difference (a conservative test: it
calls fewer differences than a t-test would).
"""
from __future__ import annotations

import math

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
