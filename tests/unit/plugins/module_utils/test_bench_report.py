# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""plugins/module_utils/bench_report.py: records, comparison table, plot, lookup of the previous record."""
from __future__ import annotations

import json
import os
import struct
import zlib

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import bench_report as br
from ansible_collections.llmfleet.vllm.plugins.module_utils import bench_stats

# Single-stream and c=8/c=128 figures of the hand-run notes (MiniMax-M2.5 after the pivot, Kimi-K2.5 before it).
MINIMAX = {1: 84.0, 8: 418.0, 128: 2500.0}
KIMI = {1: 61.0, 8: 300.0, 128: 1239.0}


def tc_level(conc, tok_s, failed=0, requests=None, ttft_p99=0.5, duration=10.0):
    requests = requests if requests is not None else max(8, 4 * conc)
    stats = {"mean": ttft_p99 / 2, "p50": ttft_p99 / 2, "p90": ttft_p99 * 0.9, "p99": ttft_p99,
             "min": 0.01, "max": ttft_p99, "count": requests - failed}
    return {
        "concurrency": conc, "requests": requests, "completed": requests - failed, "failed": failed,
        "error_rate": float(failed) / requests, "errors": {"http_500": failed} if failed else {},
        "error_samples": ["HTTP 500"] if failed else [], "duration_s": duration,
        "output_tokens": int(tok_s * duration), "output_tok_s": tok_s, "request_s": (requests - failed) / duration,
        "ttft_s": stats, "tpot_s": dict(stats, p99=0.02), "itl_s": dict(stats, p99=0.03), "latency_s": stats,
        "server_output_tok_s": tok_s, "metrics_ratio": 1.0, "thresholds": {}, "passed": True, "failures": [],
    }


def record(model, figures, host="gpu1", ts="20261202T120000Z", ready=None, **kw):
    tc = [{"levels": [tc_level(c, v, **kw)], "started_at": 1000.0 + c} for c, v in sorted(figures.items())]
    return br.build_record(host, model, ts, tc, time_to_ready_s=ready)


def write(path, rec):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(rec, f)
    return str(path)


def png_size(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    # every chunk's CRC is right and the file ends with IEND
    pos = 8
    while pos < len(data):
        length = struct.unpack(">I", data[pos:pos + 4])[0]
        ctype = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        crc = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]
        assert zlib.crc32(ctype + body) & 0xffffffff == crc, "bad CRC in %r" % ctype
        pos += 12 + length
        if ctype == b"IEND":
            break
    assert ctype == b"IEND" and pos == len(data)
    return width, height, len(data)


# ----------------------------------------------------------------------------- records


def test_record_keeps_levels_and_summary():
    rec = record("minimax-m25", MINIMAX, ready=75.0)
    assert rec["schema"] == br.RECORD_SCHEMA
    assert [lv["concurrency"] for lv in rec["levels"]] == [1, 8, 128]
    assert rec["levels"][0]["ttft_s"] == {"mean": 0.25, "p50": 0.25, "p90": 0.45, "p99": 0.5}
    assert "thresholds" not in rec["levels"][0]
    assert rec["summary"]["peak_output_tok_s"] == 2500.0
    assert rec["summary"]["peak_concurrency"] == 128
    assert rec["summary"]["single_stream_tok_s"] == 84.0
    assert rec["time_to_ready_s"] == 75.0
    assert rec["gpu_power"] == {"available": False, "reason": "not sampled"}
    assert all(lv["power"] is None for lv in rec["levels"])
    assert rec["vllm_bench"] is None


def test_record_without_levels_is_an_error():
    with pytest.raises(br.ReportError, match="no throughput_check level"):
        br.build_record("h", "m", "t", [{"levels": []}])


def test_level_power_split_and_energy_per_token():
    # 400 W for 10 s on the level window, 100 W outside it.
    samples = [[t, 100.0] for t in range(0, 10)] + [[t, 400.0] for t in range(10, 21)] + [[t, 100.0] for t in range(21, 30)]
    power = {"available": True, "reason": None, "source": "nvml", "watts_mean": 250.0, "samples": samples}
    tc = [{"levels": [tc_level(8, 200.0, duration=10.0)], "started_at": 10.0}]
    rec = br.build_record("h", "m", "t", tc, power=power, level_windows={8: (10.0, 20.0)})
    md = br.render_markdown(br.compare_records(rec, None))
    assert "| GPU energy | 2.000 J/token (best), 250 W mean | — |" in md
    pw = rec["levels"][0]["power"]
    assert pw["watts_mean"] == 400.0
    assert pw["joules"] == 4000.0
    assert pw["joules_per_token"] == pytest.approx(4000.0 / 2000)
    assert "samples" not in rec["gpu_power"]
    assert rec["summary"]["min_joules_per_token"] == pytest.approx(2.0)


def test_level_power_needs_two_samples():
    assert br.level_power([[5.0, 300.0]], 0, 10, 10, 100) is None


VLLM_BENCH = {
    "date": "20261202-150000", "backend": "vllm", "model_id": "/srv/models/tiny-llama-a", "num_prompts": 16,
    "max_concurrency": 4, "duration": 2.0, "completed": 15, "total_input_tokens": 480, "total_output_tokens": 240,
    "request_throughput": 7.5, "output_throughput": 120.0, "total_token_throughput": 360.0,
    "mean_ttft_ms": 50.0, "median_ttft_ms": 40.0, "p90_ttft_ms": 80.0, "p99_ttft_ms": 95.0, "std_ttft_ms": 9.0,
    "mean_tpot_ms": 10.0, "median_tpot_ms": 9.0, "p99_tpot_ms": 20.0,
    "mean_itl_ms": 10.0, "median_itl_ms": 9.5, "p99_itl_ms": 30.0, "errors": ["", "boom"],
}


def test_vllm_bench_level_is_normalized_to_seconds():
    lv = br.level_from_vllm_bench(VLLM_BENCH)
    assert lv["concurrency"] == 4
    assert lv["completed"] == 15 and lv["failed"] == 1 and lv["requests"] == 16
    assert lv["output_tok_s"] == 120.0 and lv["request_s"] == 7.5
    assert lv["ttft_s"] == {"mean": 0.05, "p50": 0.04, "p90": 0.08, "p99": 0.095}
    assert lv["tpot_s"]["p90"] is None  # not asked for: absent, not invented
    assert lv["latency_s"] == {"mean": None, "p50": None, "p90": None, "p99": None}


def test_vllm_bench_junk_is_reported_in_the_record():
    tc = [{"levels": [tc_level(4, 100.0)]}]
    rec = br.build_record("h", "m", "t", tc, vllm_bench_raw=[(None, VLLM_BENCH), (8, {"x": 1})])
    assert [lv["concurrency"] for lv in rec["vllm_bench"]["levels"]] == [4]
    assert "concurrency 8: not a vllm bench serve result" in rec["vllm_bench"]["error"]


# ----------------------------------------------------------------------------- comparison


def test_speedup_math():
    assert br.speedup(84.0, 61.0) == pytest.approx(1.377, abs=1e-3)
    assert br.speedup(None, 61.0) is None
    assert br.speedup(84.0, None) is None
    assert br.speedup(84.0, 0.0) is None


def test_comparison_rows_and_speedups():
    cmp = br.compare_records(record("minimax-m25", MINIMAX, ready=75), record("kimi-k25", KIMI, ready=780))
    assert [r["concurrency"] for r in cmp["rows"]] == [1, 8, 128]
    assert [round(r["speedup"], 3) for r in cmp["rows"]] == [round(84 / 61, 3), round(418 / 300, 3), round(2500 / 1239, 3)]
    assert cmp["speedup_min"] == pytest.approx(84 / 61)
    assert cmp["speedup_max"] == pytest.approx(2500 / 1239)
    assert cmp["current"]["peak_tok_s"] == 2500.0 and cmp["previous"]["peak_tok_s"] == 1239.0
    md = br.render_markdown(cmp, plot_name="x.png")
    assert ("| Concurrency | minimax-m25 tok/s | kimi-k25 tok/s | Speedup | Verdict | minimax-m25 TTFT p99 | kimi-k25 TTFT p99 "
            "| minimax-m25 errors | kimi-k25 errors |") in md
    assert "| 1 | 84.0 | 61.0 | 1.38× | — | 500 ms | 500 ms | 0/8 | 0/8 |" in md
    assert "| 128 | 2500.0 | 1239.0 | 2.02× | — |" in md
    assert "Verdict: not tested: a level measured in fewer than 3 rounds has no interval" in md
    assert "| Time to ready | 75 s | 780 s (13.0 min) |" in md
    assert "Speedup (minimax-m25 over kimi-k25, output tok/s): 1.38× to 2.02×." in md
    assert "![output tok/s vs concurrency](x.png)" in md
    assert "| GPU energy | n/a | n/a |" in md
    assert "GPU power of minimax-m25 not measured: not sampled." in md


def test_missing_levels_on_either_side():
    cur = record("new", {1: 100.0, 8: 500.0, 64: 900.0})
    prev = record("old", {1: 50.0, 32: 400.0, 64: 300.0})
    cmp = br.compare_records(cur, prev)
    rows = dict((r["concurrency"], r) for r in cmp["rows"])
    assert sorted(rows) == [1, 8, 32, 64]
    assert rows[8]["previous_tok_s"] is None and rows[8]["speedup"] is None
    assert rows[32]["current_tok_s"] is None and rows[32]["speedup"] is None
    assert rows[64]["speedup"] == pytest.approx(3.0)
    assert cmp["only_current"] == [8] and cmp["only_previous"] == [32]
    md = br.render_markdown(cmp)
    assert "| 8 | 500.0 | — | — |" in md
    assert "| 32 | — | 400.0 | — |" in md
    assert "Only measured for new: concurrency 8." in md
    assert "Only measured for old: concurrency 32." in md


def test_no_common_level_has_no_speedup():
    cmp = br.compare_records(record("a", {1: 10.0}), record("b", {2: 10.0}))
    assert cmp["speedup_min"] is None
    assert "No concurrency level was measured for both models" in br.render_markdown(cmp)


def test_one_sided_report():
    cmp = br.compare_records(record("only", {1: 10.0, 4: 30.0}, failed=2), None)
    assert cmp["previous"] is None and cmp["only_previous"] == [] and cmp["only_current"] == []
    md = br.render_markdown(cmp)
    assert md.startswith("# only on gpu1\n")
    assert "| 4 | 30.0 | 1.40 | 500 ms | 20.0 ms | 4.0 | 2/16 |" in md  # per user: 1 / TPOT p50 (0.25 s)
    assert "No previous result to compare with." in md


def test_errors_and_zero_throughput_level():
    cur = record("a", {1: 10.0, 8: 0.0})
    cur["levels"][1].update(failed=32, completed=0, error_rate=1.0)
    cmp = br.compare_records(cur, record("b", {1: 5.0, 8: 40.0}))
    row = [r for r in cmp["rows"] if r["concurrency"] == 8][0]
    assert row["speedup"] == 0.0
    assert row["current_failed"] == 32
    assert "| 8 | 0.0 | 40.0 | 0.00× |" in br.render_markdown(cmp)


def test_same_model_twice_is_told_apart_by_time():
    cmp = br.compare_records(record("m", {1: 11.0}, ts="T2"), record("m", {1: 10.0}, ts="T1"))
    md = br.render_markdown(cmp)
    assert "| Concurrency | m @T2 tok/s | m @T1 tok/s |" in md


def test_vllm_bench_source():
    a = record("a", {4: 1.0})
    a["vllm_bench"] = {"levels": [br.level_from_vllm_bench(VLLM_BENCH)], "error": None}
    b = record("b", {4: 1.0})
    b["vllm_bench"] = {"levels": [br.level_from_vllm_bench(dict(VLLM_BENCH, output_throughput=60.0))], "error": None}
    cmp = br.compare_records(a, b, source="vllm_bench")
    assert cmp["rows"][0]["speedup"] == 2.0
    assert "`vllm bench serve`" in br.render_markdown(cmp)


# ----------------------------------------------------------------------------- lookup


def test_find_previous_by_name_file_and_dir(tmp_path):
    root = tmp_path / "results"
    old = write(root / "gpu1" / "kimi-k25" / "20261201T100000Z.json", record("kimi-k25", KIMI))
    newer = write(root / "gpu1" / "kimi-k25" / "20261202T100000Z.json", record("kimi-k25", KIMI))
    write(root / "gpu2" / "kimi-k25" / "20261203T100000Z.json", record("kimi-k25", KIMI))
    assert br.find_previous("kimi-k25", str(root), "gpu1") == newer
    assert br.find_previous(old, str(root), "gpu1") == old
    assert br.find_previous(os.path.dirname(old), str(root), "gpu1") == newer
    assert br.find_previous("nope", str(root), "gpu1") is None
    assert br.find_previous("", str(root), "gpu1") is None
    # the current model's own name: the run before the current one
    assert br.find_previous("kimi-k25", str(root), "gpu1", exclude=newer) == old


def test_slug_and_org_names(tmp_path):
    assert br.slug("MiniMaxAI/MiniMax-M2.5") == "MiniMaxAI--MiniMax-M2.5"
    assert br.slug("a b:c") == "a-b-c"
    with pytest.raises(br.ReportError):
        br.slug("///")


def test_load_record_rejects_other_json(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"levels": []}')
    with pytest.raises(br.ReportError, match="not a benchmark record"):
        br.load_record(str(bad))
    bad.write_text("{")
    with pytest.raises(br.ReportError, match="cannot read"):
        br.load_record(str(bad))


# ----------------------------------------------------------------------------- plot


def test_plot_is_a_valid_png(tmp_path):
    cmp = br.compare_records(
        record("minimax-m25", {1: 84.0, 8: 418.0, 32: 1200.0, 128: 2500.0, 256: 3300.0, 512: 3900.0, 1024: 3950.0}),
        record("kimi-k25", {1: 61.0, 8: 300.0, 32: 800.0, 128: 1239.0, 256: 1400.0, 512: 1450.0}))
    path = br.plot_png(cmp, str(tmp_path / "plot.png"))
    width, height, size = png_size(path)
    assert (width, height) == (1500, 420)
    assert 15000 < size < 500000


def test_plot_one_sided(tmp_path):
    cmp = br.compare_records(record("solo", {1: 5.0, 2: 9.0}), None)
    width, height, size = png_size(br.plot_png(cmp, str(tmp_path / "solo.png")))
    assert width > 0 and height > 0 and size > 5000


def test_cli_writes_report_and_plot(tmp_path):
    import subprocess
    import sys
    root = tmp_path / "results"
    write(root / "gpu1" / "kimi-k25" / "20261201T100000Z.json", record("kimi-k25", KIMI))
    cur = write(root / "gpu1" / "minimax-m25" / "20261202T100000Z.json", record("minimax-m25", MINIMAX, ts="20261202T100000Z"))
    cli = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "tools", "bench_report.py")
    p = subprocess.run([sys.executable, cli, cur, "--compare-to", "kimi-k25", "--results-dir", str(root),
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    md = (tmp_path / "out" / "minimax-m25_vs_kimi-k25_20261202T100000Z.md").read_text()
    assert "| 128 | 2500.0 | 1239.0 | 2.02× |" in md
    png_size(str(tmp_path / "out" / "minimax-m25_vs_kimi-k25_20261202T100000Z.png"))
    p = subprocess.run([sys.executable, cli, str(tmp_path / "missing.json")], capture_output=True, text=True, check=False)
    assert p.returncode == 2 and "cannot read benchmark record" in p.stderr


def rounds_record(model, samples_by_level, ts="20261202T120000Z"):
    """A record whose levels ran in rounds: {concurrency: [tok/s of each round]}."""
    levels = []
    for conc, samples in sorted(samples_by_level.items()):
        lvl = tc_level(conc, sum(samples) / len(samples))
        lvl["samples"] = [{"round": i + 1, "output_tok_s": v} for i, v in enumerate(samples)]
        lvl["output_tok_s_ci"] = bench_stats.interval(samples, stop="converged")
        levels.append(lvl)
    return br.build_record("gpu1", model, ts, [{"levels": levels, "started_at": 1000.0}])


def test_a_a_comparison_says_no_significant_difference():
    first = rounds_record("m", {1: [100, 104, 98, 101, 99], 8: [400, 420, 410, 405, 415]}, ts="20261203T100000Z")
    second = rounds_record("m", {1: [103, 97, 102, 100, 105], 8: [412, 398, 421, 409, 404]}, ts="20261203T110000Z")
    cmp = br.compare_records(second, first)
    assert [r["verdict"] for r in cmp["rows"]] == ["no significant difference"] * 2
    assert cmp["verdict"] == "no significant difference"
    assert second["levels"][0]["samples"][4] == {"round": 5, "output_tok_s": 105}  # every sample kept
    md = br.render_markdown(cmp)
    assert "| 1 | 101.4 ± 3.8 (n=5) | 100.4 ± 2.9 (n=5) | 1.01× | no significant difference |" in md
    assert "Verdict: no significant difference (the 95 % intervals overlap at every level)." in md


def test_disjoint_intervals_say_faster_or_slower_per_level():
    old = rounds_record("old", {1: [100, 101, 99], 8: [400, 402, 398]})
    new = rounds_record("new", {1: [120, 121, 119], 8: [380, 381, 379]})
    cmp = br.compare_records(new, old)
    assert [r["verdict"] for r in cmp["rows"]] == ["faster", "slower"]
    assert cmp["verdict"] == "faster at concurrency 1; slower at concurrency 8"


def test_one_round_on_either_side_gives_no_verdict():
    cmp = br.compare_records(rounds_record("new", {1: [100, 101, 99]}), record("old", {1: 100.0}))
    assert cmp["rows"][0]["verdict"] is None and cmp["verdict"] is None


def test_interleaved_a_a_names_the_sides_a_and_b_and_says_one_run(tmp_path):
    main = rounds_record("m", {1: [100, 96, 90, 88]}, ts="20261203T100000Z")
    peer = rounds_record("m", {1: [99, 97, 89, 87]}, ts="20261203T100000Z")
    main["base_url"] = peer["base_url"] = "http://127.0.0.1:8002"
    main["settings"]["interleaved_with"] = {"model": "m", "base_url": "http://127.0.0.1:8002",
                                            "record": "20261203T100000Z-interleaved.json"}
    write(tmp_path / "m" / "20261203T100000Z.json", main)
    peer_path = write(tmp_path / "m" / "20261203T100000Z-interleaved.json", peer)
    cmp = br.compare_records(main, br.load_record(peer_path))
    assert br.interleaved(cmp) and br.side_labels(cmp) == ("m (A)", "m (B)")
    md = br.render_markdown(cmp)
    assert "| Concurrency | m (A) tok/s | m (B) tok/s |" in md, md
    assert "one run 20261203T100000Z, the rounds of m (A) (http://127.0.0.1:8002) and m (B) (http://127.0.0.1:8002) interleaved" in md
    assert "Verdict: no significant difference" in md
    # A record that is not the peer of the current one is another run, told apart by time.
    other = br.compare_records(main, rounds_record("m", {1: [99, 97, 89]}, ts="20261203T090000Z"))
    assert not br.interleaved(other) and br.side_labels(other) == ("m @20261203T100000Z", "m @20261203T090000Z")
    # The newest record of the model by name is the main one, not its interleaved peer.
    assert br.find_previous("m", str(tmp_path.parent), tmp_path.name).endswith("20261203T100000Z.json")
