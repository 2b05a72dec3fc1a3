# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that turn a serving profile into `vllm serve` arguments and quote them for systemd."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.module_utils import serve_args as _serve_args


def vllm_serve_args(serving):
    """The `vllm serve` arguments (after the model path) for a serving profile, in a stable order."""
    try:
        return _serve_args.serve_args(serving)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def systemd_command_line(argv, option_per_line=False):
    """argv joined and quoted for ExecStart=."""
    if isinstance(argv, str) or not isinstance(argv, (list, tuple)):
        raise AnsibleFilterError('systemd_command_line expects a list of arguments, got %s' % type(argv).__name__)
    return _serve_args.systemd_command_line(argv, option_per_line)


def systemd_env_file(environment):
    """An EnvironmentFile= body for a mapping of variables (sorted; null values left out)."""
    if not isinstance(environment, dict):
        raise AnsibleFilterError('systemd_env_file expects a mapping, got %s' % type(environment).__name__)
    try:
        return _serve_args.env_file(environment)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def systemd_env_file_values(text):
    """The variables of an EnvironmentFile= body that systemd_env_file wrote."""
    return _serve_args.parse_env_file(str(text or ''))


def vllm_bind_host(requested, gateway=False, api_key=False, variable='bind_host'):
    """Where vLLM listens: requested when given, else 127.0.0.1 (0.0.0.0 only with an API key and no gateway)."""
    try:
        return _serve_args.bind_host(requested, bool(gateway), bool(api_key), variable)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


class FilterModule:
    def filters(self):
        return {
            'vllm_serve_args': vllm_serve_args,
            'systemd_command_line': systemd_command_line,
            'systemd_env_file': systemd_env_file,
            'systemd_env_file_values': systemd_env_file_values,
            'vllm_bind_host': vllm_bind_host,
        }
