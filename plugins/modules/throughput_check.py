#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: throughput_check
short_description: Gate a live OpenAI-compatible (vLLM) endpoint on streaming throughput and latency
version_added: "0.1.0"
description:
  - Sends a short streaming load to a live OpenAI-compatible endpoint (vLLM) at one or more concurrency
    levels and measures, per level, output tokens/s, requests/s, time to first token (TTFT), time per
    output token (TPOT), inter-token latency (ITL) and errors by kind.
  - Output tokens are counted from the stream's C(usage) block (the request asks for
    C(stream_options.include_usage)); when the server sends no usage, the number of text chunks is used.
  - When the server exposes Prometheus C(/metrics), the delta of C(vllm:generation_tokens_total) across each
    level is reported next to the client's count, with their ratio.
  - Fails when a threshold is not met (unless O(fail_on_threshold=false)); never reports a change.
  - The load client is stdlib only (one asyncio event loop, keep-alive HTTP/1.1 connections, chunked and SSE
    parsing done in the protocol callback), so it runs with the system Python of a bare GPU host; it uses
    C(uvloop) when that is importable. It can equally run on the controller with C(delegate_to=localhost).
  - Load is not harmless on a production box. In check mode no request is sent.
author:
  - llmfleet maintainers (@llmfleet)
options:
  base_url:
    description:
      - Root URL of the server, for example V(http://127.0.0.1:8000). A trailing C(/v1) is accepted.
    type: str
    required: true
  api_key:
    description:
      - Bearer token sent as C(Authorization). Read from E(VLLM_API_KEY) or E(OPENAI_API_KEY) when not set.
    type: str
  model:
    description:
      - Model name to request. Default is the first model listed by C(GET /v1/models).
    type: str
  endpoint:
    description:
      - V(completions) posts to C(/v1/completions), V(chat) to C(/v1/chat/completions).
    type: str
    choices: [completions, chat]
    default: completions
  concurrency:
    description:
      - Concurrency levels to run, in order. Each level keeps this many requests in flight.
    type: list
    elements: int
    default: [1]
  requests_per_level:
    description:
      - Requests sent at each level. Default (when O(duration_s) is not set either) is
        C(max(8, 4 * concurrency)).
      - Mutually exclusive with O(duration_s).
    type: int
  duration_s:
    description:
      - Seconds to keep starting requests at each level; requests in flight then run to completion.
      - Mutually exclusive with O(requests_per_level).
    type: float
  prompt:
    description:
      - Fixed prompt text. Mutually exclusive with O(prompt_tokens).
    type: str
  prompt_tokens:
    description:
      - Length in tokens of random-word prompts, a different prompt per request (seeded by O(seed)). Used when
        O(prompt) is not set; default V(32).
      - A word is one token or more, by the server's tokenizer; the prompts are sized first (RV(prompt)).
    type: int
  max_tokens:
    description: Output tokens per request (C(max_tokens)).
    type: int
    default: 64
  ignore_eos:
    description:
      - Send vLLM's C(ignore_eos=true) so that every request generates exactly O(max_tokens) tokens.
      - Set to V(false) for servers that reject unknown parameters.
    type: bool
    default: true
  extra_body:
    description: Extra fields merged into every request body (for example C(temperature)).
    type: dict
  timeout_s:
    description: Per-request limit in seconds, from connect to the end of the stream.
    type: float
    default: 60
  warmup_requests:
    description: Requests sent (one at a time) before the first level; not measured.
    type: int
    default: 1
  seed:
    description: Seed of the random prompts.
    type: int
    default: 0
  min_output_tok_s:
    description: Fail a level whose output tokens/s is below this.
    type: float
  max_error_rate:
    description: Fail a level whose failed/sent requests ratio exceeds this (0 to 1).
    type: float
    default: 0.0
  max_ttft_p99_s:
    description: Fail a level whose p99 time to first token (seconds) exceeds this.
    type: float
  max_tpot_p99_s:
    description: Fail a level whose p99 time per output token (seconds) exceeds this.
    type: float
  max_metrics_deviation:
    description:
      - Fail a level when the client's output token count and the server's C(vllm:generation_tokens_total)
        delta differ by more than this fraction (for example V(0.02)). Not checked when unset or when the
        server has no metrics.
    type: float
  level_thresholds:
    description:
      - Per-level thresholds overriding the global ones for the level whose concurrency matches.
    type: list
    elements: dict
    suboptions:
      concurrency:
        description: The level these thresholds apply to.
        type: int
        required: true
      min_output_tok_s:
        description: See O(min_output_tok_s).
        type: float
      max_error_rate:
        description: See O(max_error_rate).
        type: float
      max_ttft_p99_s:
        description: See O(max_ttft_p99_s).
        type: float
      max_tpot_p99_s:
        description: See O(max_tpot_p99_s).
        type: float
  metrics_url:
    description:
      - Prometheus endpoint read before and after each level. Default is O(base_url) root + C(/metrics).
    type: str
  check_metrics:
    description: Read the server's C(/metrics) counters around each level.
    type: bool
    default: true
  validate_certs:
    description: Verify TLS certificates for C(https) URLs.
    type: bool
    default: true
  results_path:
    description: Write the full result as JSON to this path on the host running the module.
    type: path
  fail_on_threshold:
    description: When V(false), report threshold failures in RV(failures) and RV(passed) but do not fail.
    type: bool
    default: true
  min_repeats:
    description:
      - Rounds per level at least; each round is the whole level (O(requests_per_level) requests or O(duration_s)
        seconds) with new prompts, and gives one output tok/s sample.
      - With three rounds or more a level reports the 95 % confidence interval of the samples' mean
        (RV(levels[].output_tok_s_ci)), and O(min_output_tok_s) fails a level only when the whole interval is below it.
    type: int
    default: 1
  max_repeats:
    description:
      - Rounds per level at most. After O(min_repeats), rounds go on until the interval's half-width is within
        O(target_ci_rel) of the mean, this many rounds ran, or the next round would end after O(repeat_budget_s).
      - V(1) (with O(min_repeats=1)) measures each level once, without an interval. Below O(min_repeats) it counts
        as O(min_repeats).
    type: int
    default: 1
  target_ci_rel:
    description: Half-width of the 95 % confidence interval, relative to the mean, at which a level stops (V(0.05) is ±5 %).
    type: float
    default: 0.05
  repeat_budget_s:
    description:
      - Seconds per level after which no new round starts once O(min_repeats) ran; unset for no limit.
      - With O(peer), the rounds of both sides count.
    type: float
  slo_ttft_s:
    description: Time-to-first-token objective (seconds) of RV(levels[].goodput); unset for none.
    type: float
  slo_tpot_s:
    description: Time-per-output-token objective (seconds) of RV(levels[].goodput); unset for none.
    type: float
  peer:
    description:
      - A second endpoint measured in the same run, for an A/B comparison that the machine's drift cannot bias.
        Each level's rounds alternate between O(base_url) and the peer in ABBA order (A B, B A, A B, ...), with
        new prompts every round, until both sides may stop (O(min_repeats) to O(max_repeats), O(target_ci_rel),
        O(repeat_budget_s), the budget counting both sides' rounds). Rounds end only after whole A B B A blocks (an
        even number a side, so that a steady drift weighs the same on both) unless O(max_repeats) comes first. Its
        levels are returned in RV(peer).
      - The peer may be the same endpoint (an A/A check). Thresholds apply to O(base_url) only, and server
        metrics are not read (the two sides may share a server).
    type: dict
    suboptions:
      base_url:
        description: Root URL of the peer server.
        type: str
        required: true
      model:
        description: Model to request from the peer; default the first one its C(GET /v1/models) lists.
        type: str
      api_key:
        description: Bearer token for the peer; default O(api_key), which is then sent to the peer too.
        type: str
attributes:
  check_mode:
    description: In check mode no load is sent; the module returns RV(skipped_load=true).
  diff_mode:
    description: Nothing is changed, so there is no diff.
extends_documentation_fragment:
  - llmfleet.vllm.attributes
notes:
  - TPOT is C((latency - TTFT) / (output_tokens - 1)) per request, as C(vllm bench serve) computes it;
    ITL is the gap between consecutive text chunks.
  - The server counter also counts tokens of failed or aborted requests, so compare RV(levels[].metrics_ratio)
    on levels without errors.
"""

EXAMPLES = r"""
- name: Gate the freshly pivoted model on throughput
  llmfleet.vllm.throughput_check:
    base_url: http://127.0.0.1:8000
    concurrency: [1, 16, 64]
    requests_per_level: 128
    max_tokens: 128
    min_output_tok_s: 500
    max_ttft_p99_s: 2.0
    level_thresholds:
      - concurrency: 1
        min_output_tok_s: 40
    results_path: /var/lib/llmfleet/throughput-{{ ansible_date_time.iso8601_basic_short }}.json

- name: Measure only (from the controller), never fail
  llmfleet.vllm.throughput_check:
    base_url: "http://{{ inventory_hostname }}:8000/v1"
    endpoint: chat
    concurrency: [8]
    duration_s: 20
    fail_on_threshold: false
  delegate_to: localhost
  register: tput
"""

RETURN = r"""
passed:
  description: Whether every level met its thresholds.
  returned: always
  type: bool
  sample: true
failures:
  description: One human-readable message per threshold not met.
  returned: always
  type: list
  elements: str
  sample: ["concurrency 64: output 812.4 tok/s is below min_output_tok_s 1000 (25984 tokens in 31.98 s)"]
model:
  description: Model requested.
  returned: unless skipped in check mode
  type: str
  sample: meta-llama/Llama-3.1-8B-Instruct
endpoint:
  description: Request path used.
  returned: unless skipped in check mode
  type: str
  sample: /v1/completions
skipped_load:
  description: True in check mode (no request was sent).
  returned: always
  type: bool
event_loop:
  description: C(uvloop) or C(asyncio).
  returned: unless skipped in check mode
  type: str
warmup:
  description: Completed and failed warm-up requests.
  returned: unless skipped in check mode
  type: dict
  sample: {completed: 1, failed: 0}
prompt:
  description:
    - The random prompts' size. Before the warm-up, every word the prompts draw from goes to the server twice over, in
      as few prompts of at most O(prompt_tokens) words as hold them and then in one prompt more, one output token each
      (C(sizing_requests), their C(sizing_prompt_tokens) and the seconds they took, C(sizing_seconds)).
    - From the usage, C(tokens_per_word) (a random word's mean) and C(tokens_per_request) (what the server adds to each
      request, such as a BOS token or a chat template); every later request sends C(words) words, as many as make
      O(prompt_tokens) tokens there (vLLM bench serve's random prompts are exact token counts). The peer's, when there
      is one, is C(prompt) in RV(peer).
    - C(tokens_per_word) is null when a sizing request failed or the server sent no usage (a warning says so); the
      prompts are then O(prompt_tokens) words.
  returned: when the prompts are random (O(prompt) not set), unless skipped in check mode
  type: dict
  sample: {tokens: 128, words: 67, tokens_per_word: 1.9, tokens_per_request: 1.0, sizing_requests: 3,
           sizing_prompt_tokens: 412, sizing_seconds: 0.21}
levels:
  description: Per concurrency level measurements (times in seconds).
  returned: always
  type: list
  elements: dict
  contains:
    concurrency:
      description: "Requests kept in flight."
      type: int
      returned: always
    requests:
      description: "Requests sent."
      type: int
      returned: always
    completed:
      description: "Requests answered with status 200 whose stream ended with C(data: [DONE])."
      type: int
      returned: always
    failed:
      description: "Requests that failed."
      type: int
      returned: always
    error_rate:
      description: "failed / requests."
      type: float
      returned: always
    errors:
      description: Failed requests by kind (C(http_<status>), C(timeout), C(connection), C(stream_cut), C(stream_error)).
      type: dict
      returned: always
      sample: {http_500: 2, stream_cut: 1}
    error_samples:
      description: "Up to five error messages."
      type: list
      elements: str
      returned: always
    duration_s:
      description: "Wall time of the level."
      type: float
      returned: always
    output_tokens:
      description: "Output tokens of completed requests (usage, else chunks)."
      type: int
      returned: always
    output_tokens_usage:
      description: "Sum of C(usage.completion_tokens) of completed requests."
      type: int
      returned: always
    requests_with_usage:
      description: "Completed requests that reported usage."
      type: int
      returned: always
    output_chunks:
      description: "Text chunks received in completed requests."
      type: int
      returned: always
    partial_output_tokens:
      description: "Tokens received by failed requests."
      type: int
      returned: always
    output_tok_s:
      description: "output_tokens / duration_s."
      type: float
      returned: always
    request_s:
      description: "completed / duration_s."
      type: float
      returned: always
    ttft_s:
      description: "Time to first token, C(mean p50 p90 p99 min max count)."
      type: dict
      returned: always
    tpot_s:
      description: "Time per output token statistics."
      type: dict
      returned: always
    itl_s:
      description: "Inter-token (chunk) latency statistics."
      type: dict
      returned: always
    latency_s:
      description: "Request latency statistics."
      type: dict
      returned: always
    server_generation_tokens:
      description: Delta of the server's C(vllm:generation_tokens_total) across the level; null without metrics.
      type: float
      returned: always
    server_output_tok_s:
      description: "server_generation_tokens / duration_s."
      type: float
      returned: always
    metrics_ratio:
      description: "output_tokens / server_generation_tokens."
      type: float
      returned: always
    samples:
      description:
        - "One entry per round: C(round start_s requests completed failed duration_s output_tok_s request_s ttft_p50_s
          tpot_p50_s); C(start_s) is when the round began, in seconds since the level's first round began."
        - The level's other figures pool every round (durations summed).
      type: list
      elements: dict
      returned: always
    output_tok_s_ci:
      description:
        - "Output tok/s over the rounds: C(n mean stdev cv confidence half_width rel_half_width low high stop)."
        - C(low) and C(high) bound the 95 % confidence interval of the mean (Student's t); null below three rounds
          (with two, t is 12.7 and the interval says next to nothing).
        - C(stop) says why the rounds ended (C(single), C(converged), C(max_repeats), C(budget)).
      type: dict
      returned: always
    goodput:
      description:
        - Completed requests that met O(slo_ttft_s) and O(slo_tpot_s), as C(vllm bench serve --goodput) counts them
          (C(slo_ttft_s slo_tpot_s requests_met request_s output_tok_s)); null without an objective.
      type: dict
      returned: always
    thresholds:
      description: "Thresholds applied to this level."
      type: dict
      returned: always
    passed:
      description: "Whether this level met its thresholds."
      type: bool
      returned: always
    failures:
      description: "This level's threshold messages."
      type: list
      elements: str
      returned: always
peer:
  description:
    - The peer's measurements, rounds interleaved with those of RV(levels) (C(base_url model levels), and C(prompt) as
      RV(prompt) for the peer's server); each level has the keys of RV(levels) except the server metrics and thresholds.
  returned: when O(peer) is set and load was sent
  type: dict
metrics_available:
  description: Whether the server's generation token counter could be read.
  returned: unless skipped in check mode
  type: bool
metrics_error:
  description: Why the metrics could not be read.
  returned: when metrics were wanted but unavailable
  type: str
results_path:
  description: Where the JSON result was written.
  returned: when O(results_path) is set and load was sent
  type: str
"""

import json
import time
import traceback

from ansible.module_utils.basic import AnsibleModule, env_fallback
from ansible.module_utils.common.text.converters import to_native

from ansible_collections.llmfleet.vllm.plugins.module_utils.atomic_write import atomic_write
from ansible_collections.llmfleet.vllm.plugins.module_utils.bench_stats import goodput, level_stats
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen import loop_name, new_event_loop, run_level
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_conn import Target
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_rounds import Repeats, measure_interleaved
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_workload import (
    LoadSpec,
    build_body,
    make_rng,
    random_prompt,
    vocabulary_prompts,
    words_for_tokens,
)
from ansible_collections.llmfleet.vllm.plugins.module_utils.loadgen_gate import (
    check_level,
    fetch_generation_tokens,
    fetch_models,
    settle_counter,
    validate_params,
)

THRESHOLD_KEYS = ("min_output_tok_s", "max_error_rate", "max_ttft_p99_s", "max_tpot_p99_s")


def argument_spec():
    lvl = dict(
        concurrency=dict(type="int", required=True),
        min_output_tok_s=dict(type="float"),
        max_error_rate=dict(type="float"),
        max_ttft_p99_s=dict(type="float"),
        max_tpot_p99_s=dict(type="float"),
    )
    return dict(
        base_url=dict(type="str", required=True),
        api_key=dict(type="str", no_log=True, fallback=(env_fallback, ["VLLM_API_KEY", "OPENAI_API_KEY"])),
        model=dict(type="str"),
        endpoint=dict(type="str", choices=["completions", "chat"], default="completions"),
        concurrency=dict(type="list", elements="int", default=[1]),
        requests_per_level=dict(type="int"),
        duration_s=dict(type="float"),
        prompt=dict(type="str"),
        prompt_tokens=dict(type="int", no_log=False),
        max_tokens=dict(type="int", default=64, no_log=False),
        ignore_eos=dict(type="bool", default=True),
        extra_body=dict(type="dict"),
        timeout_s=dict(type="float", default=60.0),
        warmup_requests=dict(type="int", default=1),
        seed=dict(type="int", default=0),
        min_output_tok_s=dict(type="float"),
        max_error_rate=dict(type="float", default=0.0),
        max_ttft_p99_s=dict(type="float"),
        max_tpot_p99_s=dict(type="float"),
        max_metrics_deviation=dict(type="float"),
        level_thresholds=dict(type="list", elements="dict", options=lvl),
        metrics_url=dict(type="str"),
        check_metrics=dict(type="bool", default=True),
        validate_certs=dict(type="bool", default=True),
        results_path=dict(type="path"),
        fail_on_threshold=dict(type="bool", default=True),
        min_repeats=dict(type="int", default=1),
        max_repeats=dict(type="int", default=1),
        target_ci_rel=dict(type="float", default=0.05),
        repeat_budget_s=dict(type="float"),
        slo_ttft_s=dict(type="float"),
        slo_tpot_s=dict(type="float"),
        peer=dict(type="dict", options=dict(
            base_url=dict(type="str", required=True),
            model=dict(type="str"),
            api_key=dict(type="str", no_log=True),
        )),
    )


def thresholds_for(params, concurrency):
    th = dict((k, params[k]) for k in THRESHOLD_KEYS)
    th["max_metrics_deviation"] = params["max_metrics_deviation"]
    for lt in params.get("level_thresholds") or []:
        if lt["concurrency"] == concurrency:
            for k in THRESHOLD_KEYS:
                if lt.get(k) is not None:
                    th[k] = lt[k]
    return th


def served_model(target, model, timeout_s):
    if model:
        return model
    models = fetch_models(target, timeout_s)
    if not models:
        raise RuntimeError("GET %s returned no model; set the model option" % target.url("/v1/models"))
    return models[0]


def measured_level(concurrency, records, busy_s, samples, ci, params):
    """A level's figures from every round's records (no server metrics, no thresholds)."""
    lvl = dict(concurrency=concurrency)
    lvl.update(level_stats(records, 0.0, busy_s))
    lvl["samples"], lvl["output_tok_s_ci"] = samples, ci
    lvl["goodput"] = goodput(records, busy_s, params["slo_ttft_s"], params["slo_tpot_s"])
    return lvl


def size_prompts(loop, served, words, tokens, params, module_warn=None):
    """vocabulary_prompts to each side, one at a time, one output token each: from the usage, how many tokens the server's
    tokenizer makes of a random word and adds to a request; words[side] becomes as many words as make ``tokens``
    tokens there. Returns each side's sizing."""
    prompts = vocabulary_prompts(tokens)
    spec = LoadSpec(1, requests=len(prompts), timeout_s=params["timeout_s"], keep_chunk_times=False)
    sized = []
    for side, (side_target, model) in enumerate(served):
        def probe(i, model=model):
            return build_body(model, params["endpoint"], prompts[i][1], 1, params["ignore_eos"], params["extra_body"])
        records = loop.run_until_complete(run_level(side_target, spec, probe, loop))[0]
        counted = [(which, r.prompt_tokens if r.ok and r.prompt_tokens >= 0 else None)
                   for (which, _prompt), r in zip(prompts, records)]
        words[side], per_word, per_request = words_for_tokens(tokens, counted)
        sized.append(dict(tokens=tokens, words=words[side], tokens_per_word=per_word, tokens_per_request=per_request,
                          sizing_requests=len(records),
                          sizing_prompt_tokens=sum(count for _which, count in counted if count),
                          sizing_seconds=round(sum(r.latency for r in records if r.ok), 4)))
        if per_word is None and module_warn:
            failed = [r for r in records if not r.ok]
            module_warn("%s: the prompts were not sized in the server's tokens (%d of %d sizing requests failed%s, or "
                        "no usage came back): they are %d words" % (
                            model, len(failed), len(records),
                            (": %s %s" % (failed[0].error, failed[0].error_detail or ""))[:200] if failed else "", tokens))
    return sized


def run_checks(params, module_warn=None):
    """Run warm-up and every level; returns the result dict (no exit)."""
    target = Target(params["base_url"], params["endpoint"], params["api_key"], params["validate_certs"])
    model = served_model(target, params["model"], params["timeout_s"])
    peer, peer_target, peer_model = params["peer"], None, None
    if peer:
        peer_target = Target(peer["base_url"], params["endpoint"], peer["api_key"] or params["api_key"],
                             params["validate_certs"])
        peer_model = served_model(peer_target, peer["model"], params["timeout_s"])
    metrics_url = params["metrics_url"] or target.url("/metrics")
    rng = make_rng(params["seed"])
    fixed_prompt = params["prompt"]
    prompt_tokens = params["prompt_tokens"] or 32
    # Per side (a peer may tokenize otherwise): as many random words as make prompt_tokens tokens there (size_prompts).
    words = [prompt_tokens, prompt_tokens]
    peer_prompt = None

    def body_for(side, name):
        def body_fn(_i):
            prompt = fixed_prompt if fixed_prompt is not None else random_prompt(rng, words[side])
            return build_body(name, params["endpoint"], prompt, params["max_tokens"], params["ignore_eos"],
                              params["extra_body"])
        return body_fn

    served = [(target, model)] + ([(peer_target, peer_model)] if peer else [])
    sides = [(side_target, body_for(side, name)) for side, (side_target, name) in enumerate(served)]
    result = dict(model=model, endpoint=target.path, event_loop=loop_name(), levels=[], failures=[],
                  metrics_available=False, skipped_load=False)
    peer_levels = []
    repeats = Repeats(params["min_repeats"], params["max_repeats"], params["target_ci_rel"], params["repeat_budget_s"])
    loop = new_event_loop()
    try:
        if fixed_prompt is None:
            sized = size_prompts(loop, served, words, prompt_tokens, params, module_warn)
            result["prompt"] = sized[0]
            peer_prompt = sized[1] if peer else None
        if params["warmup_requests"]:
            spec = LoadSpec(1, requests=params["warmup_requests"], timeout_s=params["timeout_s"],
                            keep_chunk_times=False)
            recs = []
            for side_target, body_fn in sides:
                recs.extend(loop.run_until_complete(run_level(side_target, spec, body_fn, loop))[0])
            result["warmup"] = dict(completed=sum(1 for r in recs if r.ok), failed=sum(1 for r in recs if not r.ok))
        # The peer may be the same server: its counter would count both sides.
        want_metrics = params["check_metrics"] and not peer
        for c in params["concurrency"]:
            n = params["requests_per_level"]
            if n is None and params["duration_s"] is None:
                n = max(8, 4 * c)
            spec = LoadSpec(c, requests=n, duration_s=params["duration_s"], timeout_s=params["timeout_s"])
            before = None
            if want_metrics:
                before, err = fetch_generation_tokens(metrics_url, target, params["timeout_s"])
                if before is None:
                    want_metrics = False
                    result["metrics_error"] = err
                    if module_warn:
                        module_warn("server metrics unavailable, no cross-check: %s" % err)
            measured = measure_interleaved(loop, sides, spec, repeats)
            lvl = measured_level(c, *measured[0], params=params)
            if peer:
                peer_levels.append(measured_level(c, *measured[1], params=params))
            lvl["server_generation_tokens"] = None
            lvl["server_output_tok_s"] = None
            lvl["metrics_ratio"] = None
            if before is not None:
                after, err = settle_counter(metrics_url, target, params["timeout_s"])
                if after is not None:
                    result["metrics_available"] = True
                    delta = after - before
                    lvl["server_generation_tokens"] = delta
                    lvl["server_output_tok_s"] = delta / lvl["duration_s"] if lvl["duration_s"] > 0 else 0.0
                    lvl["metrics_ratio"] = (lvl["output_tokens"] / delta) if delta > 0 else None
                else:
                    result["metrics_error"] = err
            th = thresholds_for(params, c)
            lvl["thresholds"] = th
            lvl["failures"] = check_level(lvl, th)
            lvl["passed"] = not lvl["failures"]
            result["failures"].extend(lvl["failures"])
            result["levels"].append(lvl)
    finally:
        loop.close()
    if peer:
        result["peer"] = dict(base_url=peer["base_url"], model=peer_model, levels=peer_levels)
        if peer_prompt is not None:
            result["peer"]["prompt"] = peer_prompt
    result["passed"] = not result["failures"]
    return result


def _tok_s(lvl):
    ci = lvl["output_tok_s_ci"]
    if ci["half_width"] is None:
        return "%.1f" % lvl["output_tok_s"]
    return "%.1f ± %.1f (%d rounds)" % (ci["mean"], ci["half_width"], ci["n"])


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(),
        mutually_exclusive=[("requests_per_level", "duration_s"), ("prompt", "prompt_tokens")],
        supports_check_mode=True,
    )
    p = module.params
    problems = validate_params(p)
    if problems:
        module.fail_json(msg="invalid options: " + "; ".join(problems), passed=False, failures=[], levels=[],
                         skipped_load=False)
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, skipped_load=True, passed=True, failures=[], levels=[],
                         msg="check mode: no load sent to %s" % p["base_url"])
    started = time.time()
    try:
        result = run_checks(p, module.warn)
    except Exception as exc:  # pylint: disable=broad-except
        module.fail_json(msg="throughput check could not run against %s: %s" % (p["base_url"], to_native(exc)),
                         exception=traceback.format_exc(), passed=False, failures=[], levels=[], skipped_load=False)
    result["started_at"] = started
    result["base_url"] = p["base_url"]
    if p["results_path"]:
        path = p["results_path"]
        atomic_write(path, json.dumps(result, indent=2, sort_keys=True))
        result["results_path"] = path
    summary = ", ".join("c=%d: %s tok/s, %d/%d ok" % (lv["concurrency"], _tok_s(lv), lv["completed"], lv["requests"])
                        for lv in result["levels"])
    if "peer" in result:
        summary += "; interleaved with %s at %s: " % (result["peer"]["model"], result["peer"]["base_url"]) + ", ".join(
            "c=%d: %s tok/s" % (lv["concurrency"], _tok_s(lv)) for lv in result["peer"]["levels"])
    if result["failures"] and p["fail_on_threshold"]:
        module.fail_json(msg="throughput check failed: " + " | ".join(result["failures"]), changed=False, **result)
    result["msg"] = ("throughput check passed: " if result["passed"] else "throughput check below thresholds: ") + summary
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
