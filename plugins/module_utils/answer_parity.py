# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Golden-answer parity: what a model answers to fixed probes, greedily, and whether a later start answers the same.

The parity key says when two starts must answer alike: the weights (repo, commit, patches), the engine's version and
every serving setting that changes the numerics (NUMERIC_SERVING_KEYS). A different key starts a new record; the same
key must match it. Answers are token ids with their logprobs and the recorded top-1/top-2 margin per position:
a token may differ only where the recorded margin is within ``epsilon`` (a near-tie, which kernels and batch shapes
may flip, above all on random weights); the logprobs of the tokens before the first difference must stay within
``logprob_tolerance``. Pure Python: the module llmfleet.vllm.answer_parity probes, the filter parity_compare compares.
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys

# The serving settings that change what a model answers (its numerics or its default sampling), in the parity key.
# Not in it: ports, names, memory and scheduling limits (max_num_seqs, kv_cache_memory_bytes, gpu_memory_utilization),
# the environment.
NUMERIC_SERVING_KEYS = (
    'dtype', 'kv_cache_dtype', 'max_model_len', 'tensor_parallel_size', 'pipeline_parallel_size', 'data_parallel_size',
    'decode_context_parallel_size', 'enable_expert_parallel', 'distributed_executor_backend', 'attention_backend',
    'compilation_config', 'speculative_config', 'enforce_eager', 'tokenizer', 'hf_config_path', 'trust_remote_code',
    'chat_template', 'chat_template_content_format', 'generation_config', 'override_generation_config',
    'tool_call_parser', 'reasoning_parser', 'extra_args',
)
# Near-ties: recorded top-1/top-2 margins (nats) at or below this may flip between identical starts.
DEFAULT_EPSILON = 0.02
# How far a token's logprob may move between identical starts (nats); docs/benchmarks.md has the spread measured.
DEFAULT_LOGPROB_TOLERANCE = 0.05
DEFAULT_MAX_TOKENS = 16
DEFAULT_SEED = 0
# Used when the catalog entry has no probes: short, varied prompts any base or chat model continues.
DEFAULT_PROBES = (
    {'name': 'capital', 'prompt': 'The capital of France is'},
    {'name': 'count', 'prompt': '1, 2, 3, 4, 5,'},
    {'name': 'code', 'prompt': 'def fibonacci(n):\n    '},
    {'name': 'story', 'prompt': 'Once upon a time, in a small village by the sea,'},
)
PROBE_NAME_RE = re.compile(r'^[a-z0-9][a-z0-9_-]{0,40}\Z')
TOKEN_ID_RE = re.compile(r'^token_id:(-?\d+)\Z')


class ParityError(ValueError):
    """A probe answer or a record is not what this module writes."""


def parity_key(repo, commit, engine_version, serving, quantization=None, patches=None):
    """{digest, parts}: the parts that decide what a start must answer, and a digest of them (sha256, 16 hex)."""
    serving = serving or {}
    parts = {
        'repo': repo,
        'commit': commit,
        'engine_version': engine_version,
        'quantization': quantization,
        'patches': sorted('%s:%s' % (p.get('applies_to'), p.get('name')) for p in (patches or [])),
        'serving': {k: serving[k] for k in NUMERIC_SERVING_KEYS if serving.get(k) not in (None, [], {})},
    }
    blob = json.dumps(parts, sort_keys=True, separators=(',', ':'))
    return {'digest': hashlib.sha256(blob.encode('utf-8')).hexdigest()[:16], 'parts': parts}


def token_id(token):
    """The id in vLLM's ``token_id:<id>`` form (return_tokens_as_token_ids)."""
    match = TOKEN_ID_RE.match(str(token))
    if not match:
        raise ParityError('expected a token in the form token_id:<id>, got %r' % (token,))
    return int(match.group(1))


def answer_from_completion(name, prompt, choice):
    """One probe's answer from a /v1/completions choice asked with logprobs=2 and return_tokens_as_token_ids:
    {name, prompt, text, token_ids, logprobs, margins} (margin: top-1 minus top-2 logprob; null with one candidate)."""
    logprobs = choice.get('logprobs') or {}
    tokens, token_logprobs, tops = logprobs.get('tokens'), logprobs.get('token_logprobs'), logprobs.get('top_logprobs')
    if not isinstance(tokens, list) or not isinstance(token_logprobs, list) or not isinstance(tops, list):
        raise ParityError('probe %s: the completion has no token logprobs (logprobs=2 not honoured?)' % name)
    margins = []
    for top in tops:
        values = sorted((v for v in (top or {}).values() if v is not None), reverse=True)
        margins.append(round(values[0] - values[1], 6) if len(values) > 1 else None)
    return {'name': name, 'prompt': prompt, 'text': choice.get('text', ''),
            'token_ids': [token_id(t) for t in tokens],
            'logprobs': [None if v is None else round(float(v), 6) for v in token_logprobs],
            'margins': margins}


def _compare_one(expected, got, epsilon, tolerance):
    """{name, status: match|near_tie|diverged, index, expected_token, got_token, margin, max_logprob_delta, ...}."""
    result = {'name': expected['name'], 'status': 'match', 'max_logprob_delta': 0.0}
    if got is None:
        return dict(result, status='diverged', reason='no answer to this probe')
    exp_ids, got_ids = expected['token_ids'], got['token_ids']
    for i in range(max(len(exp_ids), len(got_ids))):
        want = exp_ids[i] if i < len(exp_ids) else None
        have = got_ids[i] if i < len(got_ids) else None
        if want != have:
            margin = expected['margins'][i] if i < len(expected['margins']) else None
            where = {'index': i, 'expected_token': want, 'got_token': have, 'margin': margin,
                     'text_expected': expected.get('text', ''), 'text_got': got.get('text', '')}
            if margin is not None and margin <= epsilon and want is not None and have is not None:
                return dict(result, status='near_tie', **where)
            return dict(result, status='diverged', reason='token %d differs' % i, **where)
        want_lp, have_lp = expected['logprobs'][i], got['logprobs'][i]
        if want_lp is not None and have_lp is not None:
            delta = abs(want_lp - have_lp)
            result['max_logprob_delta'] = round(max(result['max_logprob_delta'], delta), 6)
            if delta > tolerance:
                return dict(result, status='diverged', reason='logprob of token %d moved %.4f (> %.4f)' % (i, delta, tolerance),
                            index=i, expected_token=want, got_token=have, margin=expected['margins'][i],
                            text_expected=expected.get('text', ''), text_got=got.get('text', ''))
    return result


def compare(expected_answers, answers, epsilon=DEFAULT_EPSILON, tolerance=DEFAULT_LOGPROB_TOLERANCE):
    """Compare this start's answers with a record's: {ok, probes: [per probe], diverged: [names], summary}."""
    by_name = {a['name']: a for a in answers}
    probes = [_compare_one(e, by_name.get(e['name']), epsilon, tolerance) for e in expected_answers]
    diverged = [p['name'] for p in probes if p['status'] == 'diverged']
    return {'ok': not diverged, 'probes': probes, 'diverged': diverged, 'epsilon': epsilon, 'tolerance': tolerance,
            'max_logprob_delta': max([p['max_logprob_delta'] for p in probes] or [0.0]),
            'summary': summary(probes)}


def summary(probes):
    """One line per diverged probe: where it left the record, and the two tokens."""
    lines = []
    for p in probes:
        if p['status'] != 'diverged':
            continue
        if 'index' in p:
            margin = 'n/a' if p.get('margin') is None else '%.4f' % p['margin']
            lines.append('%s: %s (first diverging token %d: expected id %s, got id %s; recorded margin %s); '
                         'expected %s, got %s' % (p['name'], p['reason'], p['index'], p['expected_token'], p['got_token'],
                                                  margin, json.dumps(p['text_expected'][:80]), json.dumps(p['text_got'][:80])))
        else:
            lines.append('%s: %s' % (p['name'], p['reason']))
    return lines


# Python's re cannot be interrupted (no timeout, no signal reaches it mid-match), and a pattern with nested repetition
# such as ^(\w+\s?)+$ takes exponential time on a text it almost matches: the search runs in a child process that is
# killed after this long, so a catalog entry's pattern cannot hang the run that holds the host's lock.
EXPECT_TIMEOUT_S = 2.0
# The pattern and the text travel as JSON on stdin (argv cannot hold a NUL, and JSON's escapes carry any string);
# 0 is a match, 3 none: anything else is the child's own failure.
_SEARCH = ('import json, re, sys; pattern, text = json.loads(sys.stdin.buffer.read().decode("utf-8")); '
           'sys.exit(0 if re.search(pattern, text) else 3)')


def bounded_search(pattern, text, timeout_s=EXPECT_TIMEOUT_S):
    """Whether re.search(pattern, text) finds a match: True, False, or None when it took longer than timeout_s (the
    search is stopped). Raises re.error for a pattern that does not compile."""
    re.compile(pattern)
    try:
        run = subprocess.run([sys.executable, '-I', '-S', '-c', _SEARCH], input=json.dumps([pattern, text]).encode(),
                             capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return None
    if run.returncode not in (0, 3):
        raise RuntimeError('the search for %r failed: %s' % (pattern, run.stderr.decode(errors='replace').strip()[-300:]))
    return run.returncode == 0


def known_answers(probes, answers, timeout_s=EXPECT_TIMEOUT_S):
    """Probes with an ``expect`` pattern whose greedy text does not match it: [{name, expect, text}], and
    ``timed_out: true`` where the search was stopped after timeout_s (counted as not matching)."""
    by_name = {a['name']: a for a in answers}
    missed = []
    for probe in probes:
        if probe.get('expect'):
            text = by_name.get(probe['name'], {}).get('text', '')
            found = bounded_search(probe['expect'], text, timeout_s)
            if not found:
                miss = {'name': probe['name'], 'expect': probe['expect'], 'text': text[:200]}
                if found is None:
                    miss['timed_out'] = True
                missed.append(miss)
    return missed


_JSON_TYPES = {'string': str, 'integer': int, 'number': (int, float), 'boolean': bool, 'object': dict, 'array': list,
               'null': type(None)}


def schema_errors(value, schema, where='arguments'):
    """The ways value breaks a JSON schema's common subset (type, required, properties, enum, items): a list of
    messages, empty when it validates. Enough for a tool's parameters; no $ref, oneOf or formats."""
    errors = []
    wanted = schema.get('type')
    if wanted:
        types = wanted if isinstance(wanted, list) else [wanted]
        ok = any(isinstance(value, _JSON_TYPES.get(t, object)) and not (t in ('integer', 'number') and isinstance(value, bool))
                 for t in types)
        if not ok:
            return ['%s must be %s, got %s' % (where, ' or '.join(types), json.dumps(value))]
    if 'enum' in schema and value not in schema['enum']:
        errors.append('%s must be one of %s, got %s' % (where, json.dumps(schema['enum']), json.dumps(value)))
    if isinstance(value, dict):
        for key in schema.get('required', []):
            if key not in value:
                errors.append('%s misses %s' % (where, key))
        for key, sub in (schema.get('properties') or {}).items():
            if key in value:
                errors.extend(schema_errors(value[key], sub, '%s.%s' % (where, key)))
    if isinstance(value, list) and isinstance(schema.get('items'), dict):
        for i, item in enumerate(value):
            errors.extend(schema_errors(item, schema['items'], '%s[%d]' % (where, i)))
    return errors


def tool_call_errors(tool_probe, message):
    """Why a chat message is not a parsed call of the probe's tool with valid arguments: a list, empty when it is."""
    calls = (message or {}).get('tool_calls') or []
    name = tool_probe['tool']['name']
    if not calls:
        return ['no parsed tool call (content %s)' % json.dumps(str((message or {}).get('content') or '')[:120])]
    function = calls[0].get('function') or {}
    if function.get('name') != name:
        return ['called %s, not %s' % (json.dumps(function.get('name')), name)]
    try:
        arguments = json.loads(function.get('arguments') or '{}')
    except ValueError:
        return ['arguments are not JSON: %s' % str(function.get('arguments'))[:120]]
    return schema_errors(arguments, tool_probe['tool'].get('parameters') or {})
