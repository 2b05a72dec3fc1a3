"""vllm_serve_args / systemd quoting / fit_check / disk_plan filters, on the shipped catalog and on bad input."""
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.filter import catalog as catalog_filter
from ansible_collections.llmfleet.vllm.plugins.filter import fit_check as fit_filter
from ansible_collections.llmfleet.vllm.plugins.filter import vllm_serve_args as args_filter

REPO = Path(__file__).resolve().parents[2]
GIB = 1024 ** 3
# 8x RTX PRO 6000 Blackwell, 96 GB each (97887 MiB as nvidia-smi reports), PCIe only: the hand-run host.
BLACKWELL_BOX = {'gpu_count': 8, 'gpu_memory_mib': 97887, 'nvlink': False}


def serve_line(name, profile=None, **extra_serving):
    extra = {name: {'serving': extra_serving}} if extra_serving else None
    entry = catalog_filter.catalog_entry(name, extra, profile)
    return args_filter.systemd_command_line(args_filter.vllm_serve_args(entry['serving']))


@pytest.mark.parametrize('name, profile, expected', [
    ('kimi-k25-int4', None, '--served-model-name kimi-k25-int4 --tensor-parallel-size 8 --trust-remote-code'),
    ('kimi-k25-nvfp4', None,
     '--served-model-name kimi-k25-nvfp4 --tensor-parallel-size 8 --kv-cache-dtype auto --trust-remote-code'),
    ('minimax-m25', None, '--served-model-name minimax-m25 --tensor-parallel-size 4 --trust-remote-code'),
    ('minimax-m25', 'tp8-ep',
     '--served-model-name minimax-m25 --tensor-parallel-size 8 --enable-expert-parallel --trust-remote-code'),
    ('glm5-nvfp4', None,
     '--served-model-name glm5-nvfp4 --tensor-parallel-size 8 --tokenizer zai-org/GLM-5 --trust-remote-code'),
    ('tiny-llama-a', None, '--served-model-name tiny-llama-a --tensor-parallel-size 1 --max-model-len 256 --enforce-eager'),
])
def test_serve_args_for_the_catalog_models(name, profile, expected):
    assert serve_line(name, profile) == expected


def test_every_option_in_stable_order_with_extra_args_last():
    serving = {
        'extra_args': ['--tool-call-parser', 'kimi_k2'], 'enable_prefix_caching': False, 'enforce_eager': True,
        'trust_remote_code': False, 'hf_config_path': 'cfg', 'tokenizer': 'tok', 'dtype': 'bfloat16',
        'kv_cache_dtype': 'fp8', 'max_num_batched_tokens': 8192, 'max_num_seqs': 64, 'max_model_len': 131072,
        'gpu_memory_utilization': 0.92, 'enable_expert_parallel': True, 'data_parallel_size': 2,
        'pipeline_parallel_size': 1, 'tensor_parallel_size': 4, 'served_model_name': ['a', 'b'], 'environment': {'X': 1},
    }
    assert args_filter.vllm_serve_args(serving) == [
        '--served-model-name', 'a', 'b', '--tensor-parallel-size', '4', '--pipeline-parallel-size', '1',
        '--data-parallel-size', '2', '--enable-expert-parallel', '--gpu-memory-utilization', '0.92',
        '--max-model-len', '131072', '--max-num-seqs', '64', '--max-num-batched-tokens', '8192',
        '--kv-cache-dtype', 'fp8', '--dtype', 'bfloat16', '--tokenizer', 'tok', '--hf-config-path', 'cfg',
        '--enforce-eager', '--no-enable-prefix-caching', '--tool-call-parser', 'kimi_k2']


def test_null_options_are_left_to_vllm_defaults():
    assert args_filter.vllm_serve_args({'tensor_parallel_size': 2, 'max_model_len': None, 'enable_prefix_caching': True}) == [
        '--tensor-parallel-size', '2', '--enable-prefix-caching']


@pytest.mark.parametrize('serving, message', [
    ({'tensor_parallel_size': 1, 'extra_args': ['--api-key', 'secret']}, '--api-key must not be passed on the command line'),
    ({'tensor_parallel_size': 1, 'extra_args': ['--api-key=secret']}, '--api-key must not be passed on the command line'),
    ({'tensor_parallel_size': 1, 'tp': 8}, 'unknown serving option(s) tp (allowed:'),
    (['--tensor-parallel-size', '8'], 'serving must be a mapping, got list'),
])
def test_serve_args_rejects_bad_input(serving, message):
    with pytest.raises(AnsibleFilterError) as err:
        args_filter.vllm_serve_args(serving)
    assert message in str(err.value)


def test_api_key_in_catalog_extra_args_is_refused_end_to_end():
    with pytest.raises(AnsibleFilterError, match='--api-key must not be passed'):
        serve_line('tiny-llama-a', extra_args=['--api-key', 'x'])


@pytest.mark.parametrize('token, quoted', [
    ('plain/path-1.0', 'plain/path-1.0'),
    ('50%', '"50%%"'),
    ('$HOME', '"$$HOME"'),
    ('two words', '"two words"'),
    ('{"method": "ngram"}', '"{\\"method\\": \\"ngram\\"}"'),
    ("it's", '"it\'s"'),
    ('back\\slash', '"back\\\\slash"'),
    ('', '""'),
])
def test_systemd_quoting(token, quoted):
    assert args_filter.systemd_command_line([token]) == quoted


def test_option_per_line_continues_lines_for_readable_diffs():
    line = args_filter.systemd_command_line(['/opt/vllm/bin/vllm', 'serve', '/m', '--port', '8000', '--trust-remote-code'],
                                            option_per_line=True)
    assert line == '/opt/vllm/bin/vllm serve /m \\\n    --port 8000 \\\n    --trust-remote-code'


def test_systemd_command_line_wants_a_list():
    with pytest.raises(AnsibleFilterError, match='expects a list'):
        args_filter.systemd_command_line('--port 8000')


def test_env_file_is_sorted_quoted_and_drops_nulls():
    body = args_filter.systemd_env_file({'NCCL_PROTO': 'LL', 'A_FLAG': True, 'GONE': None, 'VLLM_API_KEY': 'k"$`\\y',
                                         'VLLM_CPU_KVCACHE_SPACE': 1})
    assert body == ('A_FLAG="1"\nNCCL_PROTO="LL"\nVLLM_API_KEY="k\\"\\$\\`\\\\y"\nVLLM_CPU_KVCACHE_SPACE="1"\n')


@pytest.mark.parametrize('env, message', [({'1BAD': 'x'}, 'must match'), (['A=1'], 'expects a mapping')])
def test_env_file_rejects_bad_input(env, message):
    with pytest.raises(AnsibleFilterError, match=message):
        args_filter.systemd_env_file(env)


# --- fit_check -----------------------------------------------------------------------------------------------------

def fit(name, gpus=None, tp=None, profile=None, **override):
    entry = catalog_filter.catalog_entry(name, {name: override} if override else None, profile)
    return fit_filter.fit_check(entry, BLACKWELL_BOX if gpus is None else gpus, tp)


def test_the_hand_run_deployments_fit_the_blackwell_box():
    kimi = fit('kimi-k25-int4')
    assert kimi['ok'] and kimi['errors'] == []
    assert kimi['weights_per_gpu_bytes'] == 547 * GIB // 8
    assert any('MLA model with tensor parallelism 8 over PCIe-only GPUs' in w for w in kimi['warnings'])
    minimax = fit('minimax-m25')
    assert minimax == dict(minimax, ok=True, errors=[], warnings=[], gpus_needed=4)
    assert fit('minimax-m25', profile='tp8-ep')['ok']


def test_gpu_facts_module_shape_is_accepted():
    facts = {'source': 'nvml', 'gpu_count': 8, 'topology': {'nvlink': False, 'interconnect': 'pcie'},
             'gpus': [{'index': i, 'memory_total_mib': 97887 if i else 24576} for i in range(8)]}
    result = fit('minimax-m25', facts)  # the smallest GPU (24 GiB) decides: 54 GiB of weights per GPU do not fit
    assert not result['ok'] and any('only 21.6 GiB usable per GPU' in e for e in result['errors'])
    facts['gpus'][0]['memory_total_mib'] = 97887
    assert fit('minimax-m25', facts)['ok']


def test_nvlink_silences_the_mla_pcie_warning():
    result = fit('kimi-k25-int4', dict(BLACKWELL_BOX, nvlink=True))
    assert result['ok'] and not any('PCIe' in w for w in result['warnings'])


def test_weights_that_do_not_fit_are_an_error():
    result = fit('kimi-k25-int4', tp=4)  # 137 GiB per GPU on 96 GB cards
    assert not result['ok']
    assert any('weights need 136.8 GiB per GPU at TP 4 x PP 1, only 86.0 GiB usable per GPU' in e for e in result['errors'])


def test_little_kv_headroom_is_a_warning():
    result = fit('kimi-k25-int4', serving={'gpu_memory_utilization': 0.75})
    assert result['ok'] and any('left for KV cache' in w for w in result['warnings'])


def test_too_few_gpus():
    result = fit('minimax-m25', dict(BLACKWELL_BOX, gpu_count=2))
    assert not result['ok'] and 'minimax-m25: needs 4 GPUs (TP 4 x PP 1 x DP 1), host has 2' in result['errors']


def test_tp_must_divide_attention_heads():
    result = fit('minimax-m25', tp=5)
    assert any('tensor_parallel_size 5 does not divide num_attention_heads 48' in e for e in result['errors'])


def test_tp_must_divide_kv_heads():
    result = fit('minimax-m25', tp=6)  # divides 48 heads but not 8 KV heads
    assert result['errors'] == ['minimax-m25: tensor_parallel_size 6 does not divide num_key_value_heads 8;'
                                ' vLLM cannot split the KV heads evenly']


def test_kv_heads_replicate_when_tp_exceeds_them():
    result = fit('minimax-m25', dict(BLACKWELL_BOX, gpu_count=16), tp=16)
    assert result['ok']
    assert any('vLLM replicates each KV head on 2 GPUs' in w for w in result['warnings'])
    tiny = fit('tiny-llama-a', tp=4)  # 4 heads, 2 KV heads: replicated twice
    assert tiny['ok'] and any('replicates each KV head on 2 GPUs' in w for w in tiny['warnings'])
    assert not fit('tiny-llama-a', tp=3)['ok']


def test_mla_skips_the_kv_head_split():
    result = fit('kimi-k25-int4', dict(BLACKWELL_BOX, gpu_count=16, gpu_memory_mib=200000), tp=16)
    assert result['ok'], result['errors']


def test_unknown_architecture_and_size_warn_instead_of_guessing():
    result = fit('glm5-nvfp4')
    assert result['ok']
    assert {w.split(': ', 1)[1].split(',')[0] for w in result['warnings']} >= {
        'num_attention_heads unknown', 'size_bytes unknown'}


def test_cpu_models_skip_gpu_checks():
    result = fit('tiny-llama-a', {})
    assert result['ok'] and result['gpus_needed'] == 0


@pytest.mark.parametrize('gpus, message', [
    ({'gpu_count': 'eight', 'gpu_memory_mib': 97887}, "host gpu_count must be a non-negative integer, got 'eight'"),
    ({'gpu_count': 8, 'gpu_memory_mib': 0}, 'host gpu_memory_mib must be a positive number, got 0'),
    ({'gpu_count': 8}, 'host gpu_memory_mib must be a positive number, got None'),
])
def test_fit_check_bad_gpu_facts(gpus, message):
    result = fit('minimax-m25', gpus)
    assert not result['ok'] and any(message in e for e in result['errors'])


def test_fit_check_bad_arguments():
    with pytest.raises(AnsibleFilterError, match='expects a catalog entry'):
        fit_filter.fit_check({'name': 'x'}, BLACKWELL_BOX)
    with pytest.raises(AnsibleFilterError, match='expects GPU facts'):
        fit_filter.fit_check(catalog_filter.catalog_entry('minimax-m25'), [8])
    assert not fit('minimax-m25', tp=-1)['ok']


# --- disk_plan -----------------------------------------------------------------------------------------------------

# The seed 003 pivot: /shared 1.7 TB with MiniMax (215 GiB, serving) and Kimi NVFP4 (540 GiB) on it.
SHARED_FREE = 1700 * 10 ** 9 - 755 * GIB
CANDIDATES = [{'path': '/shared/models/kimi-k25-nvfp4', 'size_bytes': 540 * GIB},
              {'path': '/shared/models/minimax-m25', 'size_bytes': 215 * GIB}]


def test_disk_plan_seed_pivot_needed_no_pruning():
    # Seed 003 deleted the NVFP4 model first; by its own figures the INT4 download fitted anyway.
    entry = catalog_filter.catalog_entry('kimi-k25-int4')
    plan = fit_filter.disk_plan(entry, SHARED_FREE, candidates=CANDIDATES, protect=['/shared/models/minimax-m25'])
    assert plan['ok'] and plan['prune'] == [] and plan['short_by_bytes'] == 0


def test_disk_plan_tight_disk_prunes_nvfp4_never_the_serving_model():
    entry = catalog_filter.catalog_entry('kimi-k25-int4')
    plan = fit_filter.disk_plan(entry, 300 * GIB, candidates=list(reversed(CANDIDATES)), protect=['/shared/models/minimax-m25'])
    assert not plan['ok'] and plan['short_by_bytes'] == 547 * GIB + int(547 * GIB * 0.05) - 300 * GIB
    assert plan['prune'] == ['/shared/models/kimi-k25-nvfp4'] and plan['ok_after_prune']
    assert plan['margin_bytes'] == int(547 * GIB * 0.05)


def test_disk_plan_fits_without_pruning_and_counts_a_partial_download():
    plan = fit_filter.disk_plan(100 * GIB, 60 * GIB, downloaded_bytes=70 * GIB, candidates=CANDIDATES)
    assert plan['ok'] and plan['to_download_bytes'] == 30 * GIB and plan['prune'] == []
    assert plan['required_free_bytes'] == 40 * GIB  # 30 GiB + the 10 GiB minimum margin


def test_disk_plan_reports_when_even_pruning_is_not_enough():
    plan = fit_filter.disk_plan(2000 * GIB, 100 * GIB, candidates=CANDIDATES, protect=['/shared/models/minimax-m25/'])
    assert not plan['ok'] and not plan['ok_after_prune']
    assert plan['prune'] == ['/shared/models/kimi-k25-nvfp4']
    assert 'pruning every allowed candidate frees only 540.0 GiB' in plan['errors'][0]


def test_disk_plan_nothing_to_download_needs_no_space():
    # A re-run for a model already on a nearly full disk writes nothing: no margin is asked for.
    plan = fit_filter.disk_plan(100 * GIB, 1, downloaded_bytes=100 * GIB)
    assert plan['ok'] and plan['required_free_bytes'] == 0 and plan['prune'] == []


def test_gpu_memory_free_on_an_8_gpu_box():
    entry = catalog_filter.catalog_entry('minimax-m25')  # TP 4, default gpu_memory_utilization 0.9
    gpus = [{'index': i, 'memory_total_mib': 97887, 'memory_used_mib': 0} for i in range(8)]
    assert fit_filter.gpu_memory_free(entry, {'gpus': gpus})['ok']
    gpus[2]['memory_used_mib'] = 40000  # a process another user left on GPU 2
    check = fit_filter.gpu_memory_free(entry, {'gpus': gpus})
    assert not check['ok'] and len(check['errors']) == 1 and check['errors'][0].startswith('GPU 2 has 57887 MiB free')
    assert [c['index'] for c in check['checked']] == [0, 1, 2, 3]
    assert fit_filter.gpu_memory_free(entry, {'gpus': gpus}, [4, 5, 6, 7])['ok']  # other GPUs assigned
    assert fit_filter.gpu_memory_free(entry, {'gpus': gpus[:2]})['errors'][-1] == 'GPU 3 is not on this host'
    with pytest.raises(AnsibleFilterError, match='llmfleet_gpu fact'):
        fit_filter.gpu_memory_free(entry, None)


def test_disk_plan_bad_input():
    assert fit_filter.disk_plan(-1, 10)['errors'] == ['needed_bytes must be a non-negative integer number of bytes, got -1']
    assert 'candidates[0] must be {path: str, size_bytes: int >= 0}' in fit_filter.disk_plan(1, 10, candidates=['/x'])['errors'][0]
    with pytest.raises(AnsibleFilterError, match='model glm5-nvfp4: size_bytes unknown'):
        fit_filter.disk_plan(catalog_filter.catalog_entry('glm5-nvfp4'), 10)


# --- docs ----------------------------------------------------------------------------------------------------------

FILTERS = ('catalog_entry', 'catalog_models', 'catalog_validate', 'vllm_serve_args', 'systemd_command_line',
           'systemd_env_file', 'fit_check', 'disk_plan')


def test_every_filter_is_documented_for_ansible_doc():
    out = subprocess.run([str(Path(sys.executable).parent / 'ansible-doc'), '-t', 'filter', '--json']
                         + ['llmfleet.vllm.' + f for f in FILTERS], cwd=REPO, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    for name in FILTERS:
        assert '"llmfleet.vllm.%s"' % name in out.stdout
    assert '[WARNING]' not in out.stderr, out.stderr
