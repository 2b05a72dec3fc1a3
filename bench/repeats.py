# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Spread of repeated benchmark runs on one model: one short run per level (before) against levels measured in
rounds until their 95 % interval is within ±5 % (now), on a real systemd test host with vLLM's CPU engine; and A/A
verdicts of back-to-back runs against those of one run whose rounds alternate between two sides (the slot against
itself: interleave_slot).

    .venv/bin/python bench/repeats.py [--runs 5] [--concurrency 1 8 32]

Side by side in one run: the three ways alternate (single, rounds, interleaved, single, ...) through
playbooks/benchmark.yml, so all see the same machine. Per level it reports the coefficient of variation of the
runs' output tok/s (the figure a user reads), the rounds each way took, and the A/A verdicts (the same model twice:
"no significant difference" is right) of consecutive runs in rounds and of each interleaved run's two sides. Prints
Markdown for docs/benchmarks.md and writes results/bench-repeats.json.
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import statistics
import tempfile
import time

import testbed_bench as tb

_spec = importlib.util.spec_from_file_location("bench_stats", os.path.join(tb.REPO, "plugins", "module_utils", "bench_stats.py"))
bench_stats = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_stats)

HOST, SSH_PORT, HUB_PORT, PORT, MODEL = "bench-repeats", 2239, 18099, 8731, "tiny-llama-a"
# One short run per level as the role did before (8 requests), the role's defaults now (3 to 10 rounds, ±5 %), and
# the same with the slot's rounds alternating with its own (an A/A in one run; the budget counts both sides).
ROUNDS = ["-e", "benchmark_min_repeats=3", "-e", "benchmark_max_repeats=10", "-e", "benchmark_target_ci_rel=0.05",
          "-e", "benchmark_repeat_budget_s=60"]
WAYS = {
    "single": ["-e", "benchmark_min_repeats=1", "-e", "benchmark_max_repeats=1"],
    "rounds": ROUNDS,
    "interleaved": ROUNDS[:-1] + ["benchmark_repeat_budget_s=120", "-e", "interleave_slot=default"],
}


def cv(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.mean(values) if len(values) > 1 and statistics.mean(values) else 0.0


def tok_s(level: dict) -> float:
    ci = level.get("output_tok_s_ci") or {}
    return ci["mean"] if ci.get("mean") is not None and ci.get("n", 1) > 1 else level["output_tok_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-repeats-")
    inventory, results = os.path.join(work, "inventory"), os.path.join(work, "results")
    os.makedirs(inventory)
    tb.write_inventory(inventory, {HOST: {"ansible_port": SSH_PORT, "llmfleet_models_extra": {MODEL: {"port": PORT}},
                                          "model_fetch_hf_endpoint": f"http://127.0.0.1:{HUB_PORT}",
                                          "pivot_benchmark": False}})
    common = ["-e", json.dumps({"benchmark_concurrency": args.concurrency}),
              "-e", "benchmark_requests_per_level=8", "-e", "benchmark_prompt_tokens=64", "-e", "benchmark_max_tokens=64",
              "-e", "benchmark_report_plot=false", "-e", "benchmark_gpu_power=false"]
    records: dict[str, list[dict]] = {way: [] for way in WAYS}
    walls: dict[str, list[float]] = {way: [] for way in WAYS}
    peers: list[dict] = []
    load_before = tb.load_average()
    tb.hub("start", HUB_PORT)
    tb.machine_up(HOST, SSH_PORT, tb.vllm_image())
    try:
        tb.run_playbook(inventory, os.path.join(tb.REPO, "playbooks", "pivot.yml"), "-e", f"model={MODEL}",
                        log=os.path.join(work, "pivot.log"))
        for run in range(args.runs):
            for way, extra in WAYS.items():
                out = os.path.join(results, way)
                _result, wall = tb.run_playbook(inventory, os.path.join(tb.REPO, "playbooks", "benchmark.yml"), *common,
                                                *extra, "-e", f"llmfleet_results_dir={out}",
                                                log=os.path.join(work, f"{way}-{run}.log"))
                newest = max(glob.glob(os.path.join(out, HOST, MODEL, "*Z.json")))
                with open(newest, encoding="utf-8") as fh:
                    records[way].append(json.load(fh))
                if way == "interleaved":
                    with open(newest[:-len(".json")] + "-interleaved.json", encoding="utf-8") as fh:
                        peers.append(json.load(fh))
                walls[way].append(wall)
                time.sleep(1)  # two records never share a timestamp
    finally:
        tb.machine_down(HOST)
        tb.hub("stop", HUB_PORT)
    rows = []
    for i, conc in enumerate(args.concurrency):
        row = {"concurrency": conc}
        for way in WAYS:
            levels = [rec["levels"][i] for rec in records[way]]
            values = [tok_s(lv) for lv in levels]
            row[way] = {"tok_s": [round(v, 1) for v in values], "cv": round(cv(values), 4),
                        "max_over_min": round(max(values) / min(values), 3),
                        "rounds": [(lv.get("output_tok_s_ci") or {}).get("n", 1) for lv in levels],
                        "half_width_rel": [round((lv.get("output_tok_s_ci") or {}).get("rel_half_width") or 0, 4)
                                           for lv in levels]}
        pairs = [bench_stats.compare(b["levels"][i]["output_tok_s_ci"], a["levels"][i]["output_tok_s_ci"])
                 for a, b in zip(records["rounds"], records["rounds"][1:])]
        row["a_a_verdicts"] = pairs
        row["a_a_interleaved"] = [bench_stats.compare(a["levels"][i]["output_tok_s_ci"], b["levels"][i]["output_tok_s_ci"])
                                  for a, b in zip(records["interleaved"], peers)]
        rows.append(row)
    summary = {"rows": rows, "wall_s": walls, "runs": args.runs, "logs": work, "load_average_before": load_before,
               "load_average_after": tb.load_average()}
    os.makedirs(os.path.join(tb.REPO, "results"), exist_ok=True)
    with open(os.path.join(tb.REPO, "results", "bench-repeats.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2)
    print(f"\n{args.runs} runs each way, alternating; {MODEL} on vLLM's CPU engine in a test host; 64 + 64 tokens; "
          f"logs under {work}; load before {load_before}, after {summary['load_average_after']}\n")
    print("| concurrency | CV single run | CV in rounds | max/min single | max/min rounds | rounds (median, range) "
          "| A/A back to back: no significant difference | A/A interleaved: no significant difference |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        same = sum(1 for v in r["a_a_verdicts"] if v == bench_stats.NO_DIFFERENCE)
        same_interleaved = sum(1 for v in r["a_a_interleaved"] if v == bench_stats.NO_DIFFERENCE)
        print(f"| {r['concurrency']} | {100 * r['single']['cv']:.1f} % | {100 * r['rounds']['cv']:.1f} % | "
              f"{r['single']['max_over_min']:.2f} | {r['rounds']['max_over_min']:.2f} | "
              f"{statistics.median(r['rounds']['rounds']):.0f} ({min(r['rounds']['rounds'])}-{max(r['rounds']['rounds'])}) | "
              f"{same}/{len(r['a_a_verdicts'])} | {same_interleaved}/{len(r['a_a_interleaved'])} |")
    print(f"\nwall per benchmark run: single {tb.spread(walls['single'])} s, rounds {tb.spread(walls['rounds'])} s, "
          f"interleaved {tb.spread(walls['interleaved'])} s")


if __name__ == "__main__":
    main()
