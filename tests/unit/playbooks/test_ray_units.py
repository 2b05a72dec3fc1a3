"""The units of roles/ray_cluster rendered through ansible-playbook (connection local) with the role's own variables and
checks: the Ray head and worker units from the role's templates, the vLLM-over-Ray unit from service_deploy's (issue
#29: one unit template, its sandbox, KillMode=mixed, /dev/shm cleanup), where vLLM listens, the API key's path (a 0600
environment file, never the units), the units' HOME and private /tmp (issue #27 item 10). The units running on test
hosts: tests/integration/test_rollout.py.

Set UPDATE_GOLDEN=1 to rewrite tests/golden/vllm-tiny-llama-a-ray.service (then review the diff)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from systemd_security import MAX_EXPOSURE, exposure
from ansible_collections.llmfleet.vllm.plugins.filter.catalog import catalog_entry

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
GOLDEN = REPO / 'tests' / 'golden' / 'vllm-tiny-llama-a-ray.service'
SERVE_UNIT = 'etc/systemd/system/vllm-tiny-llama-a-ray.service'
TEMPLATES = REPO / 'roles' / 'ray_cluster' / 'templates'


def render(tmp_path, **extra):
    """Render the head unit (h1), the worker unit (h2) and the vLLM-over-Ray unit (h1, under <out>/h1) with the role's
    variables and checks; returns (out dir, completed process)."""
    out = tmp_path / 'out'
    tasks = [
        {'name': 'Check the cluster and its variables', 'ansible.builtin.include_role': {
            'name': 'llmfleet.vllm.ray_cluster', 'tasks_from': 'validate', 'public': True}},
        {'name': 'Render the head unit', 'ansible.builtin.template': {
            'src': str(TEMPLATES / 'ray-head.service.j2'), 'dest': '{{ service_deploy_render_root }}/ray-head.service',
            'mode': '0644'}, 'when': 'ray_cluster__is_head'},
        {'name': 'Render the worker unit', 'ansible.builtin.template': {
            'src': str(TEMPLATES / 'ray-worker.service.j2'), 'dest': '{{ service_deploy_render_root }}/ray-worker.service',
            'mode': '0644'}, 'when': 'not ray_cluster__is_head'},
        {'name': 'Render the vLLM-over-Ray unit', 'ansible.builtin.include_role': {
            'name': 'llmfleet.vllm.ray_cluster', 'tasks_from': 'serve_unit'},
         'vars': {'ray_cluster__serve_step': 'render'}, 'when': 'ray_cluster__is_head'},
    ]
    playbook = [{'hosts': 'all', 'connection': 'local', 'gather_facts': False, 'tasks': tasks}]
    (tmp_path / 'play.yml').write_text(yaml.safe_dump(playbook))
    hosts = {host: {'service_deploy_render_root': str(out / host)} for host in ('h1', 'h2')}
    inventory = {'all': {'vars': {'ansible_python_interpreter': sys.executable, 'ray_cluster_model': 'tiny-llama-a',
                                  'ray_cluster_node_ip': '10.0.0.1', **extra},
                         'children': {'ray_head': {'hosts': {'h1': hosts['h1']}}, 'ray_workers': {'hosts': {'h2': hosts['h2']}}}}}
    (tmp_path / 'inventory.json').write_text(json.dumps(inventory))
    (out / 'h1').mkdir(parents=True)
    (out / 'h2').mkdir(parents=True)
    result = subprocess.run([str(BIN / 'ansible-playbook'), '-i', str(tmp_path / 'inventory.json'), str(tmp_path / 'play.yml')],
                            cwd=REPO, capture_output=True, text=True, check=False,
                            env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / 'ansible.cfg'), ANSIBLE_NOCOLOR='1'))
    return out, result


def _flat(unit):
    return re.sub(r' \\\n\s+', ' ', unit)


@pytest.fixture(scope='module')
def rendered(tmp_path_factory):
    out, result = render(tmp_path_factory.mktemp('ray'))
    assert result.returncode == 0, result.stdout[-3000:]
    return out


def test_ray_serve_unit_matches_golden(rendered):
    unit = (rendered / 'h1' / SERVE_UNIT).read_bytes()
    if os.environ.get('UPDATE_GOLDEN'):
        GOLDEN.write_bytes(unit)
    assert unit == GOLDEN.read_bytes(), 'rendered unit differs from %s (UPDATE_GOLDEN=1 to accept)' % GOLDEN


def test_ray_serve_unit_is_service_deploys_unit_with_the_cluster_added(rendered):
    """The single-host unit's safety (issue #29): KillMode=mixed, the /dev/shm cleanup, the strict sandbox, its own
    HOME; plus the head binding, the wait for every node and Ray's temp dir writable."""
    vllm = _flat((rendered / 'h1' / SERVE_UNIT).read_text())
    single = _flat((REPO / 'tests' / 'golden' / 'vllm-tiny-llama-a.service').read_text())
    for line in ('KillMode=mixed', 'ExecStartPre=+/usr/local/libexec/llmfleet/shm-cleanup', 'ProtectSystem=strict',
                 'ProtectProc=invisible', 'UMask=0077', 'CapabilityBoundingSet=\n', 'SystemCallFilter=~@clock',
                 'Environment=HOME=%C/llmfleet-vllm'):
        assert line in vllm and line in single, line
    for line in ('Requires=ray-head.service\n', 'BindsTo=ray-head.service\n', 'After=ray-head.service\n',
                 'ExecStartPre=/usr/local/libexec/llmfleet/ray-wait-nodes 2 600\n',
                 'ReadWritePaths=/var/lib/llmfleet-ray/tmp\n', 'TimeoutStartSec=%d\n' % (catalog_entry('tiny-llama-a')['ready_timeout_s'] + 600)):
        assert line in vllm, line
    assert 'serve /srv/models/tiny-llama-a --host 127.0.0.1 ' in vllm and '0.0.0.0' not in vllm
    assert '--tensor-parallel-size 1 --pipeline-parallel-size 2 --distributed-executor-backend ray ' in vllm
    env = (rendered / 'h1' / 'etc/llmfleet/vllm-tiny-llama-a-ray.env').read_text()
    assert 'RAY_ADDRESS="10.0.0.1:6379"\n' in env and 'VLLM_HOST_IP="10.0.0.1"\n' in env and 'CUDA_VISIBLE_DEVICES' not in env
    assert not (rendered / 'h2' / SERVE_UNIT).exists()


def test_ray_units_private_tmp_and_a_home_of_their_own(rendered):
    for host, name in (('h1', 'ray-head.service'), ('h2', 'ray-worker.service')):
        unit = (rendered / host / name).read_text()
        assert 'Environment=HOME=/var/lib/llmfleet-ray' in unit and 'WorkingDirectory=/var/lib/llmfleet-ray\n' in unit, name
        assert '\nPrivateTmp=true\n' in unit and '\nKillMode=mixed\n' in unit, name
    assert "--temp-dir /var/lib/llmfleet-ray/tmp" in _flat((rendered / 'h1' / 'ray-head.service').read_text())
    assert "--address 10.0.0.1:6379 " in _flat((rendered / 'h2' / 'ray-worker.service').read_text())


def test_ray_serve_unit_is_sandboxed_as_the_single_host_unit(rendered, systemd_analyze):
    """`systemd-analyze security` rates the Ray driver's unit as service_deploy's golden units are held."""
    score, report = exposure(systemd_analyze, rendered / 'h1' / SERVE_UNIT)
    assert score <= MAX_EXPOSURE, report


@pytest.mark.parametrize('host, name', [('h1', 'ray-head.service'), ('h2', 'ray-worker.service')])
def test_ray_head_and_worker_units_are_held_to_the_same_limit(rendered, systemd_analyze, host, name):
    """Issue 43 item 3: every service the collection installs (tests/unit/roles/test_services_sandboxed.py)."""
    score, report = exposure(systemd_analyze, rendered / host / name)
    assert score <= MAX_EXPOSURE, report


def test_ray_api_key_opens_every_interface_and_stays_off_the_units(tmp_path):
    out, result = render(tmp_path, ray_cluster_api_key='sk-ray-4711', ray_cluster_models_root='/srv/models/')
    assert result.returncode == 0, result.stdout[-3000:]
    units = [p.read_text() for p in out.rglob('*.service')]
    assert len(units) == 3 and all('sk-ray-4711' not in unit for unit in units)
    assert 'sk-ray-4711' not in result.stdout
    vllm = _flat((out / 'h1' / SERVE_UNIT).read_text())
    assert '--host 0.0.0.0 ' in vllm and '--api-key' not in vllm
    assert 'serve /srv/models/tiny-llama-a ' in vllm  # a trailing / on the models root: one path
    assert 'VLLM_API_KEY="sk-ray-4711"\n' in (out / 'h1' / 'etc/llmfleet/vllm-tiny-llama-a-ray.env').read_text()


@pytest.mark.parametrize('extra, message', [
    ({'ray_cluster_bind_host': '0.0.0.0 --api-key x'}, 'ray_cluster_bind_host must be an IP address'),
    ({'ray_cluster_temp_dir': '/tmp/ray'}, 'ray_cluster_temp_dir must be a dir under ray_cluster_home_dir'),
    ({'ray_cluster_state': 'running'}, 'ray_cluster_state'),
    # The playbook-only release's names are refused, not ignored.
    ({'ray_model': 'tiny-llama-a', 'ray_port': 6391}, 'ray_model, ray_port: the Ray variables are now ray_cluster_<name>'),
    # Issue 43 item 4: remote code from a branch; Ray serves the entry's revision, so the pin goes there.
    ({'llmfleet_models_extra': {'tiny-llama-a': {'serving': {'extra_args': ['--trust-remote']}}}},
     'tiny-llama-a runs the Python code of its repo (trust_remote_code), and revision "main" is not a full commit (a'
     ' branch, a tag or a short commit) and can move to code nobody reviewed (now a commit not resolved here). Review that'
     ' commit\'s code, then pin it: revision: <commit> in its catalog entry or llmfleet_models_extra.'),
])
def test_ray_bad_variables_are_named_before_any_change(tmp_path, extra, message):
    out, result = render(tmp_path, **extra)
    assert result.returncode != 0 and message in result.stdout, result.stdout[-3000:]
    assert not any(p.is_file() for p in out.rglob('*'))
