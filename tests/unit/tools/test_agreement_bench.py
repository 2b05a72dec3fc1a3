"""bench/agreement.py's own arithmetic: the server's counters read from /metrics, the busy interval, the table."""
from __future__ import annotations

import http.server
import os
import sys
import threading

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench"))
import agreement  # noqa: E402  pylint: disable=wrong-import-position

METRICS = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 100.0
vllm:generation_tokens_total{engine="1",model_name="m"} 20.0
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 4.5
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} 2.0
"""


@pytest.fixture(name="metrics_url")
def fixture_metrics_url():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802  (http.server's name)
            body = METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d/metrics" % server.server_address[1]
    server.shutdown()


def test_counters_are_summed_over_label_sets_and_other_series_ignored(metrics_url):
    counters = agreement.read_counters(metrics_url)
    assert counters["vllm:generation_tokens_total"] == 120.0
    assert counters["vllm:e2e_request_latency_seconds_sum"] == 4.5
    assert counters["vllm:e2e_request_latency_seconds_count"] == 3.0
    assert counters["vllm:request_success_total"] == 0.0


def test_busy_interval_runs_from_the_last_poll_before_the_counter_moved_to_the_first_at_its_final_value():
    samples = [(0.0, 100), (1.0, 100), (2.0, 110), (3.0, 150), (4.0, 200), (5.0, 200), (6.0, 200)]
    assert agreement.busy_interval(samples, 0) == (100, 3.0)


def test_busy_interval_leaves_out_the_test_request_before_vllm_bench_starts_its_timer():
    # 64 tokens of the test request, a pause, then the benchmark's 136 tokens.
    samples = [(0.0, 100), (1.0, 164), (2.0, 164), (3.0, 200), (4.0, 300), (5.0, 300)]
    assert agreement.busy_interval(samples, 64) == (136, 2.0)


def test_busy_interval_without_generation_is_empty():
    assert agreement.busy_interval([(0.0, 5), (1.0, 5)], 0) == (0.0, 0.0)
    assert agreement.busy_interval([(0.0, 5)], 0) == (0.0, 0.0)


def test_table_gives_each_client_its_mean_interval_and_token_counts():
    runs = [{"concurrency": 8, "client": name, "output_tok_s": tok_s, "server_busy_tok_s": busy, "output_tokens": 512,
             "server_tokens": 512, "mean_latency_s": 1.0, "server_mean_latency_s": 0.9}
            for name, tok_s, busy in (("throughput_check", 100, 110), ("throughput_check", 120, 110),
                                      ("throughput_check", 110, 110), ("vllm bench serve", 130, 120))]
    lines = agreement.table(runs).splitlines()
    assert lines[2].startswith("| 8 | throughput_check | 110 ± 25 | 110 ± 0 | 1,536 / 1,536 |"), lines[2]
    assert lines[3].startswith("| 8 | vllm bench serve | 130 | 120 | 512 / 512 |"), lines[3]
