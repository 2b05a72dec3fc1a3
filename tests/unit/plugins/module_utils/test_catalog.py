"""The shipped catalog, its schema check and the user-override merge (module_utils/catalog.py, filter catalog.py)."""
import copy

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.filter import catalog as catalog_filter
from ansible_collections.llmfleet.vllm.plugins.module_utils import catalog

SHIPPED = catalog_filter.load_catalog()
SEEDS = ('kimi-k25-int4', 'kimi-k25-nvfp4', 'minimax-m25', 'glm5-fp8', 'glm5-nvfp4')
SEEDS_BOX = ('kimi-k25-int4', 'kimi-k25-nvfp4', 'minimax-m25')  # default serving = the seeds' PCIe box
TINY = ('tiny-llama-a', 'tiny-llama-b')
GIB = 1024 ** 3


def test_shipped_catalog_is_valid_and_complete():
    assert catalog.validate(SHIPPED) == []
    assert set(SHIPPED) == set(SEEDS + TINY)


def test_seed_facts_from_the_hand_run_notes():
    kimi = SHIPPED['kimi-k25-int4']
    assert kimi['repo'] == 'moonshotai/Kimi-K2.5' and kimi['shard_count'] == 64
    assert kimi['size_bytes'] == 547 * GIB
    assert kimi['quantization'] == {'method': 'compressed-tensors', 'weight_bits': 4, 'group_size': 32,
                                    'symmetric': True, 'kv_cache_scheme': None}
    assert kimi['serving']['tensor_parallel_size'] == 8 and 'kv_cache_dtype' not in kimi['serving']
    minimax = SHIPPED['minimax-m25']
    assert minimax['repo'] == 'MiniMaxAI/MiniMax-M2.5' and minimax['shard_count'] == 126
    assert minimax['quantization']['method'] == 'fp8' and minimax['architecture']['attention'] == 'gqa'
    assert minimax['quantization']['weight_block_size'] == [128, 128]
    assert minimax['architecture']['num_key_value_heads'] == 8 and minimax['architecture']['moe_intermediate_size'] == 1536
    assert minimax['serving']['tensor_parallel_size'] == 4
    assert minimax['profiles']['tp8-ep'] == {'tensor_parallel_size': 8, 'enable_expert_parallel': True}
    assert SHIPPED['kimi-k25-nvfp4']['size_bytes'] == 540 * GIB
    assert SHIPPED['kimi-k25-nvfp4']['architecture']['attention'] == 'mla'
    for name in ('glm5-fp8', 'glm5-nvfp4'):  # the recipe's repos, no GGUF placeholder, no unrecorded engine patch
        glm = SHIPPED[name]
        assert glm['format'] == 'safetensors' and 'patches' not in glm
        assert glm['architecture']['index_topk'] == 2048 and glm['architecture']['attention'] == 'mla'
    assert SHIPPED['glm5-fp8']['repo'] == 'zai-org/GLM-5-FP8' and SHIPPED['glm5-nvfp4']['repo'] == 'nvidia/GLM-5-NVFP4'
    for name in SEEDS:
        assert SHIPPED[name]['engine'] == 'cuda'
    for name in SEEDS_BOX:
        assert SHIPPED[name]['serving']['environment'] == {'NCCL_PROTO': 'LL', 'NCCL_P2P_LEVEL': 'SYS'}
    for name in TINY:
        entry = SHIPPED[name]
        assert entry['engine'] == 'cpu' and entry['repo'] == 'llmfleet-test/' + name
        assert entry['serving'] == {'tensor_parallel_size': 1, 'max_model_len': 256, 'enforce_eager': True,
                                    'kv_cache_memory_bytes': 64 * 2**20, 'dtype': 'float32',
                                    'distributed_executor_backend': 'uni', 'environment': {'VLLM_ENABLE_V1_MULTIPROCESSING': 0}}
        assert entry['profiles'] == {'tools': {'enable_auto_tool_choice': True, 'tool_call_parser': 'hermes'}}
        assert entry['architecture']['num_attention_heads'] // entry['architecture']['num_key_value_heads'] == 2
    # the shapes tools/tinymodels/make_tiny_models.py generates
    assert SHIPPED['tiny-llama-a']['shard_count'] == 4 and SHIPPED['tiny-llama-a']['architecture']['num_attention_heads'] == 4
    assert SHIPPED['tiny-llama-b']['shard_count'] == 3 and SHIPPED['tiny-llama-b']['architecture']['num_hidden_layers'] == 4


def test_unpinned_revisions_are_marked_todo_in_the_yaml():
    with open(catalog_filter.CATALOG_PATH, encoding='utf-8') as handle:
        lines = handle.read().splitlines()
    revisions = [line for line in lines if line.strip().startswith('revision: main')]
    assert len(revisions) == len(SHIPPED)
    assert sum('TODO pin: commit sha not recorded' in line for line in revisions) == len(SEEDS)


def test_get_fills_defaults_and_name():
    entry = catalog.get(SHIPPED, 'minimax-m25')
    assert entry['name'] == 'minimax-m25' and entry['profile'] is None
    assert entry['serving']['served_model_name'] == 'minimax-m25'
    assert entry['serving']['extra_args'] == [] and entry['patches'] == []


def test_profile_is_deep_merged_into_serving():
    entry = catalog.get(SHIPPED, 'minimax-m25', profile='tp8-ep')
    assert entry['serving']['tensor_parallel_size'] == 8 and entry['serving']['enable_expert_parallel'] is True
    assert entry['serving']['environment']['NCCL_PROTO'] == 'LL' and entry['profile'] == 'tp8-ep'


def test_unknown_profile_lists_the_profiles():
    with pytest.raises(catalog.CatalogError, match=r"model 'minimax-m25' has no serving profile 'tp2'; profiles: tp8-ep"):
        catalog.get(SHIPPED, 'minimax-m25', profile='tp2')


def test_unknown_model_lists_valid_names():
    with pytest.raises(catalog.CatalogError) as err:
        catalog.get(SHIPPED, 'kimi-k3')
    assert "unknown model 'kimi-k3'" in str(err.value)
    assert 'glm5-fp8, glm5-nvfp4, kimi-k25-int4, kimi-k25-nvfp4, minimax-m25, tiny-llama-a, tiny-llama-b' in str(err.value)


def test_extra_overrides_deep_merge_serving_and_add_models():
    extra = {
        'kimi-k25-int4': {'serving': {'max_model_len': 65536, 'environment': {'NCCL_PROTO': None, 'NCCL_DEBUG': 'WARN'}}},
        'my-model': copy.deepcopy(SHIPPED['tiny-llama-a']) | {'repo': 'me/my-model', 'port': 9000},
    }
    entry = catalog.get(SHIPPED, 'kimi-k25-int4', extra)
    assert entry['serving']['max_model_len'] == 65536
    assert entry['serving']['tensor_parallel_size'] == 8  # kept from the catalog
    assert entry['serving']['environment'] == {'NCCL_PROTO': None, 'NCCL_P2P_LEVEL': 'SYS', 'NCCL_DEBUG': 'WARN'}
    mine = catalog.get(SHIPPED, 'my-model', extra)
    assert mine['repo'] == 'me/my-model' and mine['port'] == 9000
    assert 'my-model' not in SHIPPED  # merge never mutates the catalog
    assert SHIPPED['kimi-k25-int4']['serving']['max_model_len'] == 128000


def test_lists_in_extra_replace_rather_than_append():
    entry = catalog.get(SHIPPED, 'minimax-m25', {'minimax-m25': {'allow_patterns': ['*.safetensors']}})
    assert entry['allow_patterns'] == ['*.safetensors']


class _Templated(dict):
    """Stands for Ansible's lazily templated dict: copying it would copy the host's variables with it."""

    def __deepcopy__(self, memo):
        raise AssertionError('the caller\'s container was deep-copied')


class _TaggedStr(str):
    pass


def test_the_filters_take_ansibles_values_as_plain_data_never_copying_its_containers():
    extra = _Templated({'my-model': _Templated(SHIPPED['tiny-llama-a'], repo=_TaggedStr('me/my-model'),
                                               serving=_Templated(SHIPPED['tiny-llama-a']['serving']), port=9000)})
    with pytest.raises(AssertionError, match='deep-copied'):
        catalog.get(SHIPPED, 'my-model', extra)  # what the filters spare the rules
    entry = catalog_filter.catalog_entry('my-model', extra)
    assert entry['repo'] == 'me/my-model' and not isinstance(entry['repo'], _TaggedStr)
    assert not isinstance(entry['serving'], _Templated)
    assert catalog_filter.catalog_validate(extra) == [] and 'my-model' in catalog_filter.catalog_models(extra)


def _bad(mutate, name='minimax-m25'):
    entry = copy.deepcopy(SHIPPED[name])
    mutate(entry)
    return catalog.validate_entry(name, entry)


@pytest.mark.parametrize('mutate, expected', [
    (lambda e: e['serving'].update(tensor_parallel_size=0),
     "model 'minimax-m25': serving.tensor_parallel_size must be a positive integer, got 0"),
    # Issue 43: what the collection sets itself (dev mode only for sleep, behind the gateway; the key in a 0600 file;
    # the bind address and port), refused by name in a catalog entry, an override or a profile.
    (lambda e: e['serving'].update(environment={'VLLM_SERVER_DEV_MODE': '1'}),
     "serving.environment: VLLM_SERVER_DEV_MODE is set by the collection, not the catalog: the pivot turns vLLM's dev"),
    (lambda e: e['serving'].update(environment={'VLLM_API_KEY': 'sk-test'}),
     'serving.environment: VLLM_API_KEY is set by the collection, not the catalog'),
    (lambda e: e['profiles']['tp8-ep'].update(extra_args=['--host', '0.0.0.0']),
     'profiles.tp8-ep.extra_args: --host must not be passed on the command line (extra_args has --host): the collection binds'),
    (lambda e: e['serving'].update(tensor_parallel_size='8'),
     "serving.tensor_parallel_size must be a positive integer, got '8'"),
    (lambda e: e['serving'].update(tensor_parallel_size=True),
     'serving.tensor_parallel_size must be a positive integer, got true'),
    (lambda e: e['serving'].pop('tensor_parallel_size'), 'missing required field serving.tensor_parallel_size'),
    (lambda e: e.update(port=0), 'port must be an integer port in 1024..65535 (vLLM runs without privileges: none below 1024), got 0'),
    (lambda e: e.update(port=80), 'port must be an integer port in 1024..65535 (vLLM runs without privileges: none below 1024), got 80'),
    (lambda e: e.update(port=70000), 'port must be an integer port in 1024..65535 (vLLM runs without privileges: none below 1024), got 70000'),
    (lambda e: e.update(prot=8000), 'unknown field prot (allowed: allow_patterns, architecture, benchmark,'),
    (lambda e: e['serving'].update(tensor_paralel_size=8), 'unknown field serving.tensor_paralel_size (allowed:'),
    (lambda e: e.update(format='bin'), 'format must be one of safetensors, gguf, got \'bin\''),
    (lambda e: e.update(engine='rocm'), 'engine must be one of cuda, cpu, got \'rocm\''),
    (lambda e: e.update(repo='MiniMax-M2.5'), 'repo must be a Hugging Face repo id "owner/name", got \'MiniMax-M2.5\''),
    (lambda e: e.update(revision=''), "revision must be a non-empty string, got ''"),
    (lambda e: e.update(size_bytes=-1), 'size_bytes must be a positive integer, got -1'),
    (lambda e: e.pop('size_bytes'), 'missing required field size_bytes'),
    (lambda e: e.update(ready_timeout_s=2.5), 'ready_timeout_s must be a positive integer, got 2.5'),
    (lambda e: e['serving'].update(gpu_memory_utilization=1.5), 'serving.gpu_memory_utilization must be a number in (0, 1], got 1.5'),
    (lambda e: e['serving'].update(kv_cache_dtype='int8'), 'serving.kv_cache_dtype must be one of auto, bfloat16, fp8,'),
    (lambda e: e['serving'].update(extra_args='--foo'), "serving.extra_args must be a list of strings, got '--foo'"),
    (lambda e: e['serving'].update(environment={'bad-name': 1}), 'serving.environment must be a mapping of VARIABLE_NAME'),
    (lambda e: e['serving'].update(environment={'A': [1]}), 'serving.environment must be a mapping of VARIABLE_NAME'),
    (lambda e: e['quantization'].update(method='int3'), 'quantization.method must be one of none, fp8, nvfp4,'),
    (lambda e: e['architecture'].update(attention='sliding'), 'architecture.attention must be one of mla, gqa, mha'),
    (lambda e: e['architecture'].update(num_key_value_heads=64), 'num_key_value_heads (64) must not exceed num_attention_heads (48)'),
    (lambda e: e['architecture'].update(num_key_value_heads=5), 'num_attention_heads (48) must be a multiple of num_key_value_heads (5)'),
    (lambda e: e['architecture'].update(attention='mha'), 'attention mha needs num_key_value_heads == num_attention_heads'),
    (lambda e: e['architecture'].update(active_params=3e11), 'active_params (300000000000.0) must not exceed total_params'),
    (lambda e: e.update(gguf_file='x.gguf'), 'gguf_file is only allowed with format gguf'),
    (lambda e: e.update(format='gguf'), 'format gguf needs gguf_file'),
    (lambda e: e['profiles']['tp8-ep'].update(tensor_parallel_size=-8), 'profiles.tp8-ep.tensor_parallel_size must be a positive integer'),
    (lambda e: e['profiles']['tp8-ep'].update(ep=True), 'unknown field profiles.tp8-ep.ep'),
    (lambda e: e.update(patches=[{'name': 'x', 'applies_to': 'vllm', 'target': 'a.py', 'description': 'd', 'delete_keys': ['k']}]),
     'patches[0].delete_keys only applies to model files'),
    (lambda e: e.update(patches=[{'name': 'x', 'applies_to': 'kernel', 'target': 'a', 'description': 'd'}]),
     "patches[0].applies_to must be one of vllm, model, got 'kernel'"),
    (lambda e: e['benchmark']['thresholds'].append({'concurrency': 0, 'min_output_tok_s': 1}),
     'benchmark.thresholds[2].concurrency must be a positive integer, got 0'),
    (lambda e: e.update(serving=None), 'serving must be a mapping, got None'),
    (lambda e: e['serving'].update(override_generation_config='temperature=1'),
     "serving.override_generation_config must be a mapping with string keys (rendered as one JSON argument), got"),
    (lambda e: e['serving'].update(compilation_config={}), 'serving.compilation_config must be a mapping with string keys'),
    (lambda e: e['serving'].update(mm_encoder_tp_mode='dp'), "serving.mm_encoder_tp_mode must be one of weights, data, got 'dp'"),
    (lambda e: e['serving'].update(chat_template_content_format='html'),
     "serving.chat_template_content_format must be one of auto, string, openai, got 'html'"),
    (lambda e: e['serving'].update(load_format='dummy'),
     "serving.load_format must be one of auto, hf, safetensors, pt, npcache, fastsafetensors, runai_streamer,"),
    (lambda e: e['serving'].update(model_loader_extra_config=[16]), 'serving.model_loader_extra_config must be a mapping'),
    (lambda e: e['serving'].update(tool_call_parser=''), "serving.tool_call_parser must be a non-empty string, got ''"),
    (lambda e: e['serving'].update(enable_auto_tool_choice='yes'), "serving.enable_auto_tool_choice must be true or false"),
    (lambda e: e['serving'].pop('tool_call_parser'),
     'serving: enable_auto_tool_choice needs tool_call_parser (vLLM refuses to start without one)'),
    (lambda e: e['serving'].update(enable_auto_tool_choice=False) or e['profiles'].update(tools={'enable_auto_tool_choice': True, 'tool_call_parser': None}),
     'profiles.tools: enable_auto_tool_choice needs tool_call_parser'),
    (lambda e: e['serving'].update(decode_context_parallel_size=0), 'serving.decode_context_parallel_size must be a positive integer'),
    (lambda e: e['profiles']['tp8-ep'].update(tensor_parallel_size=None), 'profiles.tp8-ep.tensor_parallel_size must be a positive integer, got None'),
    (lambda e: e['serving'].update(environment=None), 'serving.environment must be a mapping of VARIABLE_NAME'),
    (lambda e: e['quantization'].update(weight_block_size=[128, 0]), 'quantization.weight_block_size must be a list of one or two positive integers'),
    (lambda e: e['quantization'].update(weight_block_size=128), 'quantization.weight_block_size must be a list of one or two positive integers'),
    (lambda e: e['architecture'].update(moe_intermediate_size=-1), 'architecture.moe_intermediate_size must be a positive integer'),
    (lambda e: e['architecture'].update(index_topk=2048), 'architecture.index_topk (DeepSeek sparse attention) only exists on mla models'),
    (lambda e: e.update(vram_minimum_gb='276 GB'), "vram_minimum_gb must be a positive number, got '276 GB'"),
])
def test_bad_entries_are_rejected_with_field_and_allowed_values(mutate, expected):
    errors = _bad(mutate)
    assert errors, 'the bad entry was accepted'
    assert any(expected in e for e in errors), errors
    assert all(e.startswith("model 'minimax-m25': ") for e in errors)


def test_null_in_a_profile_drops_the_default_value():
    entry = catalog.get(SHIPPED, 'kimi-k25-int4', profile='h200-nvlink')
    assert entry['serving']['gpu_memory_utilization'] is None  # vLLM's default again
    assert entry['serving']['environment'] == {'NCCL_PROTO': None, 'NCCL_P2P_LEVEL': None}
    assert entry['serving']['max_model_len'] == 262144
    assert catalog.validate(SHIPPED, {'minimax-m25': {'serving': {'max_model_len': None, 'kv_cache_dtype': None}}}) == []


@pytest.mark.parametrize('name, tool, reasoning', [
    ('kimi-k25-int4', 'kimi_k2', 'kimi_k2'), ('kimi-k25-nvfp4', 'kimi_k2', 'kimi_k2'),
    ('minimax-m25', 'minimax_m2', 'minimax_m2'),  # the recipes moved off minimax_m2_append_think (MODEL-FACTS)
    ('glm5-fp8', 'glm47', 'glm45'), ('glm5-nvfp4', 'glm47', 'glm45'),
])
def test_seed_models_serve_agents(name, tool, reasoning):
    """Every seed model calls tools and separates its reasoning with the parsers its recipe names, in every profile."""
    for profile in [None] + sorted(SHIPPED[name].get('profiles', {})):
        serving = catalog.get(SHIPPED, name, profile=profile)['serving']
        assert (serving['tool_call_parser'], serving['enable_auto_tool_choice'], serving['reasoning_parser']) == (
            tool, True, reasoning), (name, profile)


def test_gpu_kind_profiles():
    kimi = SHIPPED['kimi-k25-int4']
    assert sorted(kimi['profiles']) == ['h200-nvlink', 'sm120-pcie']
    sm120 = kimi['profiles']['sm120-pcie']
    assert sm120['attention_backend'] == 'TRITON_MLA' and sm120['kv_cache_dtype'] == 'fp8'
    assert sm120['decode_context_parallel_size'] == 8 and sm120['max_model_len'] == 262144
    assert sm120['environment'] == {'VLLM_TEST_FORCE_FP8_MARLIN': 1, 'VLLM_MARLIN_USE_ATOMIC_ADD': 1, 'VLLM_MARLIN_INPUT_DTYPE': 'fp8'}
    assert kimi['profiles']['h200-nvlink']['compilation_config'] == {'pass_config': {'fuse_allreduce_rms': True}}
    assert kimi['serving']['gpu_memory_utilization'] == 0.93 and kimi['serving']['mm_encoder_tp_mode'] == 'data'
    assert SHIPPED['kimi-k25-nvfp4']['profiles']['b200-nvlink']['kv_cache_dtype'] == 'fp8'
    assert SHIPPED['kimi-k25-nvfp4']['serving']['kv_cache_dtype'] == 'auto'  # FP8 KV failed on SM120 (seed 001)
    assert SHIPPED['glm5-fp8']['profiles']['mtp']['speculative_config'] == {'method': 'mtp', 'num_speculative_tokens': 3}
    assert SHIPPED['minimax-m25']['serving']['override_generation_config'] == {'temperature': 1.0, 'top_p': 0.95, 'top_k': 40}


def test_every_sourced_value_has_a_comment():
    """Seed serving values and the new architecture facts carry their source (or TODO) in a YAML comment."""
    with open(catalog_filter.CATALOG_PATH, encoding='utf-8') as handle:
        lines = handle.read().splitlines()
    keys = ('max_model_len:', 'gpu_memory_utilization:', 'tool_call_parser:', 'reasoning_parser:', 'kv_cache_dtype:',
            'attention_backend:', 'moe_intermediate_size:', 'weight_block_size:', 'vram_minimum_gb:', 'index_topk:',
            'override_generation_config:', 'compilation_config:', 'mm_encoder_tp_mode:', 'decode_context_parallel_size:')
    seeds_end = next(i for i, line in enumerate(lines) if line.startswith('# Tiny CPU test models'))
    for i, line in enumerate(lines[:seeds_end]):
        if line.strip().startswith(keys):
            # the comment is on the line or on the comment lines just above it
            above = lines[i - 1].strip() if i else ''
            assert '#' in line or above.startswith('#'), 'no source for line %d: %s' % (i + 1, line)


@pytest.mark.parametrize('name', ['Kimi', 'a/b', '', 'x' * 70, '-lead'])
def test_bad_model_names_are_rejected(name):
    errors = catalog.validate_entry(name, copy.deepcopy(SHIPPED['tiny-llama-a']))
    assert any('the model name must match' in e for e in errors)


@pytest.mark.parametrize('extra, expected', [
    (['kimi'], 'extra models (llmfleet_models_extra) must be a mapping of model name to entry, got list'),
    ({'kimi-k25-int4': 'big'}, "model 'kimi-k25-int4': extra entry must be a mapping, got 'big'"),
    ({'kimi-k25-int4': {'serving': {'tensor_parallel_size': 3}}, 'new': {'repo': 'a/b'}}, "model 'new': missing required field"),
])
def test_bad_extra_is_reported(extra, expected):
    errors = catalog.validate(SHIPPED, extra)
    assert any(expected in e for e in errors), errors


def test_get_refuses_an_invalid_merged_entry():
    with pytest.raises(catalog.CatalogError, match=r"invalid catalog entry:\n  model 'kimi-k25-int4': port must be"):
        catalog.get(SHIPPED, 'kimi-k25-int4', {'kimi-k25-int4': {'port': 'http'}})


def test_filters_wrap_errors_for_ansible():
    assert catalog_filter.catalog_entry('tiny-llama-b')['port'] == 8002
    with pytest.raises(AnsibleFilterError, match="unknown model 'nope'; known models: glm5-fp8, glm5-nvfp4"):
        catalog_filter.catalog_entry('nope')
    assert catalog_filter.catalog_validate() == []
    assert catalog_filter.catalog_validate({'x': {}})[0].startswith("model 'x': missing required field")
    with pytest.raises(AnsibleFilterError, match="invalid model catalog:\n  model 'x'"):
        catalog_filter.catalog_models({'x': {}})
    assert set(catalog_filter.catalog_models({'minimax-m25': {'port': 8100}})) == set(SHIPPED)


def test_catalog_file_must_be_a_mapping(tmp_path):
    path = tmp_path / 'models.yml'
    path.write_text(yaml.safe_dump(['not', 'a', 'mapping']))
    with pytest.raises(AnsibleFilterError, match='must be a mapping'):
        catalog_filter.load_catalog(str(path))
