# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Confidence intervals, verdicts and the stopping rule of repeated rounds."""
from __future__ import annotations

import math

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import bench_stats
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
