# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which output tok/s is right: throughput_check and `vllm bench serve` against the server's own counters (issue 46).

    python bench/agreement.py --base-url http://127.0.0.1:8000 --model NAME --tokenizer DIR \
        --vllm-bench "/opt/vllm/bin/vllm bench serve" [--concurrency 8 32] [--rounds 3] \
        [--input-len 64] [--output-len 64] [--prompts-per-concurrency 4] [--out results/bench-agreement.json]

Both clients run against the same server, interleaved round by round in ABBA order (ours, vLLM's; vLLM's, ours;
...), with the same request shape: random prompts of about --input-len tokens, --output-len tokens generated each
(ignore_eos), prompts-per-concurrency x C requests at C in flight. `throughput_check` runs as users run it: the module
in a one-task playbook (`ansible-playbook`, connection local). `vllm bench serve` runs as vLLM documents it.

While each client runs, a poller reads the server's /metrics every --poll-s seconds. Per run it records:
- the client's own figure (output tok/s, its output tokens, its timed interval);
- the server's: `vllm:generation_tokens_total` over the run, and its busy interval (first poll that saw the counter
  move to the first that saw it at its final value), whose rate needs no client clock; vLLM bench's one test
  request before its timer starts is left out of that interval;
- the mean end-to-end latency the server measured (`vllm:e2e_request_latency_seconds` sum / count) beside the
  client's mean latency: a client that reads its streams late sees longer requests than the server served.
Prints a Markdown table (mean and 95 % interval over the rounds) and writes every run to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, ".ansible", "collections"))  # `make venv` links the collection in there
# pylint: disable=wrong-import-position
from ansible_collections.llmfleet.vllm.plugins.module_utils.bench_stats import interval  # noqa: E402
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_gate import parse_prometheus_counter  # noqa: E402

COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:e2e_request_latency_seconds_sum",
            "vllm:e2e_request_latency_seconds_count", "vllm:request_success_total")


def read_counters(metrics_url: str) -> dict:
    """Each counter of COUNTERS summed over its label sets (one model served), 0 when the server has none."""
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    return {name: parse_prometheus_counter(text, name) or 0.0 for name in COUNTERS}


class Poller(threading.Thread):
    """(time, generation tokens) every interval until stopped."""

    def __init__(self, metrics_url: str, interval: float):
        super().__init__(daemon=True)
        self.metrics_url, self.interval, self.samples = metrics_url, interval, []
        self._halt = threading.Event()

    def run(self):
        while not self._halt.is_set():
            t = time.time()
            try:
                self.samples.append((t, read_counters(self.metrics_url)["vllm:generation_tokens_total"]))
            except OSError:
                pass
            self._halt.wait(max(0.0, self.interval - (time.time() - t)))

    def stop(self):
        self._halt.set()
        self.join()


def busy_interval(samples: list, skip_tokens: float) -> tuple:
    """(tokens, seconds) from the last sample before the counter passed start + skip_tokens to the first at its final
    value: each bound is within one poll of when generation began or ended."""
    if len(samples) < 2:
        return 0.0, 0.0
    start_value, final = samples[0][1] + skip_tokens, samples[-1][1]
    moved = next((i for i, (_t, v) in enumerate(samples) if v > start_value), None)
    if moved is None:
        return 0.0, 0.0
    begin = max(moved - 1, 0)
    end = next(i for i, (_t, v) in enumerate(samples) if v >= final)
    return final - samples[begin][1], samples[end][0] - samples[begin][0]


def run_ours(args, c: int, seed: int, workdir: str) -> dict:
    out = os.path.join(workdir, "ours.json")
    task = {"base_url": args.base_url, "model": args.model, "concurrency": [c],
            "requests_per_level": args.prompts_per_concurrency * c, "prompt_tokens": args.input_len,
            "max_tokens": args.output_len, "ignore_eos": True, "warmup_requests": 0, "seed": seed,
            "timeout_s": 1800}
    play = [{"name": "agreement", "hosts": "localhost", "connection": "local", "gather_facts": False,
             "vars": {"ansible_python_interpreter": sys.executable},
             "tasks": [{"name": "Measure", "llmfleet.vllm.throughput_check": task, "register": "tc"},
                       {"name": "Save", "ansible.builtin.copy": {"content": "{{ tc | to_json }}", "dest": out}}]}]
    playbook = os.path.join(workdir, "play.json")
    with open(playbook, "w", encoding="utf-8") as handle:
        json.dump(play, handle)
    cmd = shlex.split(args.ansible_playbook) + ["-i", "localhost,", playbook]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
    if proc.returncode != 0:
        raise RuntimeError("throughput_check failed:\n" + proc.stdout[-3000:] + proc.stderr[-2000:])
    with open(out, encoding="utf-8") as handle:
        level = json.load(handle)["levels"][0]
    with open(out, encoding="utf-8") as handle:
        sizing = json.load(handle).get("prompt") or {}
    # The requests that sized the prompts ran first, one output token each: the server counted them too.
    return {"output_tok_s": level["output_tok_s"], "output_tokens": level["output_tokens"],
            "duration_s": level["duration_s"], "completed": level["completed"], "failed": level["failed"],
            "mean_latency_s": level["latency_s"]["mean"], "skip_tokens": sizing.get("sizing_requests", 0),
            "skip_requests": sizing.get("sizing_requests", 0), "skip_prompt_tokens": sizing.get("sizing_prompt_tokens", 0),
            "skip_latency_s": sizing.get("sizing_seconds", 0.0)}


def run_vllm(args, c: int, seed: int, workdir: str) -> dict:
    cmd = shlex.split(args.vllm_bench) + [
        "--backend", "vllm", "--base-url", args.base_url, "--endpoint", "/v1/completions", "--model", args.tokenizer,
        "--served-model-name", args.model, "--dataset-name", "random", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--random-range-ratio", "0", "--ignore-eos",
        "--max-concurrency", str(c), "--num-prompts", str(args.prompts_per_concurrency * c), "--request-rate", "inf",
        "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl,e2el", "--disable-tqdm", "--save-result",
        "--result-dir", workdir, "--result-filename", "vllm.json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False, cwd=workdir)
    if proc.returncode != 0:
        raise RuntimeError("vllm bench serve failed:\n" + proc.stdout[-3000:] + proc.stderr[-3000:])
    with open(os.path.join(workdir, "vllm.json"), encoding="utf-8") as handle:
        result = json.load(handle)
    return {"output_tok_s": result["output_throughput"], "output_tokens": result["total_output_tokens"],
            "duration_s": result["duration"], "completed": result["completed"],
            "failed": result.get("failed", args.prompts_per_concurrency * c - result["completed"]),
            "mean_latency_s": result["mean_e2el_ms"] / 1000.0 if "mean_e2el_ms" in result else None,
            # its test request (one prompt, output-len tokens) runs before its timer starts
            "skip_tokens": args.output_len, "skip_requests": 0, "skip_prompt_tokens": 0, "skip_latency_s": 0.0}


CLIENTS = {"throughput_check": run_ours, "vllm bench serve": run_vllm}


def measure(args, name: str, c: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="agreement-") as workdir:
        before = read_counters(args.metrics_url)
        poller = Poller(args.metrics_url, args.poll_s)
        poller.start()
        try:
            run = CLIENTS[name](args, c, seed, workdir)
        finally:
            time.sleep(2 * args.poll_s)
            poller.stop()
        after = read_counters(args.metrics_url)
    skip = run.pop("skip_tokens")
    skip_requests, skip_prompt, skip_latency = run.pop("skip_requests"), run.pop("skip_prompt_tokens"), run.pop("skip_latency_s")
    tokens, seconds = busy_interval(poller.samples, skip)
    delta = {k: after[k] - before[k] for k in COUNTERS}
    # The server's figures leave out vLLM bench's test request (its tokens; its latency is in the mean as one request)
    # and throughput_check's sizing requests (their tokens, prompts and, as the client timed them, latency).
    delta["vllm:e2e_request_latency_seconds_sum"] -= skip_latency
    delta["vllm:prompt_tokens_total"] -= skip_prompt
    requests = delta["vllm:e2e_request_latency_seconds_count"] - skip_requests
    server_tokens = delta["vllm:generation_tokens_total"] - skip
    run.update({"client": name, "concurrency": c, "seed": seed, "server_tokens": server_tokens,
                "server_busy_s": seconds, "server_busy_tok_s": tokens / seconds if seconds else None,
                "server_rate_over_client_interval": server_tokens / run["duration_s"],
                "server_mean_latency_s": delta["vllm:e2e_request_latency_seconds_sum"] / requests if requests else None,
                # The prompts as the server's tokenizer counted them (vLLM bench's test request included).
                "server_prompt_tokens_per_request": delta["vllm:prompt_tokens_total"] / requests if requests else None,
                "polls": len(poller.samples)})
    return run


def table(runs: list) -> str:
    def fmt(values, digits=0):
        ci = interval(values)  # the 95 % interval the benchmark role and throughput_check give (from 3 rounds)
        return f"{ci['mean']:,.{digits}f}" + (f" ± {ci['half_width']:,.{digits}f}" if ci["half_width"] is not None else "")
    lines = ["| C | client | its output tok/s | server busy tok/s | tokens (client / server) | mean latency s (client / server) "
             "| prompt tokens per request (server) |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for c in sorted({r["concurrency"] for r in runs}):
        for name in CLIENTS:
            mine = [r for r in runs if r["concurrency"] == c and r["client"] == name]
            if not mine:
                continue
            busy = [r["server_busy_tok_s"] for r in mine if r["server_busy_tok_s"]]
            client_lat = [r["mean_latency_s"] for r in mine if r["mean_latency_s"] is not None]
            server_lat = [r["server_mean_latency_s"] for r in mine if r["server_mean_latency_s"] is not None]
            prompts = [r["server_prompt_tokens_per_request"] for r in mine if r.get("server_prompt_tokens_per_request")]
            lines.append(f"| {c} | {name} | {fmt([r['output_tok_s'] for r in mine])} | {fmt(busy) if busy else '-'} | "
                         f"{sum(r['output_tokens'] for r in mine):,.0f} / {sum(r['server_tokens'] for r in mine):,.0f} | "
                         f"{fmt(client_lat, 3) if client_lat else '-'} / {fmt(server_lat, 3) if server_lat else '-'} | "
                         f"{fmt(prompts, 1) if prompts else '-'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--metrics-url", help="default: BASE_URL/metrics")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--tokenizer", required=True, help="vllm bench serve's --model: the model directory")
    parser.add_argument("--vllm-bench", default="vllm bench serve", help="the command that runs vllm bench serve")
    parser.add_argument("--ansible-playbook", default="ansible-playbook")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--prompts-per-concurrency", type=int, default=4)
    parser.add_argument("--clients", nargs="+", choices=list(CLIENTS), default=list(CLIENTS))
    parser.add_argument("--poll-s", type=float, default=0.1)
    parser.add_argument("--out", default=os.path.join(REPO, "results", "bench-agreement.json"))
    args = parser.parse_args(argv)
    args.base_url = args.base_url.rstrip("/")
    args.metrics_url = args.metrics_url or args.base_url + "/metrics"
    runs = []
    for rnd in range(args.rounds):
        order = args.clients if rnd % 2 == 0 else list(reversed(args.clients))
        for c in args.concurrency:
            for name in order:
                run = measure(args, name, c, seed=1000 * rnd + c)
                runs.append(run)
                print(json.dumps(run), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump({"args": vars(args), "runs": runs}, handle, indent=1)
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
