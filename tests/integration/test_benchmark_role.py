# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""roles/benchmark through real ansible-playbook runs.

* Against tests/fixtures/token_stream_server.py (a TEST FIXTURE stand-in server, its own process,
  with a fixed per-token delay and fault injection), on localhost: fast, deterministic speed ratios.
* Against a real vLLM OpenAI server (CPU engine, tiny-llama-a) inside a systemd test host (the
  ``vllm_server`` fixture), over SSH: the record lands in the machine and on the controller, and a
  second run is compared with the first.
"""
from __future__ import annotations

import glob
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import urllib.request

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTBED = os.path.join(REPO, "tools", "testbed", "testbed.sh")
STATE = os.environ.get("TESTBED_STATE", "/var/lib/llmfleet-testbed")
PLAYBOOK_BIN = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
TARGET_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
RECORD_KEYS = {"schema", "host", "model", "timestamp", "base_url", "time_to_ready_s", "settings", "tool", "levels",
               "vllm_bench", "gpu_power", "summary"}
LEVEL_KEYS = {"concurrency", "requests", "completed", "failed", "error_rate", "errors", "output_tok_s", "request_s",
              "ttft_s", "tpot_s", "itl_s", "latency_s", "duration_s", "output_tokens", "power"}


# `stream_server` (tests/integration/conftest.py) starts the token-stream fixture endpoint.


def _play(role_vars, out, host_vars):
    facts = ("{{ {'ok': true, 'result': benchmark_result | default(none), "
             "'path': benchmark_result_path | default(none), "
             "'controller_path': benchmark_result_controller_path | default(none), "
             "'report': benchmark_report_path | default(none), 'plot': benchmark_report_plot_path | default(none), "
             "'markdown': benchmark_report_markdown | default(none), "
             "'previous': benchmark_report_previous_path | default(none)} | to_json }}")
    local = {"ansible_python_interpreter": sys.executable}
    return {
        "name": "benchmark role",
        "hosts": "all",
        "gather_facts": False,
        "vars": dict({"ansible_python_interpreter": TARGET_PYTHON}, **(host_vars or {})),
        "tasks": [{
            "block": [
                {"name": "Benchmark", "ansible.builtin.include_role": {"name": "llmfleet.vllm.benchmark"},
                 "vars": role_vars},
                {"name": "Save facts", "ansible.builtin.copy": {"content": facts, "dest": str(out), "mode": "0644"},
                 "delegate_to": "localhost", "check_mode": False, "vars": local},
            ],
            "rescue": [
                {"name": "Save failure", "ansible.builtin.copy": {
                    "content": "{{ {'ok': false, 'msg': ansible_failed_result.msg | default(''), "
                               "'task': ansible_failed_task.name | default('')} | to_json }}",
                    "dest": str(out), "mode": "0644"},
                 "delegate_to": "localhost", "check_mode": False, "vars": local},
            ],
        }],
    }


class CmdlineWatch:
    """Reads every /proc/*/cmdline (the test hosts' processes are visible from here too) until stopped and keeps
    the pids whose command line holds ``needle``."""

    def __init__(self, needle, environ=None):
        self.needle, self.hits, self.scans = needle.encode(), set(), 0
        # and the commands whose environment holds ``environ`` (e.g. OPENAI_API_KEY=<key>: the key did reach them)
        self.environ, self.environ_hits = (environ.encode() if environ else None), set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for path in glob.glob("/proc/[0-9]*/cmdline"):
                try:
                    with open(path, "rb") as handle:
                        if self.needle in handle.read():
                            self.hits.add(path.split("/")[2])
                    if self.environ:
                        with open(path[:-len("cmdline")] + "environ", "rb") as handle:
                            if self.environ in handle.read().split(b"\0"):
                                with open(path, "rb") as cmdline:
                                    self.environ_hits.add(cmdline.read().replace(b"\0", b" ")[:200].decode(errors="replace"))
                except OSError:
                    pass
            self.scans += 1
            self._stop.wait(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def run_plays(tmp_path, cases, inventory="localhost,", host_vars=None, check=False, timeout=600, cli=(), options=()):
    """One playbook, one play per role_vars in cases; returns (rc, [outcome dict], output).

    outcome: ok (bool) and msg on failure, else the role's published facts.
    """
    n = len(list(tmp_path.glob("outcome-*.json")))
    outs = [tmp_path / ("outcome-%d.json" % (n + i)) for i in range(len(cases))]
    pb = tmp_path / ("play-%d.json" % n)
    pb.write_text(json.dumps([_play(v, o, host_vars) for v, o in zip(cases, outs)]))
    cmd = [PLAYBOOK_BIN, "-i", inventory, str(pb)]
    if inventory == "localhost,":
        cmd += ["-c", "local"]
    if check:
        cmd.append("--check")
    for key_value in cli:  # -e key=value: every such value reaches the role as a string
        cmd += ["-e", key_value]
    cmd += list(options)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_HOST_KEY_CHECKING="false")
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    return p.returncode, [json.loads(o.read_text()) if o.exists() else None for o in outs], p.stdout + p.stderr


def run_role(tmp_path, role_vars, **kw):
    rc, outcomes, out = run_plays(tmp_path, [role_vars], **kw)
    return rc, outcomes[0], out


def base_vars(tmp_path, url, **kw):
    v = {"benchmark_base_url": url, "benchmark_concurrency": [1, 4], "benchmark_requests_per_level": 8,
         "benchmark_max_tokens": 16, "benchmark_prompt_tokens": 16, "benchmark_warmup_requests": 1,
         "benchmark_results_dir": str(tmp_path / "host-results"),
         "benchmark_controller_results_dir": str(tmp_path / "results"),
         "benchmark_request_timeout_s": 60}
    v.update(kw)
    return v


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


def check_record(rec, model, concurrency):
    assert RECORD_KEYS <= set(rec)
    assert rec["model"] == model
    assert [lv["concurrency"] for lv in rec["levels"]] == concurrency
    for lv in rec["levels"]:
        assert LEVEL_KEYS <= set(lv)
        assert lv["output_tok_s"] > 0 and lv["request_s"] > 0
        assert lv["completed"] == lv["requests"] and lv["failed"] == 0
        for key in ("ttft_s", "tpot_s", "itl_s"):
            assert set(lv[key]) == {"mean", "p50", "p90", "p99"}
            assert 0 <= lv[key]["p50"] <= lv[key]["p99"]     # ITL: chunks read together are 0 s apart
        assert lv["ttft_s"]["p50"] > 0
    # no GPU on the test hosts: said so by the sampler (it ran), not invented
    assert rec["gpu_power"]["available"] is False and rec["gpu_power"]["reason"]
    if not rec["settings"].get("interleaved_with"):
        assert rec["gpu_power"]["reason"] != "benchmark_gpu_power is false", rec["gpu_power"]
    assert all(lv["power"] is None for lv in rec["levels"])


# ----------------------------------------------------------------------------- fixture server (fast)


def test_two_models_compared(stream_server, tmp_path):
    # 8 ms against 1 ms a token: under make test's load the 1 ms sleeps stretch, and with 4 ms against 1 ms an
    # interleaved run of 4 rounds once read 2,311 ± 1,529 against 662 ± 124 tok/s at concurrency 4 ("no significant
    # difference", 2026-12-07); the verdict is what is asserted, not the size of the speedup.
    slow = stream_server("--model-name", "model-old", "--token-delay", "0.008")
    fast = stream_server("--model-name", "model-new", "--token-delay", "0.001")
    rc, old, out = run_role(tmp_path, base_vars(tmp_path, slow.base_url, benchmark_time_to_ready_s=780.0))
    assert rc == 0 and old["ok"], out
    check_record(old["result"], "model-old", [1, 4])
    assert old["result"]["time_to_ready_s"] == 780.0
    assert "No previous result to compare with." in old["markdown"]
    host_file = tmp_path / "host-results" / "model-old" / (old["result"]["timestamp"] + ".json")
    assert old["path"] == str(host_file) and host_file.is_file()
    assert old["controller_path"] == str(tmp_path / "results" / "localhost" / "model-old" / host_file.name)
    assert json.loads(open(old["controller_path"]).read()) == json.loads(host_file.read_text())
    assert not list((tmp_path / "host-results").glob(".run-*")), "run directory left behind"

    rc, new, out = run_role(tmp_path, base_vars(tmp_path, fast.base_url + "/v1/", benchmark_compare_to="model-old",
                                                benchmark_time_to_ready_s=75.0))
    assert rc == 0 and new["ok"], out
    assert new["previous"] == old["controller_path"]
    md = new["markdown"]
    assert "# model-new vs model-old on localhost" in md
    assert "| Concurrency | model-new tok/s | model-old tok/s | Speedup |" in md
    assert "| Time to ready | 75 s | 780 s (13.0 min) |" in md
    rows = [line for line in md.splitlines() if line.startswith("| 1 |") or line.startswith("| 4 |")]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.split("|")]
        # tok/s cells are "mean ± half-width (n=rounds)"
        new_tok_s, old_tok_s, ratio = float(cells[2].split()[0]), float(cells[3].split()[0]), float(cells[4].rstrip("×"))
        # the speedup column is new/old of the two tok/s columns; its size depends on how this machine
        # honours 1 ms vs 4 ms sleeps (CI has seen 6.3×), so only "clearly faster" is asserted
        assert ratio == pytest.approx(new_tok_s / old_tok_s, abs=0.02), row
        assert ratio > 1.5 and cells[5] == "faster", row
    assert "Verdict: faster at concurrency 1; faster at concurrency 4." in md
    for lv in new["result"]["levels"]:
        assert lv["requests"] == 8 * len(lv["samples"]) == 8 * lv["output_tok_s_ci"]["n"]
        assert 3 <= lv["output_tok_s_ci"]["n"] <= 10 and lv["output_tok_s_ci"]["stop"] in ("converged", "max_repeats")
    assert open(new["report"]).read() == md
    assert os.path.basename(new["plot"]) in md
    assert png_size(new["plot"]) == (1500, 420)
    assert os.path.dirname(new["report"]) == str(tmp_path / "results" / "reports" / "localhost")

    # Both endpoints in one run, rounds alternating: a record each, compared with each other.
    rc, both, out = run_role(tmp_path, base_vars(tmp_path, fast.base_url, benchmark_interleave_base_url=slow.base_url + "/v1",
                                                 benchmark_min_repeats=4, benchmark_max_repeats=4))
    assert rc == 0 and both["ok"], out
    main, ts = both["result"], both["result"]["timestamp"]
    peer_file = tmp_path / "host-results" / "model-old" / (ts + "-interleaved.json")
    peer = json.loads(peer_file.read_text())
    check_record(main, "model-new", [1, 4])
    check_record(peer, "model-old", [1, 4])
    assert main["settings"]["interleaved_with"] == {"model": "model-old", "base_url": slow.base_url,
                                                    "record": peer_file.name}
    assert peer["settings"]["interleaved_with"]["record"] == ts + ".json" and peer["timestamp"] == ts
    assert peer["vllm_bench"] is None and peer["time_to_ready_s"] is None
    assert "interleaved" in main["gpu_power"]["reason"], main["gpu_power"]
    for side in (main, peer):
        assert [len(lv["samples"]) for lv in side["levels"]] == [4, 4] and [lv["requests"] for lv in side["levels"]] == [32, 32]
    assert both["previous"] == str(tmp_path / "results" / "localhost" / "model-old" / peer_file.name)
    assert "the rounds of model-new (%s) and model-old (%s) interleaved" % (fast.base_url, slow.base_url) in both["markdown"]
    assert "Verdict: faster at concurrency 1; faster at concurrency 4." in both["markdown"], both["markdown"]


def test_cli_strings_and_report_without_matplotlib(stream_server, tmp_path):
    """-e strings behave as typed, and a controller python without matplotlib still gets the Markdown report."""
    old = stream_server("--model-name", "model-old", "--token-delay", "0.002")
    new = stream_server("--model-name", "model-new", "--token-delay", "0.002")
    rc, _first, out = run_role(tmp_path, base_vars(tmp_path, old.base_url))
    assert rc == 0, out
    bare = tmp_path / "no-matplotlib"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    cli = ["benchmark_gpu_power=false", "benchmark_use_vllm_bench=false", "benchmark_report_plot=true",
           "benchmark_fetch=true", "benchmark_report=true", "benchmark_requests_per_level=3",
           "benchmark_min_repeats=2", "benchmark_max_repeats=2", "benchmark_target_ci_rel=0.5", "benchmark_repeat_budget_s=30",
           "benchmark_controller_python=%s" % (bare / "bin" / "python")]
    rc, res, out = run_role(tmp_path, base_vars(tmp_path, new.base_url, benchmark_compare_to="model-old"), cli=cli)
    assert rc == 0 and res["ok"], out
    assert res["result"]["gpu_power"]["reason"] == "benchmark_gpu_power is false", res["result"]["gpu_power"]
    assert [lv["requests"] for lv in res["result"]["levels"]] == [6, 6]  # 2 rounds of 3
    assert res["result"]["settings"]["min_repeats"] == 2 and res["result"]["settings"]["target_ci_rel"] == 0.5
    assert res["result"]["vllm_bench"] in (None, {}) or not res["result"]["vllm_bench"].get("levels")
    assert res["plot"] is None and "| Concurrency | model-new tok/s | model-old tok/s |" in res["markdown"]
    assert open(res["report"]).read() == res["markdown"]
    assert "without the PNG plot" in out and "matplotlib" in out, out[-3000:]


def test_error_rate_over_limit_fails_after_storing(stream_server, tmp_path):
    srv = stream_server("--fail-every", "3")
    rc, res, out = run_role(tmp_path, base_vars(tmp_path, srv.base_url, benchmark_max_error_rate=0.1,
                                                benchmark_report=False))
    assert res and res["ok"] is False, out
    assert "error rate above benchmark_max_error_rate 0.1" in res["msg"]
    assert "http_500" in res["msg"]
    stored = list((tmp_path / "results" / "localhost" / "fixture-model").glob("*.json"))
    assert len(stored) == 1
    rec = json.loads(stored[0].read_text())
    assert sum(lv["failed"] for lv in rec["levels"]) > 0
    # A healthy endpoint interleaved with the failing one: the peer's errors fail the run too, after both are stored.
    healthy = stream_server("--model-name", "healthy")
    rc, res, out = run_role(tmp_path, base_vars(tmp_path, healthy.base_url, benchmark_max_error_rate=0.1, benchmark_report=False,
                                                benchmark_interleave_base_url=srv.base_url))
    assert res and res["ok"] is False, out
    assert "benchmark of fixture-model at %s" % srv.base_url in res["msg"] and "http_500" in res["msg"], res["msg"]
    assert len(list((tmp_path / "results" / "localhost" / "fixture-model").glob("*-interleaved.json"))) == 1
    assert len(list((tmp_path / "results" / "localhost" / "healthy").glob("*.json"))) == 1


def test_api_key_reaches_the_server_but_no_command_line_or_log(stream_server, tmp_path):
    """benchmark_api_key (from the play's vars, as a vault would give it) reaches a server that refuses requests
    without it, and is on no command line (a watcher reads every /proc/*/cmdline during the run) nor in -vvv output."""
    key = "sk-itest-bench-%s" % os.urandom(8).hex()
    key_file = tmp_path / "server.key"
    key_file.touch(mode=0o600)
    key_file.write_text(key)
    srv = stream_server("--api-key-file", str(key_file))
    with CmdlineWatch(key) as watch:
        rc, res, out = run_role(tmp_path, base_vars(tmp_path, srv.base_url, benchmark_api_key=key,
                                                    benchmark_use_vllm_bench=False), options=["-vvv"])
    assert rc == 0 and res["ok"], out[-4000:]
    check_record(res["result"], "fixture-model", [1, 4])  # every request passed the server's key check
    assert watch.scans > 10 and not watch.hits, "the key was on the command line of pids %s" % sorted(watch.hits)
    assert key not in out, [line for line in out.splitlines() if key in line][:3]


def test_endpoint_down_is_a_clear_failure(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    rc, res, out = run_role(tmp_path, base_vars(tmp_path, "http://127.0.0.1:%d" % port))
    assert res and res["ok"] is False, out
    assert "the endpoint http://127.0.0.1:%d/v1/models is not serving" % port in res["msg"]
    assert not (tmp_path / "results").exists()


def test_interleaved_peer_that_does_not_serve_is_named_before_any_load(stream_server, tmp_path):
    srv = stream_server()
    rc, res, out = run_role(tmp_path, base_vars(tmp_path, srv.base_url, benchmark_interleave_base_url="http://127.0.0.1:9"))
    assert res and res["ok"] is False, out
    assert "benchmark_interleave_base_url http://127.0.0.1:9/v1/models is not serving" in res["msg"], res["msg"]
    rc, res, out = run_role(tmp_path, base_vars(tmp_path, srv.base_url, benchmark_interleave_base_url=srv.base_url,
                                                benchmark_interleave_model="other"))
    assert res and res["ok"] is False, out
    assert "serves fixture-model, not benchmark_interleave_model other" in res["msg"], res["msg"]
    assert srv.metric("fixture_posts_total") == 0 and not (tmp_path / "results").exists()


def test_unknown_model_named(stream_server, tmp_path):
    srv = stream_server()
    rc, res, out = run_role(tmp_path, base_vars(tmp_path, srv.base_url, benchmark_model="nope"))
    assert res and res["ok"] is False, out
    assert "benchmark_model nope is not served" in res["msg"] and "fixture-model" in res["msg"]


BAD_VARIABLES = [
    ({"benchmark_concurrency": []}, "benchmark_concurrency must be a non-empty list"),
    ({"benchmark_concurrency": [1, -4]}, "benchmark_concurrency must hold distinct positive integers"),
    ({"benchmark_concurrency": [0]}, "benchmark_concurrency must hold distinct positive integers"),
    ({"benchmark_concurrency": [2, 2]}, "benchmark_concurrency must hold distinct positive integers"),
    ({"benchmark_concurrency": ["x"]}, "benchmark_concurrency"),
    ({"benchmark_max_tokens": 0}, "benchmark_max_tokens must be >= 1, got 0"),
    ({"benchmark_max_error_rate": 2}, "benchmark_max_error_rate must be between 0 and 1, got 2"),
    ({"benchmark_requests_per_level": -1}, "benchmark_requests_per_level must be >= 0, got -1"),
    ({"benchmark_base_url": "127.0.0.1:8000"}, "benchmark_base_url must be an http(s) URL"),
    ({"benchmark_interleave_base_url": "slot-a"}, "benchmark_interleave_base_url must be an http(s) URL or empty, got slot-a"),
    ({"benchmark_interleave_base_url": "http://127.0.0.1:9", "benchmark_compare_to": "m"},
     "benchmark_interleave_base_url and benchmark_compare_to exclude each other"),
]


def test_bad_variables_are_named(tmp_path):
    # all cases in one playbook (one play each): a failing case must not hide the next one
    rc, outcomes, out = run_plays(tmp_path, [base_vars(tmp_path, "http://127.0.0.1:9", **case[0]) for case in BAD_VARIABLES])
    for case, res in zip(BAD_VARIABLES, outcomes):
        overrides, needle = case
        assert res and res["ok"] is False, (overrides, out)
        assert needle in res["msg"], (overrides, res["msg"])
    assert not (tmp_path / "results").exists()


def test_check_mode_sends_nothing_writes_nothing(stream_server, tmp_path):
    srv = stream_server()
    rc, res, out = run_role(tmp_path, base_vars(tmp_path, srv.base_url), check=True)
    assert rc == 0 and res["ok"], out
    assert "would send 2 levels of load (1, 4) to fixture-model" in out
    assert not (tmp_path / "results").exists() and not (tmp_path / "host-results").exists()
    metrics = urllib.request.urlopen(srv.base_url + "/metrics", timeout=10).read().decode()
    assert "fixture_posts_total 0" in metrics


# ----------------------------------------------------------------------------- real vLLM (CPU) in a test host
# `machine_inventory` (conftest.py): an inventory file for the vllm_server machine.


def test_real_vllm_sweep_store_fetch_and_vllm_bench(vllm_server, machine_inventory, tmp_path):
    """One run on the real server: the record on the machine and the controller, vLLM's own token counter agreeing,
    and `vllm bench serve` beside it on as many requests (comparisons of real runs: test_pivot_faults)."""
    host = vllm_server.machine
    rootfs = os.path.join(STATE, host, "rootfs")
    key = "sk-itest-vllm-bench-%s" % os.urandom(8).hex()
    common = dict(base_vars(tmp_path, vllm_server.base_url), benchmark_concurrency=[1, 4, 16],
                  benchmark_results_dir="/var/lib/llmfleet/results", benchmark_time_to_ready_s=93.5,
                  benchmark_min_repeats=3, benchmark_max_repeats=3,  # CI time: the rounds are tested elsewhere
                  benchmark_use_vllm_bench=True, benchmark_api_key=key)
    # vLLM here takes any key; what counts is that the key is on no command line (sudo, sh, ssh, vllm bench) and not
    # in -vvv output (test_api_key_reaches_the_server_but_no_command_line_or_log: it reaches a server that checks it).
    with CmdlineWatch(key, environ="OPENAI_API_KEY=" + key) as watch:
        rc, first, out = run_role(tmp_path, common, inventory=machine_inventory, options=["-vvv"])
    assert rc == 0 and first["ok"], out[-6000:]
    assert watch.scans > 10 and not watch.hits, "the key was on the command line of pids %s" % sorted(watch.hits)
    assert key not in out, [line for line in out.splitlines() if key in line][:3]
    assert vllm_server.machine_exec("sh", "-c", "ls /tmp/llmfleet-bench-key.* 2>/dev/null", check=False).stdout == ""
    rec = first["result"]
    check_record(rec, vllm_server.model, [1, 4, 16])
    for lv in rec["levels"]:
        assert lv["output_tokens"] == lv["completed"] * 16       # ignore_eos: every request gives max_tokens
        assert lv["metrics_ratio"] == pytest.approx(1.0, abs=0.02)  # vLLM's own counter agrees
        # Prompts of 16 tokens as vLLM's tokenizer counts them (issue 46): 16 random words were about 32 on the test
        # models' tokenizer, as the H100 run found 242 for 128 where vllm bench serve sent 128.
        assert 11 <= lv["prompt_tokens"] / lv["completed"] <= 21, (lv["prompt_tokens"], lv["completed"])
    on_host = rootfs + first["path"]
    assert first["path"] == "/var/lib/llmfleet/results/tiny-llama-a/%s.json" % rec["timestamp"]
    assert json.loads(open(on_host).read()) == json.loads(open(first["controller_path"]).read())
    assert first["controller_path"].startswith(str(tmp_path / "results" / host / "tiny-llama-a"))
    md = first["markdown"]
    for conc in (1, 4, 16):
        assert any(line.startswith("| %d | " % conc) and " ± " in line for line in md.splitlines()), md
    assert "| Time to ready | 94 s | — |" in md or "| Time to ready | 93 s | — |" in md
    png_size(first["plot"])
    assert os.path.getsize(first["plot"]) > 10000
    bench = rec["vllm_bench"]
    assert bench is not None
    if bench["levels"]:
        assert [lv["concurrency"] for lv in bench["levels"]] == [1, 4, 16], bench
        # as many requests as throughput_check sent at the level, all its rounds together
        sent = {lv["concurrency"]: lv["requests"] for lv in rec["levels"]}
        assert all(lv["output_tok_s"] > 0 and lv["completed"] == sent[lv["concurrency"]] >= 8 for lv in bench["levels"]), (
            bench["levels"], sent)
        # The same request shape on both sides: vllm bench serve's random prompts are 16 tokens (one more or less when
        # its token ids decode and encode again otherwise).
        assert all(abs(lv["prompt_tokens"] - 16 * lv["completed"]) <= lv["completed"] for lv in bench["levels"]), \
            [(lv["prompt_tokens"], lv["completed"]) for lv in bench["levels"]]
        # vllm bench serve got the key in its environment (from the 0600 file), not on its command line
        assert any("bench serve" in command for command in watch.environ_hits), watch.environ_hits
    else:
        assert "vllm bench" in (bench["error"] or ""), bench
    assert not [d for d in os.listdir(rootfs + "/var/lib/llmfleet/results") if d.startswith(".run-")]
