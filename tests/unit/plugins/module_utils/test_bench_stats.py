# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Latency statistics of a load level, goodput, confidence intervals, verdicts and the stopping rule of rounds."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import bench_stats
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_record import RequestRecord
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_rounds import Repeats, round_order


def test_interval_uses_students_t():
    ci = bench_stats.interval([10, 12, 14])
    assert ci["n"] == 3 and ci["mean"] == 12 and ci["stdev"] == pytest.approx(2.0)
    assert ci["half_width"] == pytest.approx(4.303 * 2 / math.sqrt(3))
    assert (ci["low"], ci["high"]) == pytest.approx((12 - ci["half_width"], 12 + ci["half_width"]))
    assert ci["cv"] == pytest.approx(2 / 12) and ci["rel_half_width"] == pytest.approx(ci["half_width"] / 12)


def test_fewer_than_three_samples_have_no_interval():
    ci = bench_stats.interval([7.5])
    assert ci["mean"] == 7.5 and ci["low"] is None and ci["high"] is None and ci["cv"] is None
    ci = bench_stats.interval([7, 9])  # t would be 12.7: the spread is given, no interval
    assert ci["stdev"] == pytest.approx(math.sqrt(2)) and ci["low"] is None and ci["rel_half_width"] is None
    with pytest.raises(ValueError):
        bench_stats.interval([])


@pytest.mark.parametrize("df, t", [(1, 12.706), (4, 2.776), (30, 2.042), (35, 2.042), (59, 2.021), (500, 1.960)])
def test_t_quantiles_round_down_to_the_table(df, t):
    assert bench_stats.t_quantile_975(df) == t


def test_verdicts():
    a = bench_stats.interval([100, 102, 98])
    assert bench_stats.compare(a, bench_stats.interval([101, 99, 100])) == bench_stats.NO_DIFFERENCE
    assert bench_stats.compare(bench_stats.interval([130, 131, 129]), a) == "faster"
    assert bench_stats.compare(bench_stats.interval([70, 71, 69]), a) == "slower"
    assert bench_stats.compare(bench_stats.interval([70]), a) is None


def test_below_a_threshold_means_the_whole_interval():
    ci = bench_stats.interval([90, 100, 110])  # 100 ± 24.8
    assert not bench_stats.below(ci, 110) and bench_stats.below(ci, 125)
    assert bench_stats.below(bench_stats.interval([90]), 100)


def test_rounds_stop_when_converged_at_max_or_out_of_budget():
    rep = Repeats(minimum=3, maximum=10, target_rel=0.05, budget_s=60)
    tight, wide = bench_stats.interval([100, 101, 100]), bench_stats.interval([80, 120, 100])
    assert rep.stop_reason(bench_stats.interval([100, 100]), 1, 1) is None  # below the minimum
    assert Repeats(minimum=2, maximum=5).stop_reason(bench_stats.interval([100, 100]), 1, 1) is None  # no interval yet
    assert rep.stop_reason(tight, 3, 1) == "converged"
    assert rep.stop_reason(wide, 3, 1) is None
    assert rep.stop_reason(wide, 55, 6) == "budget"  # the next round would end after 60 s
    assert rep.stop_reason(bench_stats.interval([80, 120] * 5), 10, 1) == "max_repeats"
    assert Repeats().stop_reason(bench_stats.interval([5]), 1, 1) == "single"
    assert Repeats(minimum=4).maximum == 4  # max_repeats below min_repeats means min_repeats rounds


def _level(concurrency, samples):
    return {"concurrency": concurrency, "output_tok_s": sum(samples) / len(samples),
            "samples": [{"round": i + 1, "output_tok_s": v} for i, v in enumerate(samples)],
            "output_tok_s_ci": bench_stats.interval(samples)}


def test_ratio_gate_fails_a_level_only_beyond_noise():
    previous = [_level(1, [100, 130, 70]), _level(4, [400, 404, 396])]
    new = [_level(1, [75, 85, 80]), _level(4, [300, 302, 298]), _level(8, [9, 9, 9])]
    gate = bench_stats.ratio_gate(new, previous, 0.8)
    assert [lv["concurrency"] for lv in gate["levels"]] == [1, 4]  # c=8 has no previous figure
    by_c = {lv["concurrency"]: lv for lv in gate["levels"]}
    assert by_c[1]["ratio"] == 0.8 and by_c[1]["decided_on"] == "interval"
    assert by_c[1]["ratio_upper"] > 1.0  # 100 ± 74 before: too noisy to call 80 slower
    assert by_c[4]["ratio"] == 0.75 and by_c[4]["ratio_upper"] < 0.8
    assert [lv["concurrency"] for lv in gate["below"]] == [4]
    assert gate["below"][0]["text"].startswith("0.75× at concurrency 4 (at most 0.7")


def test_ratio_gate_does_not_let_a_clearly_slower_model_through():
    # Two rounds a side say next to nothing (t = 12.7): the ratio of the means decides; three rounds give an interval.
    two = bench_stats.ratio_gate([_level(1, [40, 42])], [_level(1, [100, 90])], 0.8)
    assert two["below"][0]["decided_on"] == "point" and two["below"][0]["ratio"] == 0.432
    three = bench_stats.ratio_gate([_level(1, [40, 42, 41])], [_level(1, [100, 90, 95])], 0.8)
    assert three["below"][0]["decided_on"] == "interval" and three["below"][0]["ratio_upper"] < 0.5


def test_ratio_gate_on_single_rounds_and_empty_previous_levels():
    gate = bench_stats.ratio_gate([{"concurrency": 1, "output_tok_s": 70.0}], [{"concurrency": 1, "output_tok_s": 100.0}], 0.8)
    assert gate["below"][0]["decided_on"] == "point" and gate["below"][0]["ratio_upper"] is None
    assert gate["below"][0]["text"] == "0.7× at concurrency 1 (fewer than 3 rounds: the ratio of the means)"
    dead = bench_stats.ratio_gate([_level(1, [5, 5, 5])], [_level(1, [0, 0, 0])], 0.8)
    assert dead["levels"] == [] and dead["not_comparable"] == [1]


def test_ratio_interval_matches_welch_on_logs():
    point, upper = bench_stats.ratio_interval([2, 2, 2], [1, 1, 1])
    assert point == 2 and upper == 2  # no spread
    point, upper = bench_stats.ratio_interval([90, 100, 110], [90, 100, 110])
    assert point == 1 and 1.2 < upper < 1.3


def test_interleaved_rounds_run_a_b_then_b_a():
    assert [round_order(turn, 2) for turn in range(4)] == [[0, 1], [1, 0], [0, 1], [1, 0]]
    assert [round_order(turn, 1) for turn in range(2)] == [[0], [0]]


# ------------------------------------------------------------------ a load level's requests

@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
def test_summarize_percentiles_match_numpy_linear(n):
    rng = random.Random(n)
    data = [rng.expovariate(3.0) for _i in range(n)]
    s = bench_stats.summarize(data)
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        assert s[name] == pytest.approx(float(np.percentile(data, q)), rel=1e-12, abs=1e-15), name
    assert s["count"] == n and s["min"] == min(data) and s["max"] == max(data)
    assert s["mean"] == pytest.approx(float(np.mean(data)))


def test_summarize():
    s = bench_stats.summarize([0.3, 0.1, 0.2, 0.4])
    assert s["count"] == 4 and s["min"] == 0.1 and s["max"] == 0.4
    assert s["mean"] == pytest.approx(0.25)
    assert s["p50"] == pytest.approx(0.25)
    assert s["p99"] == pytest.approx(np.percentile([0.1, 0.2, 0.3, 0.4], 99))
    assert bench_stats.summarize([7])["p99"] == 7.0
    assert bench_stats.summarize([4, 1, 3, 2])["p50"] == 2.5          # unsorted input
    empty = bench_stats.summarize([])
    assert empty["count"] == 0 and empty["p99"] is None and empty["mean"] is None


def test_rate():
    assert bench_stats.rate(1000, 2.0) == 500.0
    assert bench_stats.rate(10, 0) == 0.0
    assert bench_stats.rate(10, -1) == 0.0


def _rec(start, first, end, chunks, usage=-1, error=None, status=200):
    r = RequestRecord(start)
    r.first_token, r.end, r.chunks, r.usage_tokens, r.error, r.status = first, end, chunks, usage, error, status
    step = (end - first) / max(chunks - 1, 1)
    for i in range(chunks):
        r.chunk_times.append(first + i * step)
    return r


def test_level_stats_tok_s_and_errors():
    recs = [_rec(0.0, 0.1, 1.0, 10, usage=10), _rec(0.0, 0.2, 2.0, 10),
            _rec(0.5, 0.0, 0.6, 0, error="http", status=500),
            _rec(0.5, 0.7, 0.9, 3, error="stream_cut"), _rec(0, 0, 1, 0, error="timeout")]
    s = bench_stats.level_stats(recs, 0.0, 4.0)
    assert s["requests"] == 5 and s["completed"] == 2 and s["failed"] == 3
    assert s["errors"] == {"http_500": 1, "stream_cut": 1, "timeout": 1}
    assert s["error_rate"] == pytest.approx(0.6)
    assert s["output_tokens"] == 20 and s["output_tokens_usage"] == 10 and s["requests_with_usage"] == 1
    assert s["partial_output_tokens"] == 3
    assert s["output_tok_s"] == pytest.approx(5.0)      # 20 tokens / 4 s
    assert s["request_s"] == pytest.approx(0.5)
    assert s["ttft_s"]["count"] == 2 and s["ttft_s"]["mean"] == pytest.approx(0.15)
    assert s["itl_s"]["count"] == 18
    assert s["itl_s"]["mean"] == pytest.approx(((0.9 / 9) * 9 + (1.8 / 9) * 9) / 18)
    assert s["tpot_s"]["p50"] == pytest.approx((0.1 + 0.2) / 2)


def test_goodput_counts_the_requests_within_both_slos():
    recs = [_rec(0.0, 0.1, 1.0, 10), _rec(0.0, 0.5, 1.4, 10), _rec(0.0, 0.1, 3.0, 10),
            _rec(0.0, 0.1, 0.2, 1), _rec(0.0, 0.1, 0.5, 5, error="stream_cut")]
    assert bench_stats.goodput(recs, 2.0) is None                      # no SLO
    g = bench_stats.goodput(recs, 2.0, slo_ttft_s=0.2, slo_tpot_s=0.2)  # tpot: 0.1, 0.1, 0.32, none; ttft 0.5 misses
    assert g["requests_met"] == 2 and g["request_s"] == 1.0 and g["output_tok_s"] == pytest.approx(5.5)
    assert bench_stats.goodput(recs, 2.0, slo_ttft_s=0.2)["requests_met"] == 3
