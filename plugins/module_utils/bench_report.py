# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark records of roles/benchmark and the two-model comparison report.

A *record* is one sweep of one model on one host (JSON, schema ``RECORD_SCHEMA``)::

    {"schema": ..., "host": "gpu1", "model": "minimax-m25", "timestamp": "20261202T142700Z",
     "time_to_ready_s": 75.0, "levels": [{"concurrency": 1, "output_tok_s": 84.0, "request_s": ...,
     "ttft_s": {"mean", "p50", "p90", "p99"}, "tpot_s": {...}, "itl_s": {...}, "failed": 0, "errors": {},
     "power": {"watts_mean", "joules", "joules_per_token"} or null}, ...],
     "vllm_bench": null or {"levels": [...same keys...], "error": null},
     "gpu_power": {"available": false, "reason": "..."}, "summary": {...}}

``compare_records`` lines up two records by concurrency (current vs previous; speedup =
current / previous output tok/s; a verdict from the levels' 95 % intervals when they ran in rounds),
``render_markdown`` writes the table and ``plot_png`` the figure: tok/s (± interval) and TTFT p99 against
concurrency, and the Pareto view of tok/s per user against total tok/s (matplotlib, imported lazily with the
Agg backend: controller only).

Standard library only apart from the plot.
"""

from __future__ import annotations

import glob
import json
import os
import re

try:
    from ansible_collections.llmfleet.vllm.plugins.module_utils import bench_stats
except ImportError:  # tools/bench_report.py loads this file by path, beside bench_stats.py
    import bench_stats

RECORD_SCHEMA = "llmfleet.vllm/benchmark-record/v1"
STAT_KEYS = ("mean", "p50", "p90", "p99")
LATENCY_KEYS = ("ttft_s", "tpot_s", "itl_s", "latency_s")


class ReportError(Exception):
    """A record could not be read or a comparison target could not be found."""


def slug(name):
    """File-system safe form of a model name (``org/model`` -> ``org--model``)."""
    text = re.sub(r"[^A-Za-z0-9._+-]+", "-", str(name).replace("/", "--")).strip("-.")
    if not text:
        raise ReportError("model name %r has no usable characters" % (name,))
    return text


def _num(value):
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _stats(d):
    d = d or {}
    return dict((k, _num(d.get(k))) for k in STAT_KEYS)


# --------------------------------------------------------------------------- levels


def level_from_throughput_check(lvl):
    """Keep what a record needs of one llmfleet.vllm.throughput_check level."""
    out = {
        "concurrency": int(lvl["concurrency"]),
        "requests": int(lvl.get("requests") or 0),
        "completed": int(lvl.get("completed") or 0),
        "failed": int(lvl.get("failed") or 0),
        "error_rate": _num(lvl.get("error_rate")) or 0.0,
        "errors": dict(lvl.get("errors") or {}),
        "error_samples": list(lvl.get("error_samples") or [])[:3],
        "duration_s": _num(lvl.get("duration_s")),
        "output_tokens": int(lvl.get("output_tokens") or 0),
        # What the server's tokenizer counted of the prompts (usage), beside vllm bench serve's input tokens.
        "prompt_tokens": int(lvl.get("prompt_tokens") or 0),
        "output_tok_s": _num(lvl.get("output_tok_s")) or 0.0,
        "request_s": _num(lvl.get("request_s")) or 0.0,
        "server_output_tok_s": _num(lvl.get("server_output_tok_s")),
        "metrics_ratio": _num(lvl.get("metrics_ratio")),
        # Every round's sample, their 95 % interval and goodput under the SLOs (throughput_check's repeats).
        "samples": list(lvl.get("samples") or []),
        "output_tok_s_ci": lvl.get("output_tok_s_ci"),
        "goodput": lvl.get("goodput"),
    }
    for key in LATENCY_KEYS:
        out[key] = _stats(lvl.get(key))
    return out


def _ms_stats(raw, metric):
    out = {}
    for k in STAT_KEYS:
        name = {"mean": "mean_%s_ms", "p50": "median_%s_ms"}.get(k, k + "_%s_ms") % metric
        value = _num(raw.get(name))
        if value is None and k == "p50":
            value = _num(raw.get("p50_%s_ms" % metric))
        out[k] = value / 1000.0 if value is not None else None
    return out


def level_from_vllm_bench(raw, concurrency=None):
    """One ``vllm bench serve --save-result`` JSON -> a record level (times in seconds)."""
    if not isinstance(raw, dict) or "output_throughput" not in raw:
        raise ReportError("not a vllm bench serve result (no output_throughput)")
    conc = raw.get("max_concurrency")
    if conc is None:
        conc = concurrency
    if conc is None:
        raise ReportError("vllm bench result without max_concurrency")
    completed = int(raw.get("completed") or 0)
    num_prompts = raw.get("num_prompts")
    failed = raw.get("failed")
    if failed is None:
        failed = (int(num_prompts) - completed) if num_prompts is not None else 0
        if not failed and raw.get("errors"):
            failed = sum(1 for e in raw["errors"] if e)
    failed = int(failed)
    requests = completed + failed
    return {
        "concurrency": int(conc),
        "requests": requests,
        "completed": completed,
        "failed": failed,
        "error_rate": (float(failed) / requests) if requests else 0.0,
        "errors": {"failed": failed} if failed else {},
        "duration_s": _num(raw.get("duration")),
        "output_tokens": int(raw.get("total_output_tokens") or 0),
        "prompt_tokens": int(raw.get("total_input_tokens") or 0),
        "output_tok_s": _num(raw.get("output_throughput")) or 0.0,
        "request_s": _num(raw.get("request_throughput")) or 0.0,
        "ttft_s": _ms_stats(raw, "ttft"),
        "tpot_s": _ms_stats(raw, "tpot"),
        "itl_s": _ms_stats(raw, "itl"),
        "latency_s": _ms_stats(raw, "e2el"),
    }


def level_power(samples, t0, t1, duration_s, output_tokens):
    """Energy of one level from wall-clock samples [[t, total_watts], ...] within [t0, t1].

    Mean power over the window (time-weighted) x the level's measured duration; joules per
    output token. None when fewer than two samples fall in the window.
    """
    window = [(float(t), float(w)) for t, w in samples if t0 <= t <= t1]
    if len(window) < 2 or window[-1][0] <= window[0][0]:
        return None
    joules_window = 0.0
    for (ta, wa), (tb, wb) in zip(window, window[1:]):
        joules_window += (tb - ta) * (wa + wb) / 2.0
    watts_mean = joules_window / (window[-1][0] - window[0][0])
    duration = duration_s if duration_s else (t1 - t0)
    joules = watts_mean * duration
    return {
        "watts_mean": round(watts_mean, 2),
        "watts_max": round(max(sample[1] for sample in window), 2),
        "joules": round(joules, 3),
        "joules_per_token": round(joules / output_tokens, 6) if output_tokens else None,
        "samples": len(window),
    }


# --------------------------------------------------------------------------- records


def summarize(levels):
    ok = [lv for lv in levels if lv.get("output_tok_s")]
    peak = max(ok, key=lambda lv: lv["output_tok_s"]) if ok else None
    single = [lv for lv in levels if lv["concurrency"] == 1]
    epts = [lv["power"]["joules_per_token"] for lv in levels
            if lv.get("power") and lv["power"].get("joules_per_token") is not None]
    return {
        "peak_output_tok_s": peak["output_tok_s"] if peak else 0.0,
        "peak_concurrency": peak["concurrency"] if peak else None,
        "single_stream_tok_s": single[0]["output_tok_s"] if single else None,
        "requests": sum(lv.get("requests", 0) for lv in levels),
        "failed": sum(lv.get("failed", 0) for lv in levels),
        "min_joules_per_token": min(epts) if epts else None,
    }


def build_record(host, model, timestamp, throughput_results, settings=None, base_url=None,
                 time_to_ready_s=None, vllm_bench_raw=None, vllm_bench_error=None, power=None,
                 level_windows=None):
    """Assemble a record.

    throughput_results -- throughput_check results (each with ``levels``), in sweep order.
    vllm_bench_raw -- list of (concurrency, parsed JSON) of ``vllm bench serve``; None when not run.
    power -- {"available": bool, "reason": str, "samples": [[t, watts]], ...}; None when not sampled.
    level_windows -- {concurrency: (t_start, t_end)} wall-clock windows for the power split.
    """
    levels = []
    for res in throughput_results:
        for lvl in res.get("levels") or []:
            levels.append(level_from_throughput_check(lvl))
    if not levels:
        raise ReportError("no throughput_check level to record")
    gpu_power = {"available": False, "reason": "not sampled"}
    if power is not None:
        gpu_power = dict((k, v) for k, v in power.items() if k != "samples")
        gpu_power.setdefault("reason", None)
    samples = (power or {}).get("samples") or []
    for lvl in levels:
        lvl["power"] = None
        win = (level_windows or {}).get(lvl["concurrency"]) or (level_windows or {}).get(str(lvl["concurrency"]))
        if gpu_power.get("available") and samples and win:
            lvl["power"] = level_power(samples, win[0], win[1], lvl["duration_s"], lvl["output_tokens"])
    bench = None
    if vllm_bench_raw is not None or vllm_bench_error:
        blevels = []
        errors = [vllm_bench_error] if vllm_bench_error else []
        for conc, raw in vllm_bench_raw or []:
            try:
                blevels.append(level_from_vllm_bench(raw, conc))
            except ReportError as exc:
                errors.append("concurrency %s: %s" % (conc, exc))
        bench = {"levels": sorted(blevels, key=lambda lv: lv["concurrency"]),
                 "error": "; ".join(errors) or None}
    return {
        "schema": RECORD_SCHEMA,
        "host": host,
        "model": model,
        "timestamp": timestamp,
        "base_url": base_url,
        "time_to_ready_s": _num(time_to_ready_s),
        "settings": settings or {},
        "tool": "llmfleet.vllm.throughput_check",
        "levels": levels,
        "vllm_bench": bench,
        "gpu_power": gpu_power,
        "summary": summarize(levels),
    }


def load_record(path):
    try:
        with open(path) as f:
            rec = json.load(f)
    except (OSError, ValueError) as exc:
        raise ReportError("cannot read benchmark record %s: %s" % (path, exc))
    if not isinstance(rec, dict) or rec.get("schema") != RECORD_SCHEMA or not isinstance(rec.get("levels"), list):
        raise ReportError("%s is not a benchmark record (schema %s)" % (path, RECORD_SCHEMA))
    rec.setdefault("_path", path)
    return rec


def _records_in(directory, exclude=None):
    exclude = os.path.realpath(exclude) if exclude else None
    return sorted(p for p in glob.glob(os.path.join(directory, "*.json"))
                  if os.path.realpath(p) != exclude)


def find_previous(compare_to, results_dir, host, exclude=None):
    """Path of the record to compare with, or None.

    compare_to -- a record file, a directory of records (newest wins) or a model name, looked up
    as <results_dir>/<host>/<slug(model)>/ (newest record other than ``exclude``).
    """
    if not compare_to:
        return None
    if os.path.isfile(compare_to):
        return compare_to
    if os.path.isdir(compare_to):
        found = _records_in(compare_to, exclude)
        return found[-1] if found else None
    found = _records_in(os.path.join(results_dir, host, slug(compare_to)), exclude)
    return found[-1] if found else None


# --------------------------------------------------------------------------- comparison


def _levels_of(rec, source):
    if rec is None:
        return {}
    if source == "vllm_bench":
        levels = (rec.get("vllm_bench") or {}).get("levels") or []
    else:
        levels = rec.get("levels") or []
    return dict((int(lv["concurrency"]), lv) for lv in levels)


def speedup(current, previous):
    """current / previous, None when either is missing or previous is not positive."""
    if current is None or previous is None or previous <= 0:
        return None
    return current / previous


def compare_records(current, previous=None, source="throughput_check"):
    """Rows by concurrency (union of both sweeps, ascending) plus a summary."""
    cur, prev = _levels_of(current, source), _levels_of(previous, source)
    rows = []
    for conc in sorted(set(cur) | set(prev)):
        a, b = cur.get(conc), prev.get(conc)
        row = {"concurrency": conc}
        for side, lv in (("current", a), ("previous", b)):
            row[side + "_tok_s"] = lv["output_tok_s"] if lv else None
            row[side + "_request_s"] = lv["request_s"] if lv else None
            row[side + "_ttft_p99_s"] = (lv.get("ttft_s") or {}).get("p99") if lv else None
            row[side + "_tpot_p99_s"] = (lv.get("tpot_s") or {}).get("p99") if lv else None
            row[side + "_failed"] = lv["failed"] if lv else None
            row[side + "_requests"] = lv["requests"] if lv else None
            pw = lv.get("power") if lv else None
            row[side + "_joules_per_token"] = pw.get("joules_per_token") if pw else None
            ci = lv.get("output_tok_s_ci") if lv else None
            row[side + "_ci"] = ci if ci and ci.get("low") is not None else None
            if row[side + "_ci"]:
                row[side + "_tok_s"] = ci["mean"]
            tpot = row[side + "_tpot_p50_s"] = (lv.get("tpot_s") or {}).get("p50") if lv else None
            row[side + "_tok_s_per_user"] = (1.0 / tpot) if tpot else None
            row[side + "_goodput_tok_s"] = (lv.get("goodput") or {}).get("output_tok_s") if lv else None
        row["speedup"] = speedup(row["current_tok_s"], row["previous_tok_s"])
        row["verdict"] = bench_stats.compare(row["current_ci"], row["previous_ci"])
        rows.append(row)
    ratios = [r["speedup"] for r in rows if r["speedup"] is not None]
    both = [r for r in rows if r["current_tok_s"] is not None and r["previous_tok_s"] is not None]

    def side_info(rec, levels):
        if rec is None:
            return None
        return {
            "model": rec.get("model"), "host": rec.get("host"), "timestamp": rec.get("timestamp"),
            "base_url": rec.get("base_url"),
            "path": rec.get("_path"), "time_to_ready_s": rec.get("time_to_ready_s"),
            "peak_tok_s": max([lv["output_tok_s"] for lv in levels.values()] or [0.0]),
            "gpu_power": rec.get("gpu_power") or {"available": False, "reason": "not recorded"},
            "levels": sorted(levels),
            "interleaved_with": (rec.get("settings") or {}).get("interleaved_with"),
        }

    return {
        "source": source,
        "current": side_info(current, cur),
        "previous": side_info(previous, prev),
        "rows": rows,
        "speedup_min": min(ratios) if ratios else None,
        "speedup_max": max(ratios) if ratios else None,
        "only_current": sorted(set(cur) - set(prev)) if previous is not None else [],
        "only_previous": sorted(set(prev) - set(cur)),
        # "no significant difference" when every common level's intervals overlap; None when a side has no interval.
        "verdict": _overall_verdict(both) if previous is not None else None,
    }


def interleaved(cmp):
    """Whether the two sides were measured in one run, rounds alternating (the previous side is the current's peer)."""
    cur, prev = cmp["current"], cmp["previous"]
    peer = (cur or {}).get("interleaved_with") or {}
    return bool(prev and peer.get("record") and os.path.basename(prev.get("path") or "") == peer["record"]
                and (prev["host"], prev["timestamp"]) == (cur["host"], cur["timestamp"]))


def side_labels(cmp):
    """Names of the current and previous side: the models, told apart by run time (two runs) or as A and B (one run)."""
    cur, prev = cmp["current"], cmp["previous"]
    a, b = cur["model"], prev["model"] if prev else None
    if prev and a == b:
        if interleaved(cmp):
            return "%s (A)" % a, "%s (B)" % b
        return "%s @%s" % (a, cur["timestamp"]), "%s @%s" % (b, prev["timestamp"])
    return a, b


def _overall_verdict(rows):
    verdicts = [r["verdict"] for r in rows]
    if not rows or None in verdicts:
        return None
    differ = ["%s at concurrency %d" % (r["verdict"], r["concurrency"]) for r in rows if r["verdict"] != bench_stats.NO_DIFFERENCE]
    return "; ".join(differ) if differ else bench_stats.NO_DIFFERENCE


def _f(value, fmt="%.1f", none="—"):
    return none if value is None else fmt % value


def _ms(seconds):
    if seconds is None:
        return "—"
    if seconds >= 10:
        return "%.1f s" % seconds
    return "%.0f ms" % (seconds * 1000.0) if seconds >= 0.1 else "%.1f ms" % (seconds * 1000.0)


def _tok_s(row, side):
    ci = row[side + "_ci"]
    if ci is None:
        return _f(row[side + "_tok_s"])
    return "%.1f ± %.1f (n=%d)" % (ci["mean"], ci["half_width"], ci["n"])


def _errors(failed, requests):
    if failed is None:
        return "—"
    return "%d/%d" % (failed, requests or 0)


def _ready(seconds):
    if seconds is None:
        return "not recorded"
    if seconds >= 120:
        return "%.0f s (%.1f min)" % (seconds, seconds / 60.0)
    return "%.0f s" % seconds


def render_markdown(cmp, title=None, plot_name=None):
    """The comparison as Markdown (table per concurrency + summary)."""
    cur, prev = cmp["current"], cmp["previous"]
    a, b = side_labels(cmp)
    lines = ["# " + (title or ("%s vs %s on %s" % (a, b, cur["host"]) if prev else "%s on %s" % (a, cur["host"]))), ""]
    source = "vllm bench serve" if cmp["source"] == "vllm_bench" else "llmfleet.vllm.throughput_check"
    if interleaved(cmp):
        lines.append("Source: `%s`; one run %s, the rounds of %s (%s) and %s (%s) interleaved A B B A …, so that a change "
                     "of the machine's speed during the run falls on both." % (
                         source, cur["timestamp"], a, cur["base_url"], b, prev["base_url"]))
    else:
        lines.append("Source: `%s`; current run %s%s." % (
            source, cur["timestamp"], ("; previous run %s (%s)" % (prev["timestamp"], prev["host"])) if prev else ""))
    lines.append("")
    goodput = any(r["current_goodput_tok_s"] is not None or r["previous_goodput_tok_s"] is not None for r in cmp["rows"])
    if prev:
        lines.append("| Concurrency | %s tok/s | %s tok/s | Speedup | Verdict | %s TTFT p99 | %s TTFT p99 | %s errors | %s errors |%s"
                     % (a, b, a, b, a, b, (" %s goodput tok/s | %s goodput tok/s |" % (a, b)) if goodput else ""))
        lines.append("|---:|---:|---:|---:|:---|---:|---:|---:|---:|" + ("---:|---:|" if goodput else ""))
        for r in cmp["rows"]:
            lines.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s |%s" % (
                r["concurrency"], _tok_s(r, "current"), _tok_s(r, "previous"),
                _f(r["speedup"], "%.2f×"), r["verdict"] or "—", _ms(r["current_ttft_p99_s"]), _ms(r["previous_ttft_p99_s"]),
                _errors(r["current_failed"], r["current_requests"]),
                _errors(r["previous_failed"], r["previous_requests"]),
                (" %s | %s |" % (_f(r["current_goodput_tok_s"]), _f(r["previous_goodput_tok_s"]))) if goodput else ""))
    else:
        lines.append("| Concurrency | %s tok/s | req/s | TTFT p99 | TPOT p99 | tok/s per user | Errors |%s"
                     % (a, " Goodput tok/s |" if goodput else ""))
        lines.append("|---:|---:|---:|---:|---:|---:|:---:|" + ("---:|" if goodput else ""))
        for r in cmp["rows"]:
            lines.append("| %d | %s | %s | %s | %s | %s | %s |%s" % (
                r["concurrency"], _tok_s(r, "current"), _f(r["current_request_s"], "%.2f"),
                _ms(r["current_ttft_p99_s"]), _ms(r["current_tpot_p99_s"]), _f(r["current_tok_s_per_user"]),
                _errors(r["current_failed"], r["current_requests"]),
                (" %s |" % _f(r["current_goodput_tok_s"])) if goodput else ""))
    if any(r["current_ci"] or r["previous_ci"] for r in cmp["rows"]):
        lines += ["", "tok/s: mean ± half-width of its 95 % confidence interval over the rounds of a level (n rounds)."]
    lines.append("")
    lines.append("| | %s | %s |" % (a, b if prev else "—"))
    lines.append("|---|---:|---:|")
    lines.append("| Peak output tok/s | %s | %s |" % (_f(cur["peak_tok_s"]), _f(prev["peak_tok_s"]) if prev else "—"))
    prev_ready = _ready(prev["time_to_ready_s"]) if prev else "—"
    lines.append("| Time to ready | %s | %s |" % (_ready(cur["time_to_ready_s"]), prev_ready))

    notes = []

    def energy(side, key):
        gp = side["gpu_power"]
        if not gp.get("available"):
            note = "GPU power of %s not measured: %s." % (side["model"], gp.get("reason") or "no GPU power data")
            if note not in notes:
                notes.append(note)
            return "n/a"
        vals = [r[key] for r in cmp["rows"] if r[key] is not None]
        return "%.3f J/token (best), %s W mean" % (min(vals), _f(gp.get("watts_mean"), "%.0f")) if vals else "n/a"

    prev_energy = energy(prev, "previous_joules_per_token") if prev else "—"
    lines.append("| GPU energy | %s | %s |" % (energy(cur, "current_joules_per_token"), prev_energy))
    lines.append("")
    lines.extend(notes)
    lines.append("")
    if prev:
        if cmp["speedup_min"] is not None:
            lines.append("Speedup (%s over %s, output tok/s): %.2f× to %.2f×." % (a, b, cmp["speedup_min"], cmp["speedup_max"]))
            lines.append("Verdict: %s." % (
                cmp["verdict"] + (" (the 95 % intervals overlap at every level)" if cmp["verdict"] == bench_stats.NO_DIFFERENCE else "")
                if cmp["verdict"] else "not tested: a level measured in fewer than %d rounds has no interval (benchmark_min_repeats)"
                % bench_stats.MIN_ROUNDS))
        else:
            lines.append("No concurrency level was measured for both models: no speedup.")
        if cmp["only_current"]:
            lines.append("Only measured for %s: concurrency %s." % (cur["model"], ", ".join(map(str, cmp["only_current"]))))
        if cmp["only_previous"]:
            lines.append("Only measured for %s: concurrency %s." % (prev["model"], ", ".join(map(str, cmp["only_previous"]))))
    else:
        lines.append("No previous result to compare with.")
    if plot_name:
        lines += ["", "![output tok/s vs concurrency](%s)" % plot_name]
    return "\n".join(lines) + "\n"


def plot_png(cmp, path, title=None):
    """Write the tok/s (and TTFT p99) vs concurrency figure as PNG. Controller only (matplotlib)."""
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    cur, prev = cmp["current"], cmp["previous"]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2), dpi=100)
    try:
        series = [("current", cur, "o-", "tab:blue")]
        if prev:
            series.append(("previous", prev, "s--", "tab:orange"))
        labels = dict(zip(("current", "previous"), side_labels(cmp)))
        for side, info, style, color in series:
            label = labels[side]
            rows = [r for r in cmp["rows"] if r[side + "_tok_s"] is not None]
            if rows:
                ax1.errorbar([r["concurrency"] for r in rows], [r[side + "_tok_s"] for r in rows], fmt=style, color=color,
                             label=label, capsize=3,
                             yerr=[(r[side + "_ci"] or {}).get("half_width") or 0.0 for r in rows])
            # Pareto view: what one user gets (1 / TPOT p50) against what the server gives in all, per level.
            pareto = [r for r in rows if r[side + "_tok_s_per_user"] is not None]
            if pareto:
                ax3.plot([r[side + "_tok_s_per_user"] for r in pareto], [r[side + "_tok_s"] for r in pareto], style,
                         color=color, label=label)
                for r in pareto:
                    ax3.annotate("c=%d" % r["concurrency"], (r[side + "_tok_s_per_user"], r[side + "_tok_s"]),
                                 textcoords="offset points", xytext=(4, 4), fontsize="x-small")
            pts = [(r["concurrency"], r[side + "_ttft_p99_s"]) for r in cmp["rows"]
                   if r[side + "_ttft_p99_s"] is not None]
            if pts:
                ax2.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, label=label)
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency")
            ax.grid(True, which="both", alpha=0.3)
            concs = [r["concurrency"] for r in cmp["rows"]]
            if concs:
                ax.set_xticks(concs)
                ax.set_xticklabels([str(c) for c in concs])
            ax.legend(loc="best", fontsize="small")
        ax1.set_ylabel("output tokens/s")
        ax1.set_ylim(bottom=0)
        ax1.set_title("Output throughput")
        ax2.set_ylabel("TTFT p99 (s)")
        ax2.set_title("Time to first token, p99")
        ax3.set_xlabel("output tokens/s per user (1 / TPOT p50)")
        ax3.set_ylabel("output tokens/s, all users")
        ax3.set_title("Throughput vs interactivity")
        ax3.grid(True, alpha=0.3)
        if ax3.lines:
            ax3.legend(loc="best", fontsize="small")
        fig.suptitle(title or ("%s vs %s" % (cur["model"], prev["model"]) if prev else cur["model"]))
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path
