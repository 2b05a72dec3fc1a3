"""The Ray units of playbooks/ray-cluster.yml rendered through ansible-playbook (connection local) with the play's own
variables: where vLLM listens, the API key's path (a 0600 environment file, never the units), the units' HOME and
private /tmp (issue #27 item 10). The units running on test hosts: tests/integration/test_rollout.py."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
UNITS = ('ray-head.service', 'ray-worker.service', 'vllm-tiny-llama-a-ray.service')


def render(tmp_path, **extra):
    """Render the three unit templates for head h1 and worker h2 with the first play's vars; returns
    ({unit: text}, completed process)."""
    play_vars = yaml.safe_load((REPO / 'playbooks' / 'ray-cluster.yml').read_text())[0]['vars']
    out = tmp_path / 'out'
    playbook = [{
        'hosts': 'all', 'connection': 'local', 'gather_facts': False, 'vars': play_vars,
        'tasks': [{'name': 'Render ' + src, 'ansible.builtin.template': {
            'src': str(REPO / 'playbooks' / 'templates' / src), 'dest': str(out / '{{ inventory_hostname }}' / dest),
            'mode': '0644'}, 'when': when}
            for src, dest, when in (('ray-head.service.j2', UNITS[0], 'inventory_hostname == ray__head_host'),
                                    ('ray-worker.service.j2', UNITS[1], 'inventory_hostname != ray__head_host'),
                                    ('vllm-ray.service.j2', UNITS[2], 'inventory_hostname == ray__head_host'))]}]
    (tmp_path / 'play.yml').write_text(yaml.safe_dump(playbook))
    inventory = {'all': {'vars': {'ansible_python_interpreter': sys.executable, 'ray_model': 'tiny-llama-a', **extra},
                         'children': {'ray_head': {'hosts': {'h1': {}}}, 'ray_workers': {'hosts': {'h2': {}}}}}}
    (tmp_path / 'inventory.json').write_text(json.dumps(inventory))
    (out / 'h1').mkdir(parents=True)
    (out / 'h2').mkdir(parents=True)
    result = subprocess.run([str(BIN / 'ansible-playbook'), '-i', str(tmp_path / 'inventory.json'), str(tmp_path / 'play.yml')],
                            cwd=REPO, capture_output=True, text=True, check=False,
                            env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / 'ansible.cfg'), ANSIBLE_NOCOLOR='1'))
    units = {}
    for host in ('h1', 'h2'):
        for path in (out / host).iterdir():
            units[path.name] = path.read_text()
    return units, result


def _flat(unit):
    return unit.replace(' \\\n', ' ').replace('\n    ', ' ')


def test_ray_units_default_loopback_private_tmp_and_a_home_of_their_own(tmp_path):
    units, result = render(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert sorted(units) == sorted(UNITS)
    for name in UNITS:
        unit = units[name]
        assert 'Environment=HOME=/var/lib/llmfleet-ray' in unit and 'WorkingDirectory=/var/lib/llmfleet-ray\n' in unit, name
        assert '\nPrivateTmp=true\n' in unit, name
    assert "--temp-dir /var/lib/llmfleet-ray/tmp" in _flat(units['ray-head.service'])
    vllm = _flat(units['vllm-tiny-llama-a-ray.service'])
    assert '--host 127.0.0.1 ' in vllm and '0.0.0.0' not in vllm
    assert 'EnvironmentFile=/etc/llmfleet/vllm-ray.env' in vllm
    assert 'serve /srv/models/tiny-llama-a ' in vllm


def test_ray_api_key_opens_every_interface_and_stays_off_the_units(tmp_path):
    units, result = render(tmp_path, ray_api_key='sk-ray-4711', ray_models_root='/srv/models/')
    assert result.returncode == 0, result.stdout[-3000:]
    assert all('sk-ray-4711' not in unit for unit in units.values())
    assert 'sk-ray-4711' not in result.stdout
    vllm = _flat(units['vllm-tiny-llama-a-ray.service'])
    assert '--host 0.0.0.0 ' in vllm and '--api-key' not in vllm
    assert 'serve /srv/models/tiny-llama-a ' in vllm  # a trailing / on the models root: one path


@pytest.mark.parametrize('extra, message', [
    ({'ray_bind_host': '0.0.0.0 --api-key x'}, 'ray_bind_host must be an IP address'),
])
def test_ray_bad_bind_host_is_named(tmp_path, extra, message):
    _units, result = render(tmp_path, **extra)
    assert result.returncode != 0 and message in result.stdout, result.stdout[-3000:]
