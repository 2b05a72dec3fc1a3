# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Render the benchmark comparison (Markdown + PNG) from records, without Ansible.

    tools/bench_report.py results/gpu1/kimi-k25/20261202T150000Z.json --compare-to minimax-m25 \
        --results-dir results --out /tmp/report

Same code as the llmfleet.vllm.benchmark_report module (plugins/module_utils/bench_report.py).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "plugins", "module_utils"))
_spec = importlib.util.spec_from_file_location(
    "bench_report", os.path.join(HERE, "..", "plugins", "module_utils", "bench_report.py"))
br = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(br)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("current", help="record of the current model")
    ap.add_argument("--compare-to", default="", help="record file, directory of records or model name")
    ap.add_argument("--results-dir", default="results", help="controller records dir (<host>/<model>/<ts>.json)")
    ap.add_argument("--host", default=None, help="host to look --compare-to up under (default: the record's)")
    ap.add_argument("--source", choices=["throughput_check", "vllm_bench"], default="throughput_check")
    ap.add_argument("--out", default=None, help="directory for <name>.md and .png (default: print Markdown only)")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    try:
        cur = br.load_record(args.current)
        prev_path = br.find_previous(args.compare_to, args.results_dir, args.host or cur.get("host") or "",
                                     exclude=args.current)
        if args.compare_to and prev_path is None:
            print("warning: no record found for %s" % args.compare_to, file=sys.stderr)
        prev = br.load_record(prev_path) if prev_path else None
        cmp = br.compare_records(cur, prev, args.source)
    except br.ReportError as exc:
        print("error: %s" % exc, file=sys.stderr)
        return 2
    name = "%s_vs_%s_%s" % (br.slug(cur["model"]), br.slug(prev["model"]) if prev else "none", cur.get("timestamp"))
    plot = None if (args.no_plot or not args.out) else name + ".png"
    md = br.render_markdown(cmp, plot_name=plot)
    if not args.out:
        sys.stdout.write(md)
        return 0
    os.makedirs(args.out, exist_ok=True)
    if plot:
        br.plot_png(cmp, os.path.join(args.out, plot))
    with open(os.path.join(args.out, name + ".md"), "w") as f:
        f.write(md)
    print(os.path.join(args.out, name + ".md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
