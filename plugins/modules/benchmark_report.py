#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: benchmark_report
short_description: Compare two benchmark records of roles/benchmark as a Markdown table and a PNG plot
version_added: "0.1.0"
description:
  - Reads the benchmark record O(current) (JSON written by the C(llmfleet.vllm.benchmark) role) and the record
    named by O(compare_to), lines their concurrency levels up and writes a Markdown table (per concurrency
    output tok/s of each model, speedup current/previous, TTFT p99 of each, errors of each) plus time to ready
    and GPU energy per token, and a PNG plot of output tok/s (and TTFT p99) against concurrency.
  - Meant to run on the controller (C(delegate_to=localhost)); the plot needs matplotlib there.
  - Levels measured for one model only are shown with a dash and no speedup.
  - When O(compare_to) finds no record, a single-model report is written (RV(previous_found=false)), unless
    O(require_previous=true).
author:
  - llmfleet maintainers (@llmfleet)
options:
  current:
    description: Path of the benchmark record of the current model.
    type: path
    required: true
  compare_to:
    description:
      - The previous model's record. A record file, a directory of records (the newest, by file name, is used),
        or a model name looked up as O(results_dir)/O(host)/<model>/ (the newest record other than O(current)).
      - The current model's own name compares the newest run with the run before it.
    type: str
  results_dir:
    description: Controller directory of records laid out as C(<host>/<model>/<timestamp>.json).
    type: path
  host:
    description: Host whose records O(compare_to) is looked up under; default the current record's host.
    type: str
  dest_dir:
    description: Directory the report files are written to (created when missing).
    type: path
    required: true
  name:
    description: Base name of the report files; default C(<current>_vs_<previous>_<timestamp>).
    type: str
  source:
    description:
      - Which measurements to compare; V(vllm_bench) needs both records to hold C(vllm bench serve) levels.
    type: str
    choices: [throughput_check, vllm_bench]
    default: throughput_check
  plot:
    description:
      - Also write the PNG plot.
      - Without matplotlib on the host running the module, or when drawing fails, the Markdown report is still
        written, with a warning and RV(plot_skipped) saying why; the task does not fail.
    type: bool
    default: true
  require_previous:
    description: Fail when O(compare_to) is set but no previous record is found.
    type: bool
    default: false
  title:
    description: Report title; default C(<current> vs <previous> on <host>).
    type: str
attributes:
  check_mode:
    description: In check mode the comparison is computed and returned but no file is written.
extends_documentation_fragment:
  - llmfleet.vllm.attributes
requirements:
  - matplotlib (for the PNG of O(plot=true); without it only the Markdown report is written), on the host running the module
"""

EXAMPLES = r"""
- name: Compare the newly pivoted model with the one it replaced
  llmfleet.vllm.benchmark_report:
    current: "{{ lookup('llmfleet.vllm.results_dir') }}/gpu1/kimi-k25-int4/20261202T150000Z.json"
    compare_to: minimax-m25
    results_dir: "{{ lookup('llmfleet.vllm.results_dir') }}"
    dest_dir: "{{ lookup('llmfleet.vllm.results_dir') }}/reports/gpu1"
  delegate_to: localhost
"""

RETURN = r"""
markdown:
  description: The report text.
  returned: always
  type: str
report_path:
  description: Markdown file written (or that would be written in check mode).
  returned: always
  type: str
plot_path:
  description: PNG written (or that would be); null when O(plot=false) or when the plot was skipped.
  returned: always
  type: str
plot_skipped:
  description: Why no PNG was written although O(plot=true) (matplotlib missing, or drawing failed); null otherwise.
  returned: always
  type: str
current_path:
  description: Record of the current model.
  returned: always
  type: str
previous_path:
  description: Record compared with; null when none was found.
  returned: always
  type: str
previous_found:
  description: Whether a previous record was found.
  returned: always
  type: bool
comparison:
  description: Rows by concurrency (C(current_tok_s), C(previous_tok_s), C(speedup), C(current_ttft_p99_s), ...) and summary.
  returned: always
  type: dict
"""

import os
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.common.text.converters import to_native

from ansible_collections.llmfleet.vllm.plugins.module_utils.atomic_write import atomic_write, replace_durably
from ansible_collections.llmfleet.vllm.plugins.module_utils.bench_report import (
    ReportError,
    compare_records,
    find_previous,
    load_record,
    plot_png,
    render_markdown,
    slug,
)

try:
    import matplotlib  # noqa: F401  pylint: disable=unused-import
    HAS_MATPLOTLIB = True
except ImportError:
    HAS_MATPLOTLIB = False


def main():
    module = AnsibleModule(
        argument_spec=dict(
            current=dict(type="path", required=True),
            compare_to=dict(type="str"),
            results_dir=dict(type="path"),
            host=dict(type="str"),
            dest_dir=dict(type="path", required=True),
            name=dict(type="str"),
            source=dict(type="str", choices=["throughput_check", "vllm_bench"], default="throughput_check"),
            plot=dict(type="bool", default=True),
            require_previous=dict(type="bool", default=False),
            title=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    plot_skipped = None
    if p["plot"] and not HAS_MATPLOTLIB:
        # A report is worth more than its picture: a pivot that served and passed its gate must not fail here.
        plot_skipped = missing_required_lib("matplotlib")
    try:
        current = load_record(p["current"])
        host = p["host"] or current.get("host") or ""
        previous_path = None
        if p["compare_to"]:
            if not p["results_dir"] and not os.path.exists(p["compare_to"]):
                module.fail_json(msg="compare_to=%s is not a path: results_dir is needed to look the model up"
                                 % p["compare_to"])
            previous_path = find_previous(p["compare_to"], p["results_dir"] or "", host, exclude=p["current"])
        if p["compare_to"] and previous_path is None and p["require_previous"]:
            module.fail_json(msg="no benchmark record found for compare_to=%s (looked in %s)" % (
                p["compare_to"], os.path.join(p["results_dir"] or "", host, slug(p["compare_to"]))))
        previous = load_record(previous_path) if previous_path else None
        if p["source"] == "vllm_bench":
            for rec in [r for r in (current, previous) if r is not None]:
                if not (rec.get("vllm_bench") or {}).get("levels"):
                    module.fail_json(msg="source=vllm_bench but %s has no vllm bench serve levels" % rec["_path"])
        cmp = compare_records(current, previous, p["source"])
    except ReportError as exc:
        module.fail_json(msg=to_native(exc))

    name = p["name"] or "%s_vs_%s_%s" % (slug(current["model"]), slug(previous["model"]) if previous else "none",
                                         current.get("timestamp") or "run")
    report_path = os.path.join(p["dest_dir"], name + ".md")
    plot_path = os.path.join(p["dest_dir"], name + ".png") if p["plot"] and not plot_skipped else None
    markdown = render_markdown(cmp, p["title"], os.path.basename(plot_path) if plot_path else None)
    changed = True
    if os.path.isfile(report_path):
        with open(report_path) as f:
            changed = f.read() != markdown or (plot_path is not None and not os.path.isfile(plot_path))
    if changed and not module.check_mode:
        try:
            if not os.path.isdir(p["dest_dir"]):
                os.makedirs(p["dest_dir"])
            if plot_path:
                try:
                    plot_png(cmp, plot_path + ".tmp", p["title"])
                    replace_durably(plot_path + ".tmp", plot_path)
                except Exception as exc:  # pylint: disable=broad-except
                    plot_skipped = "drawing the plot failed: %s" % to_native(exc)
                    plot_path = None
                    markdown = render_markdown(cmp, p["title"], None)
            atomic_write(report_path, markdown)
        except (OSError, ValueError, RuntimeError) as exc:
            module.fail_json(msg="cannot write the report to %s: %s" % (p["dest_dir"], to_native(exc)),
                             exception=traceback.format_exc())
    if plot_skipped:
        module.warn("benchmark report written as Markdown only, without the PNG plot: %s" % plot_skipped)
    module.exit_json(changed=changed, markdown=markdown, report_path=report_path, plot_path=plot_path, plot_skipped=plot_skipped,
                     current_path=p["current"], previous_path=previous_path, previous_found=previous is not None,
                     comparison=cmp)


if __name__ == "__main__":
    main()
