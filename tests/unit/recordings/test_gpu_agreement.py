# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which output tok/s is right (issue 46), read back from the H100 run of 2026-12-07 (docs/benchmarks.md, section 12).

bench/agreement.py ran throughput_check and `vllm bench serve` interleaved against one vLLM CUDA server (Llama-3-8B
shape, random weights, the 1,024-token test tokenizer) at C = 8, 32, 128, three rounds
(tests/fixtures/nvidia/h100-agreement-words.json), then each client once more at C = 128 with the server's counters
read around it (h100-agreement-prompts.json). At that time throughput_check's prompt_tokens was a number of words."""
from __future__ import annotations

import json
import pathlib

FIX = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "nvidia"
WORDS = json.loads((FIX / "h100-agreement-words.json").read_text())
PROMPTS = json.loads((FIX / "h100-agreement-prompts.json").read_text())


def test_each_client_reads_what_the_server_did_while_it_ran():
    runs = WORDS["runs"]
    assert len(runs) == 18 and {r["concurrency"] for r in runs} == {8, 32, 128}
    for run in runs:
        assert run["failed"] == 0 and run["output_tokens"] == 128 * 8 * run["concurrency"], run
        # Its own figure is what the server did while it ran: throughput_check's within 1.5 % of the server's busy rate,
        # vllm bench serve's up to 4 % below it (its interval takes in the ramp and the tail the busy interval leaves out).
        deviation = run["output_tok_s"] / run["server_busy_tok_s"] - 1
        assert (abs(deviation) < 0.015 if run["client"] == "throughput_check" else -0.04 < deviation < 0.01), run


def mean(client, concurrency):
    values = [r["server_busy_tok_s"] for r in WORDS["runs"] if r["client"] == client and r["concurrency"] == concurrency]
    return sum(values) / len(values)


def test_the_server_served_throughput_checks_load_slower_the_more_requests_ran_at_once():
    ratios = [mean("throughput_check", c) / mean("vllm bench serve", c) for c in (8, 32, 128)]
    assert ratios[0] > 0.95 and ratios[1] < ratios[0] and ratios[2] < 0.85, ratios


def test_because_its_prompts_were_nearly_twice_as_long():
    before, between, after = PROMPTS["counters"]
    ours = between["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"]
    theirs = after["vllm:prompt_tokens_total"] - between["vllm:prompt_tokens_total"]
    requests = [between["vllm:request_success_total"] - before["vllm:request_success_total"],
                after["vllm:request_success_total"] - between["vllm:request_success_total"]]
    assert requests == [1024, 1024]
    # 128 words a prompt were 242 tokens of the server's tokenizer; vLLM bench's random prompts 128 exactly.
    assert round(ours / 1024) == 242 and theirs == 128 * 1024, (ours, theirs)
    assert [r["client"] for r in PROMPTS["runs"]] == ["throughput_check", "vllm bench serve"]
    assert PROMPTS["runs"][0]["output_tok_s"] < 0.85 * PROMPTS["runs"][1]["output_tok_s"]
