"""vllm_serve_args / systemd quoting / fit_check / disk_plan filters, on the shipped catalog and on bad input."""
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.filter import catalog as catalog_filter
from ansible_collections.llmfleet.vllm.plugins.filter import fit_check as fit_filter
from ansible_collections.llmfleet.vllm.plugins.filter import script_json as script_json_filter
from ansible_collections.llmfleet.vllm.plugins.filter import throughput_gate as gate_filter
from ansible_collections.llmfleet.vllm.plugins.filter import vllm_serve_args as args_filter

REPO = Path(__file__).resolve().parents[4]
GIB = 1024 ** 3
# 8x RTX PRO 6000 Blackwell, 96 GB each (97887 MiB as nvidia-smi reports), PCIe only: the hand-run host.
BLACKWELL_BOX = {'gpu_count': 8, 'gpu_memory_mib': 97887, 'nvlink': False}


def serve_line(name, profile=None, **extra_serving):
    extra = {name: {'serving': extra_serving}} if extra_serving else None
    entry = catalog_filter.catalog_entry(name, extra, profile)
    return args_filter.systemd_command_line(args_filter.vllm_serve_args(entry['serving']))


KIMI_AGENT = ('--trust-remote-code --mm-encoder-tp-mode data --tool-call-parser kimi_k2 --enable-auto-tool-choice'
              ' --reasoning-parser kimi_k2 --override-generation-config "{\\"temperature\\":1.0,\\"top_p\\":0.95}"')
MINIMAX_AGENT = ('--max-model-len 196608 --trust-remote-code --compilation-config "{\\"cudagraph_mode\\":\\"PIECEWISE\\"}"'
                 ' --tool-call-parser minimax_m2 --enable-auto-tool-choice --reasoning-parser minimax_m2'
                 ' --override-generation-config "{\\"temperature\\":1.0,\\"top_k\\":40,\\"top_p\\":0.95}"')
GLM_AGENT = ('--trust-remote-code --tool-call-parser glm47 --enable-auto-tool-choice --reasoning-parser glm45'
             ' --chat-template-content-format string')


TINY = ('--served-model-name tiny-llama-a --tensor-parallel-size 1 --distributed-executor-backend uni'
        ' --kv-cache-memory-bytes 67108864 --max-model-len 256 --dtype float32 --enforce-eager')
# Every catalog entry and profile (the test below checks none is missing), as ExecStart= shows it.
SERVE_LINES = [
    ('kimi-k25-int4', None, '--served-model-name kimi-k25-int4 --tensor-parallel-size 8 --gpu-memory-utilization 0.93'
                            ' --max-model-len 128000 ' + KIMI_AGENT),
    ('kimi-k25-int4', 'sm120-pcie',
     '--served-model-name kimi-k25-int4 --tensor-parallel-size 8 --decode-context-parallel-size 8 --gpu-memory-utilization 0.93'
     ' --max-model-len 262144 --max-num-batched-tokens 4096 --kv-cache-dtype fp8 --trust-remote-code --enable-prefix-caching'
     ' --enable-chunked-prefill --async-scheduling --attention-backend TRITON_MLA --mm-encoder-tp-mode data'
     ' --tool-call-parser kimi_k2 --enable-auto-tool-choice --reasoning-parser kimi_k2'
     ' --override-generation-config "{\\"temperature\\":1.0,\\"top_p\\":0.95}"'),
    ('kimi-k25-int4', 'h200-nvlink',
     '--served-model-name kimi-k25-int4 --tensor-parallel-size 8 --max-model-len 262144 --trust-remote-code'
     ' --mm-encoder-tp-mode data --compilation-config "{\\"pass_config\\":{\\"fuse_allreduce_rms\\":true}}"'
     ' --tool-call-parser kimi_k2 --enable-auto-tool-choice --reasoning-parser kimi_k2'
     ' --override-generation-config "{\\"temperature\\":1.0,\\"top_p\\":0.95}"'),
    ('kimi-k25-nvfp4', None,
     '--served-model-name kimi-k25-nvfp4 --tensor-parallel-size 8 --max-model-len 128000 --kv-cache-dtype auto ' + KIMI_AGENT),
    ('kimi-k25-nvfp4', 'b200-nvlink',
     '--served-model-name kimi-k25-nvfp4 --tensor-parallel-size 8 --max-model-len 262144 --kv-cache-dtype fp8 ' + KIMI_AGENT),
    ('minimax-m25', None, '--served-model-name minimax-m25 --tensor-parallel-size 4 ' + MINIMAX_AGENT),
    ('minimax-m25', 'tp8-ep', '--served-model-name minimax-m25 --tensor-parallel-size 8 --enable-expert-parallel ' + MINIMAX_AGENT),
    ('glm5-fp8', None, '--served-model-name glm5-fp8 --tensor-parallel-size 8 ' + GLM_AGENT),
    ('glm5-fp8', 'mtp', '--served-model-name glm5-fp8 --tensor-parallel-size 8 --trust-remote-code'
                        ' --speculative-config "{\\"method\\":\\"mtp\\",\\"num_speculative_tokens\\":3}" --tool-call-parser glm47'
                        ' --enable-auto-tool-choice --reasoning-parser glm45 --chat-template-content-format string'),
    ('glm5-nvfp4', None, '--served-model-name glm5-nvfp4 --tensor-parallel-size 8 --kv-cache-dtype fp8 ' + GLM_AGENT),
    ('tiny-llama-a', None, TINY),
    ('tiny-llama-a', 'tools', TINY + ' --tool-call-parser hermes --enable-auto-tool-choice'),
    ('tiny-llama-b', 'tools', TINY.replace('tiny-llama-a', 'tiny-llama-b') + ' --tool-call-parser hermes --enable-auto-tool-choice'),
]


@pytest.mark.parametrize('name, profile, expected', SERVE_LINES)
def test_serve_args_for_the_catalog_models(name, profile, expected):
    assert serve_line(name, profile) == expected


def test_every_catalog_entry_and_profile_is_covered_above():
    covered = {(name, profile) for name, profile, _line in SERVE_LINES}
    catalog = catalog_filter.catalog_models()
    wanted = {(name, profile) for name, entry in catalog.items() for profile in [None] + sorted(entry.get('profiles', {}))}
    assert wanted - covered <= {('tiny-llama-b', None)}, wanted - covered


def test_every_option_in_stable_order_with_extra_args_last():
    serving = {
        'override_generation_config': {'top_p': 0.95, 'temperature': 0.6}, 'generation_config': 'vllm',
        'chat_template_content_format': 'string', 'chat_template': '/srv/templates/tool chat.jinja', 'reasoning_parser': 'glm45',
        'enable_auto_tool_choice': True, 'tool_call_parser': 'glm47',
        'speculative_config': {'num_speculative_tokens': 3, 'method': 'mtp'}, 'compilation_config': {'cudagraph_mode': 'PIECEWISE'},
        'mm_encoder_tp_mode': 'data', 'attention_backend': 'TRITON_MLA', 'async_scheduling': False, 'enable_chunked_prefill': True,
        'decode_context_parallel_size': 2,
        'extra_args': ['--max-log-len', '100'], 'enable_prefix_caching': False, 'enforce_eager': True,
        'trust_remote_code': False, 'hf_config_path': 'cfg', 'tokenizer': 'tok', 'dtype': 'bfloat16',
        'model_loader_extra_config': {'concurrency': 16}, 'load_format': 'runai_streamer',
        'kv_cache_dtype': 'fp8', 'max_num_batched_tokens': 8192, 'max_num_seqs': 64, 'max_model_len': 131072,
        'gpu_memory_utilization': 0.92, 'kv_cache_memory_bytes': 2**33, 'enable_expert_parallel': True, 'data_parallel_size': 2,
        'pipeline_parallel_size': 1, 'distributed_executor_backend': 'mp', 'tensor_parallel_size': 4, 'served_model_name': ['a', 'b'], 'environment': {'X': 1},
    }
    assert args_filter.vllm_serve_args(serving) == [
        '--served-model-name', 'a', 'b', '--tensor-parallel-size', '4', '--pipeline-parallel-size', '1',
        '--data-parallel-size', '2', '--distributed-executor-backend', 'mp', '--decode-context-parallel-size', '2', '--enable-expert-parallel',
        '--gpu-memory-utilization', '0.92', '--kv-cache-memory-bytes', '8589934592',
        '--max-model-len', '131072', '--max-num-seqs', '64', '--max-num-batched-tokens', '8192',
        '--kv-cache-dtype', 'fp8', '--dtype', 'bfloat16', '--load-format', 'runai_streamer',
        '--model-loader-extra-config', '{"concurrency":16}', '--tokenizer', 'tok', '--hf-config-path', 'cfg',
        '--enforce-eager', '--no-enable-prefix-caching', '--enable-chunked-prefill', '--no-async-scheduling',
        '--attention-backend', 'TRITON_MLA', '--mm-encoder-tp-mode', 'data',
        '--compilation-config', '{"cudagraph_mode":"PIECEWISE"}', '--speculative-config', '{"method":"mtp","num_speculative_tokens":3}',
        '--tool-call-parser', 'glm47', '--enable-auto-tool-choice', '--reasoning-parser', 'glm45',
        '--chat-template', '/srv/templates/tool chat.jinja', '--chat-template-content-format', 'string',
        '--generation-config', 'vllm', '--override-generation-config', '{"temperature":0.6,"top_p":0.95}',
        '--max-log-len', '100']


def test_null_options_are_left_to_vllm_defaults():
    assert args_filter.vllm_serve_args({'tensor_parallel_size': 2, 'max_model_len': None, 'enable_prefix_caching': True,
                                        'override_generation_config': None, 'enable_auto_tool_choice': False,
                                        'async_scheduling': None}) == [
        '--tensor-parallel-size', '2', '--enable-prefix-caching']


def test_json_options_are_one_deterministic_argument():
    first = args_filter.vllm_serve_args({'tensor_parallel_size': 1, 'compilation_config': {'b': [1, 2], 'a': {'y': 1, 'x': None}}})
    second = args_filter.vllm_serve_args({'compilation_config': {'a': {'x': None, 'y': 1}, 'b': [1, 2]}, 'tensor_parallel_size': 1})
    assert first == second == ['--tensor-parallel-size', '1', '--compilation-config', '{"a":{"x":null,"y":1},"b":[1,2]}']
    # systemd keeps it one argument: quoted, inner quotes escaped, '%' doubled
    assert args_filter.systemd_command_line(['{"a":"50%"}']) == '"{\\"a\\":\\"50%%\\"}"'


@pytest.mark.parametrize('serving, message', [
    ({'tensor_parallel_size': 1, 'extra_args': ['--api-key', 'secret']}, '--api-key must not be passed on the command line'),
    ({'tensor_parallel_size': 1, 'extra_args': ['--api-key=secret']}, '--api-key must not be passed on the command line'),
    ({'tensor_parallel_size': 1, 'tp': 8}, 'unknown serving option(s) tp (allowed:'),
    ({'tensor_parallel_size': 1, 'override_generation_config': 'temperature=0.6'},
     "serving option override_generation_config must be a mapping (rendered as JSON), got 'temperature=0.6'"),
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
    assert any('weights need 136.8 GiB per GPU at TP 4 x PP 1, only 88.9 GiB usable per GPU (97887 MiB x 0.93)' in e
               for e in result['errors'])


def test_little_kv_headroom_is_a_warning():
    result = fit('kimi-k25-int4', serving={'gpu_memory_utilization': 0.75, 'max_model_len': 32768})
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
    result = fit('minimax-m25', dict(BLACKWELL_BOX, gpu_count=16), tp=16, profile='tp8-ep')  # EP: experts stay whole
    assert result['ok']
    assert any('vLLM replicates each KV head on 2 GPUs' in w for w in result['warnings'])
    tiny = fit('tiny-llama-a', tp=4)  # 4 heads, 2 KV heads: replicated twice
    assert tiny['ok'] and any('replicates each KV head on 2 GPUs' in w for w in tiny['warnings'])
    assert not fit('tiny-llama-a', tp=3)['ok']


def test_mla_skips_the_kv_head_split():
    result = fit('kimi-k25-int4', dict(BLACKWELL_BOX, gpu_count=16, gpu_memory_mib=200000), tp=16)
    assert result['ok'], result['errors']


def test_unknown_architecture_and_size_warn_instead_of_guessing():
    result = fit('glm5-nvfp4', architecture={'num_attention_heads': None})
    assert result['ok']
    assert {w.split(': ', 1)[1].split(',')[0] for w in result['warnings']} >= {
        'num_attention_heads unknown', 'size_bytes unknown', 'GPU compute capability unknown'}
    kv = fit('minimax-m25', architecture={'head_dim': None})
    assert kv['ok'] and any('KV-cache size per token unknown (architecture: head_dim)' in w for w in kv['warnings'])


# --- fit rules from the seeds, the recipes and vLLM ------------------------------------------------------------------

H200_BOX = {'gpu_count': 8, 'gpu_memory_mib': 143771, 'nvlink': True, 'compute_capability': '9.0'}
H100_BOX = {'gpu_count': 8, 'gpu_memory_mib': 81559, 'nvlink': True, 'compute_capability': '9.0'}
SM120 = dict(BLACKWELL_BOX, compute_capability='12.0')


def test_minimax_pure_tp8_is_refused_with_the_fp8_block_reason():
    result = fit('minimax-m25', tp=8)
    assert not result['ok']
    assert result['errors'] == [
        "minimax-m25: tensor_parallel_size 8 splits each expert's 1536-wide projection into 192-wide shards, not a multiple"
        ' of the fp8 weight block [128, 128]: vLLM refuses to load the weights. Use expert parallelism'
        ' (enable_expert_parallel: true keeps experts whole) or tensor_parallel_size 4 (384-wide shards)']
    assert fit('minimax-m25', profile='tp8-ep')['ok']  # TP 8 + EP: the seed 002 setup
    assert fit('minimax-m25')['ok']  # TP 4: 384 = 3 x 128


@pytest.mark.parametrize('quantization, tp, ok', [
    ({'group_size': 512}, 8, False),  # 2048 / 8 = 256, not a multiple of a 512 group
    ({'group_size': 32}, 8, True),  # the real checkpoint: 256 = 8 x 32
    ({'group_size': None, 'weight_block_size': [128, 64]}, 8, True),
    ({'group_size': None, 'weight_block_size': [128]}, 32, False),  # 64-wide shards
    ({'group_size': None}, 8, True),  # no block known: nothing to check
])
def test_moe_shard_rule_is_general(quantization, tp, ok):
    gpus = dict(BLACKWELL_BOX, gpu_count=64, gpu_memory_mib=200000)
    result = fit('kimi-k25-int4', gpus, tp=tp, quantization=quantization)
    assert any('-wide shards' in e for e in result['errors']) is not ok, result['errors']
    if not ok:  # expert parallelism lifts it
        lifted = fit('kimi-k25-int4', gpus, tp=tp, quantization=quantization, serving={'enable_expert_parallel': True})
        assert not any('-wide shards' in e for e in lifted['errors'])


def test_decode_context_parallel_must_divide_tp():
    result = fit('kimi-k25-int4', dict(BLACKWELL_BOX, gpu_memory_mib=200000), tp=4, profile='sm120-pcie')
    assert result['errors'] == [
        'kimi-k25-int4: decode_context_parallel_size 8 must divide tensor_parallel_size 4 (vLLM refuses to start)']


def test_kv_cache_per_token_and_per_sequence():
    kimi = fit('kimi-k25-int4')  # MLA: (512 + 64) x 2 bytes x 61 layers on every TP rank
    assert kimi['kv_bytes_per_token'] == 576 * 2 * 61 and kimi['kv_bytes_per_sequence'] == 576 * 2 * 61 * 128000
    assert fit('kimi-k25-int4', profile='sm120-pcie')['kv_bytes_per_token'] == 576 * 61 // 8  # FP8 and DCP 8
    minimax = fit('minimax-m25')  # GQA: K+V x 2 of 8 KV heads per GPU at TP 4 x 128 x 2 bytes x 62 layers
    assert minimax['kv_bytes_per_token'] == 2 * 2 * 128 * 2 * 62
    assert fit('minimax-m25', tp=16, profile='tp8-ep', gpus=dict(BLACKWELL_BOX, gpu_count=16))['kv_bytes_per_token'] == \
        2 * 1 * 128 * 2 * 62  # one (replicated) KV head per GPU
    glm = fit('glm5-nvfp4', H200_BOX, size_bytes=410 * 10 ** 9)  # sparse MLA in FP8: vLLM's packed 656-byte fp8_ds_mla
    assert glm['ok'] and glm['kv_bytes_per_token'] == 656 * 78


def test_max_model_len_that_does_not_fit_the_kv_cache():
    # Kimi INT4 on the seeds' box: 20.5 GiB per GPU left after weights at gpu_memory_utilization 0.93
    assert not fit('kimi-k25-int4')['warnings'][:-1]  # only the PCIe warning
    full = fit('kimi-k25-int4', serving={'max_model_len': 262144})
    assert full['ok'] and any('one sequence of max_model_len 262144 needs 17.2 GiB of KV cache per GPU' in w and '84%' in w
                              for w in full['warnings'])
    over = fit('kimi-k25-int4', serving={'max_model_len': 400000})
    assert not over['ok'] and any('only 20.5 GiB per GPU is left after weights, before activations: vLLM refuses to start'
                                  in e for e in over['errors'])
    assert fit('kimi-k25-int4', serving={'max_model_len': None})['kv_bytes_per_sequence'] == 576 * 2 * 61 * 262144
    # H200: the full context fits (profile h200-nvlink)
    h200 = fit('kimi-k25-int4', H200_BOX, profile='h200-nvlink')
    assert h200['ok'] and h200['warnings'] == []


def test_recipe_vram_minimum():
    kimi = fit('kimi-k25-int4', H100_BOX)  # 8 x 80 GB = 684 GB < 714 GB (recipe)
    assert not kimi['ok'] and any('its recipe needs at least 714 GB of GPU memory in all; the 8 GPUs it gets have 684 GB'
                                  in e for e in kimi['errors'])
    glm = fit('glm5-fp8', SM120)  # 8 x 96 GB = 821 GB < 893 GB
    assert any('its recipe needs at least 893 GB' in e for e in glm['errors'])
    assert fit('glm5-fp8', H200_BOX)['ok']


@pytest.mark.parametrize('name', ['glm5-fp8', 'glm5-nvfp4'])
def test_glm5_is_refused_on_sm120_with_the_reason(name):
    result = fit(name, SM120)
    assert not result['ok']
    reason = [e for e in result['errors'] if 'sparse-MLA' in e]
    expected = ('%s: sparse-MLA model (DeepSeek sparse attention) on compute capability 12.0: stock vLLM has no'
                ' sparse-MLA backend' % name)
    assert len(reason) == 1 and reason[0].startswith(expected)
    assert 'FLASHINFER_MLA_SPARSE_SM120' in reason[0] and 'livelock' in reason[0]
    # the gpu_facts module's shape: compute_capability per GPU
    facts = {'gpu_count': 8, 'topology': {'nvlink': False},
             'gpus': [{'index': i, 'memory_total_mib': 97887, 'compute_capability': '12.0'} for i in range(8)]}
    assert any('sparse-MLA' in e for e in fit(name, facts)['errors'])
    assert not any('sparse-MLA' in e for e in fit(name, H200_BOX)['errors'])
    assert not any('sparse-MLA' in e for e in fit(name, dict(H200_BOX, compute_capability='10.0'))['errors'])
    ada = fit(name, dict(H200_BOX, compute_capability=['8.9']))
    assert any('has sparse-MLA backends for compute capability 9.x (Hopper) and 10.x (B200/GB200) only' in e
               for e in ada['errors'])


def test_sm120_rule_only_hits_sparse_models():
    for name in ('kimi-k25-int4', 'minimax-m25'):
        assert fit(name, SM120)['ok']
    warning = fit('kimi-k25-int4', SM120, profile='sm120-pcie')['warnings']
    assert any('FP8 KV cache for an MLA model on compute capability 12.0' in w for w in warning)


def test_bad_compute_capability():
    result = fit('minimax-m25', dict(BLACKWELL_BOX, compute_capability='sm120'))
    assert not result['ok'] and "host compute_capability must be \"MAJOR.MINOR\" (e.g. \"12.0\"), got ['sm120']" \
        in result['errors'][0]


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


def test_gpu_memory_free_checks_every_gpu_of_a_data_parallel_server():
    """TP 4 x DP 2 takes GPUs 0-7: a process on GPU 6 stops it (the check counted TP x PP only, GPUs 0-3)."""
    entry = catalog_filter.catalog_entry('minimax-m25', {'minimax-m25': {'serving': {'data_parallel_size': 2}}})
    assert catalog_filter.gpus_needed(entry) == 8
    gpus = [{'index': i, 'memory_total_mib': 97887, 'memory_used_mib': 40000 if i == 6 else 0} for i in range(8)]
    check = fit_filter.gpu_memory_free(entry, {'gpus': gpus})
    assert [c['index'] for c in check['checked']] == list(range(8))
    assert not check['ok'] and check['errors'][0].startswith('GPU 6 has 57887 MiB free'), check
    assert fit_filter.fit_check(entry, {'gpu_count': 8, 'gpu_memory_mib': 97887})['gpus_needed'] == 8
    with pytest.raises(AnsibleFilterError, match='expects a catalog entry'):
        catalog_filter.gpus_needed('minimax-m25')


def test_disk_plan_bad_input():
    assert fit_filter.disk_plan(-1, 10)['errors'] == ['needed_bytes must be a non-negative integer number of bytes, got -1']
    assert 'candidates[0] must be {path: str, size_bytes: int >= 0}' in fit_filter.disk_plan(1, 10, candidates=['/x'])['errors'][0]
    with pytest.raises(AnsibleFilterError, match='model glm5-nvfp4: size_bytes unknown'):
        fit_filter.disk_plan(catalog_filter.catalog_entry('glm5-nvfp4'), 10)


# --- prune: the models root compared normalised, oldest first (issue #27 item 7) ------------------------------------

@pytest.mark.parametrize('root', ['/srv/models', '/srv/models/', '/srv//models/', '/srv/models/.'])
def test_disk_plan_protects_kept_and_served_dirs_whatever_the_root_is_spelled(root):
    """pivot_models_root=/srv/models/ made the protected path /srv/models//model-b: another host's model was pruned."""
    candidates = [{'path': '/srv/models/model-a', 'size_bytes': 10 * GIB, 'mtime': 300},
                  {'path': '/srv/models/model-b', 'size_bytes': 10 * GIB, 'mtime': 100},
                  {'path': '/srv/models/model-new/', 'size_bytes': 1 * GIB, 'mtime': 50}]
    plan = fit_filter.disk_plan(30 * GIB, 25 * GIB, candidates=candidates, protect=['/srv/models/model-new'],
                                models_root=root, keep=['model-b'], margin_bytes=0)
    assert plan['prune'] == ['/srv/models/model-a'] and plan['ok_after_prune'], plan


def test_disk_plan_prunes_oldest_first_by_mtime_not_by_name():
    candidates = [{'path': '/m/aaa-new', 'size_bytes': 8 * GIB, 'mtime': 2000.5},
                  {'path': '/m/zz-old', 'size_bytes': 8 * GIB, 'mtime': 1000.25},
                  {'path': '/m/no-mtime', 'size_bytes': 8 * GIB}]
    plan = fit_filter.disk_plan(20 * GIB, 14 * GIB, candidates=candidates, margin_bytes=0)
    assert plan['prune'] == ['/m/zz-old'], plan
    assert fit_filter.disk_plan(40 * GIB, 14 * GIB, candidates=candidates, margin_bytes=0)['prune'] == [
        '/m/zz-old', '/m/aaa-new', '/m/no-mtime']


def test_disk_plan_keep_needs_an_absolute_models_root():
    errors = fit_filter.disk_plan(1, 10, keep=['model-b'])['errors']
    assert errors == ["keep needs models_root: the models root (pivot_models_root) must be an absolute path such as"
                      " /srv/models, got None"]
    assert fit_filter.disk_plan(1, 10, keep=['m'], models_root='srv/models')['errors'][0].endswith("got 'srv/models'")
    assert fit_filter.disk_plan(1, 10, protect=[7])['errors'] == ['protect[0] must be a path, got 7']


@pytest.mark.parametrize('root', ['/srv/models', '/srv/models/', '//srv/models//'])
def test_dir_names_under_lists_the_names_a_serving_record_keeps(root):
    paths = ['/srv/models/b', '/srv/models/a/', '/srv/models/a', '/srv/other/c', '/srv/models', '', None,
             '/srv/models/a/sub', '/srv/models-x/d']
    assert fit_filter.dir_names_under(paths, root) == ['a', 'b']
    with pytest.raises(AnsibleFilterError, match='must be an absolute path'):
        fit_filter.dir_names_under(paths, 'models')
    with pytest.raises(AnsibleFilterError, match='expects a list of paths'):
        fit_filter.dir_names_under('/srv/models/a', root)


def test_models_root_usage_lists_candidates_oldest_first_and_records_by_file(tmp_path):
    """llmfleet.vllm.models_root_usage, run as the pivot runs it (module_utils/models_root.py, as hf_snapshot reads a
    root too): dot dirs and symlinks are no model dirs; a root given with a trailing / reads the same."""
    import json
    import os
    from ansible_collections.llmfleet.vllm.plugins.module_utils import hf_download, models_root
    root = tmp_path / 'models'
    for name, mtime in (('aaa-new', 2000), ('zz-old', 1000), ('mid', 1500)):
        (root / name).mkdir(parents=True)
        (root / name / 'w').write_bytes(b'x' * 4096)
        os.utime(root / name, (mtime, mtime))
    (root / '.llmfleet' / 'serving').mkdir(parents=True)
    (root / '.llmfleet' / 'serving' / 'h1.json').write_text(json.dumps({'host': 'h1', 'dirs': ['mid']}))
    (root / '.llmfleet' / 'serving' / 'h1.ray.json').write_text(json.dumps({'host': 'h1', 'dirs': ['zz-old']}))
    (root / '.llmfleet' / 'serving' / 'h2.json').write_text('not json')
    (root / '.history').mkdir()
    (root / 'link').symlink_to(root / 'mid')
    out = models_root.usage(str(root) + '/')
    assert [c['path'] for c in out['candidates']] == [str(root / n) for n in ('zz-old', 'mid', 'aaa-new')]
    assert [c['mtime'] for c in out['candidates']] == [1000, 1500, 2000]
    assert all(c['size_bytes'] >= 4096 for c in out['candidates'])
    assert out['served_by'] == {'h1': ['mid'], 'h1.ray': ['zz-old']}
    assert out['free_bytes'] > 0 and models_root.usage(str(root / 'not-yet'))['candidates'] == []
    # hf_snapshot's prune candidates are the same dirs but its download target.
    assert hf_download.prune_candidates(str(root), str(root / 'mid')) == [
        c for c in out['candidates'] if c['path'] != str(root / 'mid')]
    module = subprocess.run([sys.executable, '-m', 'ansible_collections.llmfleet.vllm.plugins.modules.models_root_usage',
                             json.dumps({'ANSIBLE_MODULE_ARGS': {'path': str(root)}})], capture_output=True, text=True,
                            check=True, env=dict(os.environ, PYTHONPATH=str(REPO / '.ansible' / 'collections')))
    answer = json.loads(module.stdout)
    assert answer['changed'] is False and answer['served_by'] == out['served_by']
    assert [c['path'] for c in answer['candidates']] == [c['path'] for c in out['candidates']]


# --- where vLLM listens (issue #27 item 10) ------------------------------------------------------------------------

@pytest.mark.parametrize('requested, gateway, api_key, expected', [
    ('', False, False, '127.0.0.1'),   # no gateway, no key: never every interface by default
    (None, False, False, '127.0.0.1'),
    ('', True, False, '127.0.0.1'),    # behind the gateway
    ('', True, True, '127.0.0.1'),
    ('', False, True, '0.0.0.0'),      # a key and no gateway
    ('0.0.0.0', False, False, '0.0.0.0'),  # asked for explicitly
    ('10.1.2.3', True, False, '10.1.2.3'),
    ('::', False, False, '::'),
    ('gpu-01.example.org', False, False, 'gpu-01.example.org'),
])
def test_vllm_bind_host_default_is_loopback_without_a_key(requested, gateway, api_key, expected):
    assert args_filter.vllm_bind_host(requested, gateway=gateway, api_key=api_key) == expected


@pytest.mark.parametrize('bad', ['0.0.0.0\n', '127.0.0.1 --api-key x', 'host;rm', 42, ['0.0.0.0'], '-h'])
def test_vllm_bind_host_refuses_what_is_no_address(bad):
    with pytest.raises(AnsibleFilterError, match=r'^pivot_bind_host must be an IP address .* got '):
        args_filter.vllm_bind_host(bad, variable='pivot_bind_host')


def test_roles_take_the_bind_host_from_the_one_rule():
    """No role or playbook spells the default listen address itself: all go through vllm_bind_host."""
    import re
    files = [REPO / 'roles' / 'pivot' / 'vars' / 'main.yml', REPO / 'roles' / 'service_deploy' / 'vars' / 'main.yml',
             REPO / 'roles' / 'ray_cluster' / 'tasks' / 'validate.yml']
    for path in files:
        text = path.read_text()
        assert 'vllm_bind_host' in text and "'0.0.0.0'" not in text, path
    assert re.search(r'^service_deploy_host: ""$', (REPO / 'roles/service_deploy/defaults/main.yml').read_text(), re.M)
    assert re.search(r'^pivot_bind_host: ""$', (REPO / 'roles/pivot/defaults/main.yml').read_text(), re.M)
    # The Ray cluster's vLLM unit is service_deploy's: its address is service_deploy_host, from ray_cluster_bind_host.
    assert 'service_deploy_host: "{{ ray_cluster_bind_host }}"' in (REPO / 'roles/ray_cluster/tasks/serve_unit.yml').read_text()
    assert re.search(r'^ray_cluster_bind_host: ""$', (REPO / 'roles/ray_cluster/defaults/main.yml').read_text(), re.M)


# --- docs ----------------------------------------------------------------------------------------------------------

FILTERS = ('catalog_entry', 'catalog_models', 'catalog_validate', 'vllm_serve_args', 'systemd_command_line',
           'systemd_env_file', 'fit_check', 'disk_plan', 'dir_names_under', 'vllm_bind_host')


def test_every_filter_is_documented_for_ansible_doc():
    out = subprocess.run([str(Path(sys.executable).parent / 'ansible-doc'), '-t', 'filter', '--json']
                         + ['llmfleet.vllm.' + f for f in FILTERS], cwd=REPO, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    for name in FILTERS:
        assert '"llmfleet.vllm.%s"' % name in out.stdout
    assert '[WARNING]' not in out.stderr, out.stderr


WALL = ("\r\r\nBroadcast message from systemd-journald@host (Thu 2026-12-03 19:04:25 UTC):\r\r\n\r\r\n"
        "haproxy[954]: backend slot_default has no server available!\r\r\n\r\r\n")


@pytest.mark.parametrize("stdout", [
    '{"ready_at": 1.5}\r\n',
    WALL + '{"ready_at": 1.5}\r\n',  # seen: a wall broadcast on the script's terminal before its output
    '{"ready_at": 1.5}\r\n' + WALL,
    '{"ready_at": 0}\n{not json\n{"ready_at": 1.5}\n',
])
def test_script_json_reads_the_last_json_line_around_terminal_noise(stdout):
    assert script_json_filter.script_json(stdout) == {"ready_at": 1.5}


def test_script_json_without_json_fails_or_gives_the_default():
    with pytest.raises(AnsibleFilterError, match="no JSON object in the script output"):
        script_json_filter.script_json(WALL)
    assert script_json_filter.script_json("", {}) == {}


def test_throughput_gate_filter_checks_its_input():
    with pytest.raises(AnsibleFilterError, match="min_ratio must be a number"):
        gate_filter.throughput_gate([], [], "fast")
    with pytest.raises(AnsibleFilterError, match="two lists of throughput_check levels"):
        gate_filter.throughput_gate({"concurrency": 1}, [], 0.8)
    assert gate_filter.throughput_gate([], None, "0.8") == {"min_ratio": 0.8, "levels": [], "below": [], "not_comparable": []}


def test_sleep_ram_fit_needs_the_weights_within_mem_available_minus_the_margin():
    fit = fit_filter.sleep_ram_fit
    meminfo = "MemTotal:       131072000 kB\nMemFree:         1000000 kB\nMemAvailable:   104857600 kB\n"  # 102400 MiB
    # The Llama-3.2-1B of the H200 runs: 3.0 GB of bf16 weights.
    ok = fit(2997 * 1024 ** 2, meminfo, 8192, 'gpuhost-llama1b-a')
    assert ok['ok'] and (ok['weights_mib'], ok['available_mib'], ok['margin_mib']) == (2997, 102400, 8192)
    # MiniMax-M2.5 FP8 (~230 GB) does not fit 100 GiB: refused with the figures.
    short = fit(230 * 10 ** 9, meminfo, 8192, 'minimax-m25')
    assert not short['ok'] and 'its weights need 219346 MiB, MemAvailable is 102400 MiB' in short['message']
    assert '125138 MiB short' in short['message']
    assert not fit(1, "MemTotal: 1 kB\n", 0)['ok']  # no MemAvailable: unknown, refused
