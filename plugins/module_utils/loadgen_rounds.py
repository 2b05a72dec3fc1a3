# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A load level measured in rounds until its throughput is known well enough (sides alternating A B B A)."""
from __future__ import annotations

from time import perf_counter

from ansible_collections.llmfleet.vllm.plugins.module_utils import bench_stats
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen import run_level


class Repeats:
    """How many rounds a level gets: at least ``minimum``; more while the 95 % interval of the rounds' mean output
    tok/s is wider than ``target_rel`` of the mean, up to ``maximum`` rounds and ``budget_s`` seconds."""

    def __init__(self, minimum=1, maximum=1, target_rel=0.05, budget_s=None):
        self.minimum, self.maximum = minimum, max(minimum, maximum)
        self.target_rel, self.budget_s = target_rel, budget_s

    def stop_reason(self, ci, elapsed_s, last_round_s):
        """Why to stop after the rounds of ci, or None to run another."""
        if ci["n"] < self.minimum:
            return None
        if self.maximum == 1:
            return "single"
        if bench_stats.converged(ci, self.target_rel):
            return "converged"
        if ci["n"] >= self.maximum:
            return "max_repeats"
        if self.budget_s is not None and elapsed_s + last_round_s > self.budget_s:
            return "budget"
        return None


def round_sample(index, records, t0, t1, level_t0):
    stats = bench_stats.level_stats(records, t0, t1)
    return {"round": index, "start_s": round(t0 - level_t0, 3), "requests": stats["requests"],
            "completed": stats["completed"], "failed": stats["failed"], "duration_s": round(stats["duration_s"], 4),
            "output_tok_s": round(stats["output_tok_s"], 3), "request_s": round(stats["request_s"], 4),
            "ttft_p50_s": stats["ttft_s"]["p50"], "tpot_p50_s": stats["tpot_s"]["p50"]}


def round_order(turn, sides):
    """Side indexes in the order they run in turn ``turn``: A B, then B A, and so on (ABBA), so that a steady drift
    of the machine's speed falls on every side alike instead of on whichever side always goes second."""
    order = list(range(sides))
    return order if turn % 2 == 0 else order[::-1]


def measure_interleaved(loop, sides, spec, repeats):
    """Rounds of spec against each (target, body_fn) of sides in turn (see round_order), until every side may stop
    (Repeats); one (records, seconds under load, samples, interval) per side, in the order of sides.

    With two sides or more, rounds end only after whole A B B A blocks (a steady drift then weighs the same on each
    side), unless max_repeats comes first; the budget looks one block ahead."""
    state = [{"records": [], "samples": [], "busy_s": 0.0} for _side in sides]
    block = 1 if len(sides) == 1 else 2
    level_t0, turn = perf_counter(), 0
    while True:
        turn_s = 0.0
        for i in round_order(turn, len(sides)):
            target, body_fn = sides[i]
            recs, t0, t1 = loop.run_until_complete(run_level(target, spec, body_fn, loop))
            side = state[i]
            side["records"].extend(recs)
            side["busy_s"] += t1 - t0
            side["samples"].append(round_sample(len(side["samples"]) + 1, recs, t0, t1, level_t0))
            turn_s += t1 - t0
        turn += 1
        cis = [bench_stats.interval([s["output_tok_s"] for s in side["samples"]]) for side in state]
        if turn % block and turn < repeats.maximum:
            continue
        reasons = [repeats.stop_reason(ci, perf_counter() - level_t0, block * turn_s) for ci in cis]
        if all(reasons):
            for ci, reason in zip(cis, reasons):
                ci["stop"] = reason
            return [(side["records"], side["busy_s"], side["samples"], ci) for side, ci in zip(state, cis)]
