# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Input rules from the security review of issue 27: secrets off the vLLM command line (L2), names that end in a
newline (L1: `$` matches before a final newline, so every rule anchors with \\Z), ports vLLM can bind and recorded
unit names (L8, L11)."""
from __future__ import annotations

import json
import pathlib
import re

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import catalog
from ansible_collections.llmfleet.vllm.plugins.module_utils import host_slots as hs
from ansible_collections.llmfleet.vllm.plugins.module_utils import serve_args as sa

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize('token', [
    '--api-key', '--api-key=sk-x', '--api_key', '--api_key=sk-x', '--api-k', '--api_k=sk-x', '--API-KEY', '--api-',
])
def test_every_spelling_of_api_key_is_refused(token):
    """vLLM's parser turns '_' into '-' and argparse takes an unambiguous prefix: each of these sets --api-key."""
    with pytest.raises(ValueError, match='--api-key must not be passed on the command line'):
        sa.serve_args({'extra_args': [token, 'sk-secret']})


@pytest.mark.parametrize('token', ['--config', '--config=/etc/vllm.yaml', '--conf'])
def test_a_config_file_is_refused(token):
    """Issue 43: a vLLM config file would set --host, --port, --api-key or trust-remote-code out of the catalog's sight."""
    with pytest.raises(ValueError, match="--config must not be passed on the command line .*: vLLM's config file"):
        sa.serve_args({'extra_args': [token, '/etc/vllm.yaml']})


@pytest.mark.parametrize('token', ['--api-server-count', '--portable', 'api-key', '-a', '--', 'sk-x', '--apikey', '--hf-overrides',
                                   '--config-format', '--compilation-config'])
def test_other_tokens_pass_the_api_key_guard(token):
    assert sa.forbidden_arg(token) is None
    if token.startswith('--') and len(token) > 2:
        assert sa.serve_args({'extra_args': [token]}) == [token]


@pytest.mark.parametrize('token', ['chat\n', 'a\nb', '\n'])
def test_a_newline_is_never_left_unquoted_in_exec_start(token):
    quoted = sa.systemd_quote(token)
    assert '\n' not in quoted and quoted.startswith('"'), quoted


def test_an_environment_name_ending_in_a_newline_is_refused():
    with pytest.raises(ValueError, match='environment variable name'):
        sa.env_file({'NAME\n': 'x'})


# ----------------------------------------------------------------------------- L1: names that end in a newline

@pytest.mark.parametrize('name', ['chat\n', 'default\n', 'a\n'])
def test_a_slot_name_ending_in_a_newline_is_refused(name):
    with pytest.raises(hs.SlotError, match='slot must be a slot name'):
        hs.check_slot_name(name)


@pytest.mark.parametrize('alias', ['chat\n', 'chat\nslot_x'])
def test_an_alias_ending_in_a_newline_is_refused(alias):
    with pytest.raises(hs.SlotError, match='pivot_alias must be a model alias'):
        hs.assign_alias('default', {}, alias, variable='pivot_alias')


def test_a_commit_ending_in_a_newline_is_not_a_commit():
    assert hs.COMMIT_RE.match('a' * 40) and not hs.COMMIT_RE.match('a' * 40 + '\n')


def test_a_model_name_ending_in_a_newline_is_refused_by_the_catalog():
    assert catalog.validate_entry('tiny-llama-a', {}) != catalog.validate_entry('tiny-llama-a\n', {})
    assert any('the model name must match' in e for e in catalog.validate_entry('tiny-llama-a\n', {}))


# ----------------------------------------------------------------------------- L8, L11: ports and recorded units

def test_the_standby_port_stays_in_the_port_range():
    assert hs.standby_port('default', {}, 65535) == 65534
    assert hs.standby_port('default', {'b': {'port': 65534}}, 65535) == 65533
    assert hs.standby_port('default', {}, 8000) == 8001
    # a recorded standby port out of the range is not kept
    assert hs.standby_port('default', {'default': {'port': 8000, 'standby_port': 70000}}, 8000) == 8001


@pytest.mark.parametrize('port', [80, 1023, 0, 65536])
def test_a_port_vllm_cannot_bind_is_refused(port):
    with pytest.raises(hs.SlotError, match=r'pivot_port must be a TCP port in 1024\.\.65535 \(vLLM runs without privileges'):
        hs.assign_port('default', {}, 8000, requested=port, variable='pivot_port')


@pytest.mark.parametrize('unit', ['vllm-a.service; touch /tmp/x', 'vllm-a.service\n', '$(id).service', 'vllm-a', 7])
def test_a_recorded_unit_that_is_not_a_service_name_is_refused(unit):
    state = json.dumps({'version': 1, 'slots': {'default': {'name': 'default', 'model': 'a', 'unit': unit}}})
    with pytest.raises(hs.SlotError, match='slot default records the unit .*not a systemd service name'):
        hs.load_state(state)
    with pytest.raises(hs.SlotError, match='not a systemd service name'):
        hs.load_state(None, json.dumps({'model': 'a', 'unit': unit}))


def test_recorded_service_names_load():
    state = {'version': 1, 'slots': {'default': {'name': 'default', 'model': 'a', 'unit': 'vllm-a.service'},
                                     'b': {'name': 'b', 'model': 'h', 'unit': 'vllm-handmade@x:1.service'}}}
    assert hs.load_state(json.dumps(state)) == (state['slots'], False)


@pytest.mark.parametrize('token, option', [('--host', '--host'), ('--host=0.0.0.0', '--host'), ('--ho', '--host'),
                                           ('--port=8000', '--port'), ('--por', '--port')])
def test_the_options_the_collection_sets_are_refused_in_extra_args(token, option):
    """Issue 43: extra_args come after the collection's own --host and --port, so argparse would take theirs: a
    --host 0.0.0.0 there would put a loopback-only (dev-mode) server on every interface."""
    with pytest.raises(ValueError, match='%s must not be passed on the command line' % option):
        sa.serve_args({'extra_args': [token, '0.0.0.0']})


# ----------------------------------------------------------------------------- issue 43: no $ in a check of roles/

# A pattern given to Jinja's match / search / regex tests or filters in the collection's YAML.
_JINJA_PATTERN = re.compile(r"""(?:\bmatch\(|\bsearch\(|\bregex\(|['"](?:match|search|regex)['"],\s*)\s*'((?:[^'\\]|\\.)*)'""")


def _yaml_patterns():
    for top in ('roles', 'playbooks'):
        for path in sorted((REPO / top).rglob('*.yml')):
            for number, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1):
                for found in _JINJA_PATTERN.finditer(line):
                    yield '%s:%d' % (path.relative_to(REPO), number), found.group(1)


def test_no_pattern_in_roles_or_playbooks_anchors_with_dollar():
    """$ also matches before a final newline ('5\\n' passes '^[0-9]+$'): every pattern ends with \\Z instead."""
    patterns = list(_yaml_patterns())
    assert len(patterns) > 20, patterns  # the scan finds the checks (gateway, model_seed, service_deploy, pivot, ...)
    anchored = ['%s: %s' % (where, pattern) for where, pattern in patterns if re.search(r'(?<!\\)\$', pattern)]
    assert anchored == [], anchored


def test_the_scan_would_find_a_dollar_anchor():
    line = "ok: \"{{ model_seed_fanout | string is match('^[1-9][0-9]*$') }}\" and x | reject('match', '^a$')"
    assert [m.group(1) for m in _JINJA_PATTERN.finditer(line)] == ['^[1-9][0-9]*$', '^a$']
