"""Build what roles/observability/files/ ships from code: the dashboards (tools/observability/dashboards.py) and the
metric contract - every metric a dashboard query or an alert rule uses, with who uses it - read from the PromQL itself
(promql-parser), so a renamed metric is caught where it is used.

  build.py           write the files
  build.py --check   exit 1 when a shipped file differs from what the code builds (the unit tests run this)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

import promql_parser
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dashboards  # noqa: E402  pylint: disable=wrong-import-position

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = os.path.join(REPO, "roles", "observability", "files")
RULES = os.path.join(FILES, "llmfleet-rules.yml")
CONTRACT = os.path.join(FILES, "metric-contract.json")
# Grafana's template variables are no PromQL: a range and a label value stand in for them.
GRAFANA_VARIABLES = ((re.compile(r"\$__(rate_)?interval|\$__range"), "5m"), (re.compile(r"\$\{?\w+\}?"), "x"))
# Who exports what (series Prometheus makes itself are no engine's).
SOURCES = (("vllm:", "vllm"), ("haproxy_", "haproxy"), ("llmfleet_gpu_", "gpu_textfile"), ("llmfleet_", "textfile"),
           ("node_", "node_exporter"))
PROMETHEUS_OWN = {"up", "ALERTS", "ALERTS_FOR_STATE", "scrape_duration_seconds", "scrape_samples_scraped"}


def metric_names(expr):
    """The metric names a PromQL expression selects."""
    for pattern, stand_in in GRAFANA_VARIABLES:
        expr = pattern.sub(stand_in, expr)
    names = set()

    def walk(node):
        if node is None or isinstance(node, (str, int, float)):
            return
        if isinstance(node, list):
            for item in node:
                walk(item)
            return
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            return
        for attribute in ("lhs", "rhs", "expr", "param", "args", "vector_selector"):
            walk(getattr(node, attribute, None))

    walk(promql_parser.parse(expr))
    return names


def source_of(metric):
    for prefix, source in SOURCES:
        if metric.startswith(prefix):
            return source
    return "prometheus" if metric in PROMETHEUS_OWN else "unknown"


def dashboard_queries(name, board):
    for panel in board.get("panels", []):
        for target in panel.get("targets", []) or []:
            if target.get("expr"):
                yield "dashboard %s panel %s" % (name, json.dumps(panel.get("title"))), target["expr"]
    for annotation in board.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            yield "dashboard %s annotation %s" % (name, json.dumps(annotation.get("name"))), annotation["expr"]
    for variable in board.get("templating", {}).get("list", []):
        query = variable.get("query")
        match = re.match(r"label_values\((.*),\s*\w+\)$", query or "") if isinstance(query, str) else None
        if match:
            yield "dashboard %s variable %s" % (name, variable.get("name")), match.group(1)


def rule_queries(rules):
    for group in rules["groups"]:
        for rule in group["rules"]:
            kind, name = ("alert", rule["alert"]) if "alert" in rule else ("recording rule", rule["record"])
            yield "%s %s" % (kind, name), rule["expr"]


def contract(boards, rules):
    used_by = {}
    for user, expr in [q for name, board in boards.items() for q in dashboard_queries(name, board)] + list(rule_queries(rules)):
        for metric in metric_names(expr):
            used_by.setdefault(metric, set()).add(user)
    return [{"metric": metric, "source": source_of(metric), "used_by": sorted(users)}
            for metric, users in sorted(used_by.items())]


def build():
    boards = {name: json.loads(JSONEncoder(sort_keys=True, indent=2).encode(make().build()))
              for name, make in dashboards.DASHBOARDS.items()}
    with open(RULES, encoding="utf-8") as handle:
        rules = yaml.safe_load(handle)
    entries = contract(boards, rules)
    unknown = [e["metric"] for e in entries if e["source"] == "unknown"]
    if unknown:
        raise SystemExit("no exporter is known for %s (tools/observability/build.py SOURCES)" % ", ".join(unknown))
    files = {os.path.join(FILES, "dashboards", name): json.dumps(board, indent=2, sort_keys=True) + "\n"
             for name, board in boards.items()}
    files[CONTRACT] = json.dumps({"comment": "Built by tools/observability/build.py from the dashboards and the alert"
                                  " rules; do not edit.", "metrics": entries}, indent=2) + "\n"
    return files


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for path, text in build().items():
        try:
            with open(path, encoding="utf-8") as handle:
                current = handle.read()
        except FileNotFoundError:
            current = None
        if current == text:
            continue
        if args.check:
            stale.append(os.path.relpath(path, REPO))
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
            print("wrote", os.path.relpath(path, REPO))
    if stale:
        raise SystemExit("not what the code builds (run tools/observability/build.py): " + ", ".join(stale))


if __name__ == "__main__":
    main()
