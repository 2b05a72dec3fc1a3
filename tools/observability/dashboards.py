"""The host and fleet dashboards, as code (Grafana's foundation SDK): every panel's queries use the labels the
collection's targets give (module_utils/observability.py) and the metrics the metric contract checks.

`python tools/observability/build.py` writes them to roles/observability/files/dashboards/."""
from __future__ import annotations

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, table, timeseries
from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement
from grafana_foundation_sdk.models.dashboard import DataSourceRef

DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
VLLM = 'job="llmfleet_vllm", host=~"$host", slot=~"$slot"'
GATEWAY = 'job="llmfleet_gateway", host=~"$host"'
NODE = 'host=~"$host"'
RATE = "[$__rate_interval]"


def query(expr, legend="", ref="A", instant=False):
    q = prometheus.Dataquery().expr(expr).legend_format(legend or "__auto").ref_id(ref).datasource(DS)
    return q.instant() if instant else q.range()


def graph(title, unit, *queries, description=""):
    panel = (timeseries.Panel().title(title).unit(unit).datasource(DS).height(8).span(12)
             .legend(common.VizLegendOptions().display_mode(LegendDisplayMode.LIST).placement(LegendPlacement.BOTTOM)
                     .show_legend(True).calcs([])))
    if description:
        panel = panel.description(description)
    for index, (expr, legend) in enumerate(queries):
        panel = panel.with_target(query(expr, legend, chr(ord("A") + index)))
    return panel


def quantiles(metric, selector, by, qs=(0.5, 0.9, 0.99)):
    return [("histogram_quantile(%s, sum by (%s, le) (rate(%s_bucket{%s}%s)))" % (q, by, metric, selector, RATE),
             "p%s {{%s}}" % (int(q * 100), by.split(", ")[-1])) for q in qs]


def variables(board, fleet=False):
    board = board.with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
    host = (dashboard.QueryVariable("host").label("Host").datasource(DS)
            .query('label_values(up{job="llmfleet_vllm"}, host)').multi(True).include_all(True).refresh(2))
    board = board.with_variable(host)
    if not fleet:
        slot = (dashboard.QueryVariable("slot").label("Slot").datasource(DS)
                .query('label_values(up{job="llmfleet_vllm", host=~"$host"}, slot)').multi(True).include_all(True)
                .refresh(2))
        board = board.with_variable(slot)
    return board


def pivot_annotations(board):
    """A mark at the end of every pivot (the textfile's time of the slot's last pivot, which changes with each)."""
    pivots = (dashboard.AnnotationQuery().name("Pivots").datasource(DS).enable(True).icon_color("orange")
              .expr('changes(llmfleet_pivot_last_timestamp_seconds{%s}[2m]) > 0' % NODE))
    return board.annotation(pivots)


def host_dashboard():
    board = (dashboard.Dashboard("llmfleet: host").uid("llmfleet-host").tags(["llmfleet", "vllm"])
             .refresh("30s").time("now-6h", "now").timezone("browser").editable())
    board = pivot_annotations(variables(board))
    by = "host, slot"
    board = board.with_row(dashboard.Row("Serving"))
    board = board.with_panel(graph(
        "Output tokens/s", "short",
        ("sum by (%s) (rate(vllm:generation_tokens_total{%s}%s))" % (by, VLLM, RATE), "{{slot}} output"),
        ("sum by (%s) (rate(vllm:prompt_tokens_total{%s}%s))" % (by, VLLM, RATE), "{{slot}} prompt")))
    board = board.with_panel(graph(
        "Requests running and waiting", "short",
        ("sum by (%s) (vllm:num_requests_running{%s})" % (by, VLLM), "{{slot}} running"),
        ("sum by (%s) (vllm:num_requests_waiting{%s})" % (by, VLLM), "{{slot}} waiting")))
    board = board.with_panel(graph("Time to first token", "s", *quantiles("vllm:time_to_first_token_seconds", VLLM, by)))
    board = board.with_panel(graph("Inter-token latency", "s", *quantiles("vllm:inter_token_latency_seconds", VLLM, by)))
    board = board.with_panel(graph("End-to-end request latency", "s",
                                   *quantiles("vllm:e2e_request_latency_seconds", VLLM, by, (0.5, 0.99))))
    board = board.with_panel(graph("Queue time", "s", *quantiles("vllm:request_queue_time_seconds", VLLM, by, (0.9,))))
    board = board.with_panel(graph(
        "KV cache usage", "percentunit", ("max by (%s) (vllm:kv_cache_usage_perc{%s})" % (by, VLLM), "{{slot}}")))
    board = board.with_panel(graph(
        "Preemptions/s", "short", ("sum by (%s) (rate(vllm:num_preemptions_total{%s}%s))" % (by, VLLM, RATE), "{{slot}}")))
    board = board.with_row(dashboard.Row("Gateway"))
    board = board.with_panel(graph(
        "Gateway responses/s by code", "reqps",
        ('sum by (proxy, code) (rate(haproxy_backend_http_responses_total{%s, proxy=~"slot_.+"}%s))' % (GATEWAY, RATE),
         "{{proxy}} {{code}}")))
    board = board.with_panel(graph(
        "Gateway 5xx share", "percentunit",
        ('sum by (proxy) (rate(haproxy_backend_http_responses_total{%s, code="5xx"}%s))'
         ' / sum by (proxy) (rate(haproxy_backend_http_responses_total{%s}%s))' % (GATEWAY, RATE, GATEWAY, RATE),
         "{{proxy}}")))
    board = board.with_row(dashboard.Row("GPUs"))
    board = board.with_panel(graph(
        "GPU power", "watt", ("sum by (host, gpu) (llmfleet_gpu_power_watts{%s})" % NODE, "GPU {{gpu}}"),
        description="From the collection's GPU textfile (NVML, every 15 s) through node_exporter."))
    board = board.with_panel(graph(
        "GPU memory used", "bytes", ("sum by (host, gpu) (llmfleet_gpu_memory_used_bytes{%s})" % NODE, "GPU {{gpu}}")))
    board = board.with_row(dashboard.Row("Pivots"))
    board = board.with_panel(
        table.Panel().title("Slots").datasource(DS).height(6).span(24)
        .with_target(query("llmfleet_slot_info{%s}" % NODE, instant=True).format("table")))
    board = board.with_panel(
        table.Panel().title("Last pivot of each slot").datasource(DS).height(6).span(24)
        .with_target(query("llmfleet_pivot_last_info{%s}" % NODE, instant=True).format("table")))
    board = board.with_panel(
        stat.Panel().title("Last pivot: downtime").unit("s").datasource(DS).height(4).span(8)
        .with_target(query("llmfleet_pivot_last_downtime_seconds{%s}" % NODE, "{{slot}}", instant=True)))
    board = board.with_panel(
        stat.Panel().title("Last pivot: load time").unit("s").datasource(DS).height(4).span(8)
        .with_target(query("llmfleet_pivot_last_load_seconds{%s}" % NODE, "{{slot}}", instant=True)))
    board = board.with_panel(
        stat.Panel().title("Last pivot: gate output tokens/s").unit("short").datasource(DS).height(4).span(8)
        .with_target(query("llmfleet_pivot_last_gate_output_tokens_per_second{%s}" % NODE, "{{slot}} c{{concurrency}}",
                           instant=True)))
    return board


def fleet_dashboard():
    board = (dashboard.Dashboard("llmfleet: fleet").uid("llmfleet-fleet").tags(["llmfleet", "vllm"])
             .refresh("1m").time("now-24h", "now").timezone("browser").editable())
    board = pivot_annotations(variables(board, fleet=True))
    fleet = 'job="llmfleet_vllm", host=~"$host"'
    board = board.with_panel(
        table.Panel().title("What the fleet serves").datasource(DS).height(8).span(24)
        .with_target(query('count by (model, revision, engine_version) (up{%s} == 1)' % fleet, instant=True)
                     .format("table")))
    board = board.with_panel(graph(
        "Output tokens/s by host", "short",
        ("sum by (host) (rate(vllm:generation_tokens_total{%s}%s))" % (fleet, RATE), "{{host}}")))
    board = board.with_panel(graph(
        "Requests waiting by host", "short", ("sum by (host) (vllm:num_requests_waiting{%s})" % fleet, "{{host}}")))
    board = board.with_panel(graph("Time to first token p99 by host", "s",
                                   *quantiles("vllm:time_to_first_token_seconds", fleet, "host", (0.99,))))
    board = board.with_panel(graph(
        "KV cache usage, fullest slot of each host", "percentunit",
        ("max by (host) (vllm:kv_cache_usage_perc{%s})" % fleet, "{{host}}")))
    board = board.with_panel(graph(
        "Gateway 5xx/s by host", "reqps",
        ('sum by (host) (rate(haproxy_backend_http_responses_total{%s, code="5xx"}%s))' % (GATEWAY, RATE), "{{host}}")))
    board = board.with_panel(graph(
        "GPU power by host", "watt", ("sum by (host) (llmfleet_gpu_power_watts{%s})" % NODE, "{{host}}")))
    board = board.with_panel(
        table.Panel().title("Last pivots").datasource(DS).height(8).span(24)
        .with_target(query("llmfleet_pivot_last_info{%s}" % NODE, instant=True).format("table")))
    board = board.with_panel(
        table.Panel().title("Slots not on the fleet's locked revision").datasource(DS).height(6).span(24)
        .with_target(query("llmfleet_slot_revision_locked{%s} == 0" % NODE, instant=True).format("table")))
    return board


DASHBOARDS = {"llmfleet-host.json": host_dashboard, "llmfleet-fleet.json": fleet_dashboard}
