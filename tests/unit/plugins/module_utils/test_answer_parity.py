"""Golden-answer parity (issue #30): the key, the answers read from vLLM's completion, the comparison (near-ties,
logprob drift, the first diverging token), known answers and tool calls; the controller's filters over them."""
import re
import time

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.filter import answer_parity as filters
from ansible_collections.llmfleet.vllm.plugins.module_utils import answer_parity as ap
from ansible_collections.llmfleet.vllm.plugins.module_utils import catalog, results_paths

SERVING = {'tensor_parallel_size': 1, 'dtype': 'float32', 'max_model_len': 256, 'served_model_name': 'a',
           'kv_cache_memory_bytes': 1 << 26, 'environment': {'X': 1}, 'extra_args': []}


def key(**changes):
    serving = dict(SERVING, **changes.pop('serving', {}))
    args = dict(dict(repo='org/m', commit='c' * 40, engine_version='0.32.0', serving=serving, quantization='none',
                     patches=[]), **changes)
    return ap.parity_key(**args)


def test_the_key_sees_what_changes_answers_and_nothing_else():
    base = key()
    assert base == key() and len(base['digest']) == 16
    assert base['parts']['serving'] == {'dtype': 'float32', 'max_model_len': 256, 'tensor_parallel_size': 1}
    # Names, ports, memory and the environment do not change what the model answers: the same key.
    assert key(serving={'served_model_name': 'alias', 'kv_cache_memory_bytes': 1, 'environment': {}})['digest'] == base['digest']
    # Weights, engine and numeric settings do: another key, never a false failure.
    for other in (key(commit='d' * 40), key(engine_version='0.33.0'), key(serving={'dtype': 'bfloat16'}),
                  key(serving={'kv_cache_dtype': 'fp8'}), key(serving={'extra_args': ['--hf-overrides', '{}']}),
                  key(quantization='fp8'), key(patches=[{'name': 'p', 'applies_to': 'model'}]),
                  key(serving={'tensor_parallel_size': 2})):
        assert other['digest'] != base['digest'], other['parts']


def completion(ids, logprobs, tops, text='x'):
    return {'text': text, 'logprobs': {'tokens': ['token_id:%d' % i for i in ids], 'token_logprobs': logprobs,
                                       'top_logprobs': tops}}


def test_answers_are_read_from_the_completion_with_their_margins():
    answer = ap.answer_from_completion('p', 'hi', completion(
        [5, 7], [-0.1, -1.2], [{'token_id:5': -0.1, 'token_id:9': -2.6}, {'token_id:7': -1.2}], text=' a b'))
    assert answer == {'name': 'p', 'prompt': 'hi', 'text': ' a b', 'token_ids': [5, 7], 'logprobs': [-0.1, -1.2],
                      'margins': [2.5, None]}
    with pytest.raises(ap.ParityError, match='no token logprobs'):
        ap.answer_from_completion('p', 'hi', {'text': 'x', 'logprobs': None})
    with pytest.raises(ap.ParityError, match='token_id:<id>'):
        ap.answer_from_completion('p', 'hi', completion([1], [-1.0], [{}]) | {'logprobs': {
            'tokens': ['hello'], 'token_logprobs': [-1.0], 'top_logprobs': [{}]}})


def answer(name, ids, logprobs=None, margins=None, text=''):
    return {'name': name, 'prompt': name, 'text': text, 'token_ids': ids,
            'logprobs': logprobs or [-1.0] * len(ids), 'margins': margins or [1.0] * len(ids)}


def test_identical_answers_match():
    record = [answer('a', [1, 2, 3]), answer('b', [4, 5])]
    result = ap.compare(record, [answer('b', [4, 5]), answer('a', [1, 2, 3])])
    assert result['ok'] and result['diverged'] == [] and result['summary'] == []
    assert [p['status'] for p in result['probes']] == ['match', 'match']


def test_a_token_may_flip_only_at_a_recorded_near_tie():
    record = [answer('a', [1, 2, 3], margins=[1.0, 0.01, 1.0])]
    near = ap.compare(record, [answer('a', [1, 9, 8])], epsilon=0.02)
    assert near['ok'] and near['probes'][0]['status'] == 'near_tie' and near['probes'][0]['index'] == 1
    far = ap.compare(record, [answer('a', [1, 2, 8], text=' z')], epsilon=0.02)
    assert not far['ok'] and far['diverged'] == ['a']
    first = far['probes'][0]
    assert (first['index'], first['expected_token'], first['got_token'], first['margin']) == (2, 3, 8, 1.0)
    assert far['summary'] == ['a: token 2 differs (first diverging token 2: expected id 3, got id 8; recorded margin '
                              '1.0000); expected "", got " z"']


def test_logprobs_may_drift_only_within_the_tolerance():
    record = [answer('a', [1, 2], logprobs=[-1.0, -2.0])]
    assert ap.compare(record, [answer('a', [1, 2], logprobs=[-1.01, -2.04])], tolerance=0.05)['ok']
    drift = ap.compare(record, [answer('a', [1, 2], logprobs=[-1.0, -2.2])], tolerance=0.05)
    assert not drift['ok'] and 'logprob of token 1 moved 0.2000' in drift['summary'][0]
    assert drift['max_logprob_delta'] == pytest.approx(0.2)


def test_a_missing_probe_or_a_shorter_answer_diverges():
    record = [answer('a', [1, 2]), answer('b', [3])]
    missing = ap.compare(record, [answer('a', [1, 2])])
    assert missing['diverged'] == ['b'] and missing['summary'] == ['b: no answer to this probe']
    short = ap.compare(record, [answer('a', [1]), answer('b', [3])])
    assert short['diverged'] == ['a'] and short['probes'][0]['got_token'] is None


def test_known_answers_and_tool_calls():
    probes = [{'name': 'capital', 'prompt': 'The capital of France is', 'expect': '(?i)paris'}, {'name': 'free', 'prompt': 'x'}]
    assert ap.known_answers(probes, [answer('capital', [1], text=' Paris.'), answer('free', [2])]) == []
    assert ap.known_answers(probes, [answer('capital', [1], text=' Lyon')]) == [
        {'name': 'capital', 'expect': '(?i)paris', 'text': ' Lyon'}]
    tool = {'prompt': 'weather?', 'tool': {'name': 'get_weather', 'parameters': {
        'type': 'object', 'required': ['city'], 'properties': {'city': {'type': 'string', 'enum': ['Paris', 'Rome']},
                                                               'days': {'type': 'integer'}}}}}
    call = {'tool_calls': [{'function': {'name': 'get_weather', 'arguments': '{"city": "Paris", "days": 2}'}}]}
    assert ap.tool_call_errors(tool, call) == []
    assert ap.tool_call_errors(tool, {'content': 'sunny'}) == ['no parsed tool call (content "sunny")']
    assert ap.tool_call_errors(tool, {'tool_calls': [{'function': {'name': 'other', 'arguments': '{}'}}]}) == [
        'called "other", not get_weather']
    bad = {'tool_calls': [{'function': {'name': 'get_weather', 'arguments': '{"city": "Oslo", "days": true}'}}]}
    assert ap.tool_call_errors(tool, bad) == ['arguments.city must be one of ["Paris", "Rome"], got "Oslo"',
                                              'arguments.days must be integer, got true']
    assert ap.tool_call_errors(tool, {'tool_calls': [{'function': {'name': 'get_weather', 'arguments': '{'}}]})[0].startswith(
        'arguments are not JSON')


def probe_result(ids, digest='k1'):
    return {'key': {'digest': digest, 'parts': {'repo': 'org/m', 'commit': 'c0'}}, 'settings': {'max_tokens': 2, 'seed': 0},
            'answers': [answer('a', ids)], 'tool_answer': None}


def test_the_filter_records_matches_and_names_divergence():
    first = filters.parity_compare(probe_result([1, 2]), {})
    assert first['status'] == 'recorded' and first['comparison'] is None and first['record']['answers'][0]['token_ids'] == [1, 2]
    again = filters.parity_compare(probe_result([1, 2]), first['record'])
    assert again['status'] == 'matched' and again['record'] is first['record']
    other = filters.parity_compare(probe_result([1, 3]), first['record'])
    assert other['status'] == 'diverged' and other['comparison']['diverged'] == ['a']
    reset = filters.parity_compare(probe_result([1, 3]), first['record'], reset=True)
    assert reset['status'] == 'recorded' and reset['reset'] and reset['record']['answers'][0]['token_ids'] == [1, 3]
    # A rollout's host against its canary's record: another key of the same weights is compared, and the host keeps
    # a record of its own key.
    canary = dict(first['record'], key={'digest': 'k1', 'parts': {'repo': 'org/m', 'commit': 'c1'}})
    host = dict(probe_result([1, 2], digest='k2'), key={'digest': 'k2', 'parts': {'repo': 'org/m', 'commit': 'c1'}})
    across = filters.parity_compare(host, canary)
    assert across['status'] == 'matched' and not across['comparison']['same_key'] and across['record']['key']['digest'] == 'k2'
    assert filters.parity_compare(dict(host, answers=[answer('a', [7, 2])]), canary)['status'] == 'diverged'
    with pytest.raises(AnsibleFilterError, match=r'the record is of key k1 \(other weights\), the answers of key k2'):
        filters.parity_compare(dict(host, key={'digest': 'k2', 'parts': {'repo': 'org/m', 'commit': 'c2'}}), canary)
    with pytest.raises(AnsibleFilterError, match='expected the result of llmfleet.vllm.answer_parity'):
        filters.parity_compare({'answers': []}, {})


def test_probes_default_and_known_answers_skip_random_weights():
    entry = catalog.get({'m': _entry()}, 'm')
    assert filters.parity_probes(entry) == list(ap.DEFAULT_PROBES)
    skipped = filters.parity_known_answers(probe_result([1]), dict(entry, random_weights=True, name='m'))
    assert not skipped['checked'] and 'random weights' in skipped['notice']
    real = dict(entry, probes=[{'name': 'a', 'prompt': 'a', 'expect': 'never'}])
    checked = filters.parity_known_answers(probe_result([1]), real)
    assert checked['checked'] and checked['missed'] == [{'name': 'a', 'expect': 'never', 'text': ''}]


def _entry(**extra):
    return dict({'repo': 'org/m', 'revision': 'main', 'format': 'safetensors', 'size_bytes': 1, 'shard_count': 1,
                 'quantization': {'method': 'none'},
                 'architecture': {'attention': 'gqa', 'num_attention_heads': 2, 'num_key_value_heads': 1, 'total_params': 1},
                 'engine': 'cpu', 'port': 8001, 'ready_timeout_s': 60, 'serving': {'tensor_parallel_size': 1}}, **extra)


@pytest.mark.parametrize('probes, message', [
    ([{'name': 'Bad', 'prompt': 'x'}], "probes[0].name must be a probe name"),
    ([{'name': 'a', 'prompt': ''}], "probes[0].prompt must be a non-empty string, got ''"),
    ([{'name': 'a', 'prompt': 'x', 'expect': '(unclosed'}], "probes[0].expect must be a regular expression"),
    ([{'name': 'a', 'prompt': 'x'}, {'name': 'a', 'prompt': 'y'}], "probes: the name 'a' is used more than once"),
    ([{'name': 'a', 'prompt': 'x', 'answer': 'y'}], "unknown field probes[0].answer"),
])
def test_bad_probe_definitions_are_refused_naming_the_entry(probes, message):
    errors = catalog.validate({'m': _entry(probes=probes)})
    assert any(e.startswith("model 'm': ") and message in e for e in errors), errors


def test_parity_records_lie_beside_the_pivot_records():
    assert results_paths.parity_record_path('results', 'gpu1', 'm', 'ab12') == 'results/gpu1/parity/m-ab12.json'
    for model, digest in (('org/m', 'ab'), ('m', ''), ('m', '../x')):
        with pytest.raises(ValueError):
            results_paths.parity_record_path('results', 'gpu1', model, digest)


def test_an_expect_pattern_that_would_run_for_ever_is_stopped_and_counted_as_missed():
    """Issue 43: nested repetition takes exponential time on a text it almost matches (~1 s at 25 characters, x3 per
    two more); the search runs in a child process stopped after the limit, so a catalog pattern cannot hang the run
    that holds the host's lock."""
    text = "the capital of france is paris and it is " * 2 + "!"
    probes = [{'name': 'slow', 'prompt': 'x', 'expect': r'^(\w+\s?)+$'}, {'name': 'fine', 'prompt': 'y', 'expect': '(?i)paris'}]
    started = time.monotonic()
    missed = ap.known_answers(probes, [answer('slow', [1], text=text), answer('fine', [2], text=text)], timeout_s=2.0)
    assert time.monotonic() - started < 10
    assert missed == [{'name': 'slow', 'expect': r'^(\w+\s?)+$', 'text': text, 'timed_out': True}]
    # A pattern that ends at once, on any text (a NUL in the pattern, a text with one); a generous limit for a busy box.
    assert ap.bounded_search(r'^(\w+\s?)+$', "short words", 30) is True
    assert ap.bounded_search('a\x00b', 'xa\x00by', 30) is True and ap.bounded_search('paris', 'Lyon', 30) is False
    with pytest.raises(re.error):
        ap.bounded_search('(unclosed', 'text')
