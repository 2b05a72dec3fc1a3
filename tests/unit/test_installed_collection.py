"""The collection as users get it: the tarball `ansible-galaxy collection build` makes, installed into a project of
their own (its ansible.cfg, its inventory), used through FQCNs. What needs no test host is checked here; the pivot
through `ansible-playbook llmfleet.vllm.pivot` from such a project against a real systemd host runs in
tests/integration/test_pivot_faults.py (the fixture's first pivot).
"""
import json
import pathlib
import subprocess
import sys

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
sys.path.insert(0, str(REPO / 'tests'))
from installed_project import make_project  # noqa: E402  pylint: disable=wrong-import-position


@pytest.fixture(scope='module')
def project(tmp_path_factory):
    return make_project(tmp_path_factory.mktemp('user-project'))


def run(project, *argv):
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=project.path, env=project.env,
                          capture_output=True, text=True, check=False)


def test_tarball_installs_without_the_working_tree_and_declares_its_dependencies(project):
    installed = project.collection
    manifest = json.loads((installed / 'MANIFEST.json').read_text())
    assert manifest['collection_info']['dependencies'] == {'community.general': '>=10.0.0'}
    assert not (installed / '.venv').exists() and not (installed / 'results').exists()
    assert yaml.safe_load((installed / 'meta' / 'runtime.yml').read_text())['requires_ansible'] == '>=2.19.0'


def test_every_role_module_filter_and_lookup_renders_in_ansible_doc(project):
    expected = {
        'role': sorted(p.name for p in (REPO / 'roles').iterdir() if (p / 'meta' / 'argument_specs.yml').exists()),
        'module': sorted(p.stem for p in (REPO / 'plugins' / 'modules').glob('*.py')),
        'filter': sorted(p.stem for p in (REPO / 'plugins' / 'filter').glob('*.yml')),
        'lookup': sorted(p.stem for p in (REPO / 'plugins' / 'lookup').glob('*.py')),
    }
    for kind, names in expected.items():
        result = run(project, 'ansible-doc', '--json', '-t', kind, *['llmfleet.vllm.' + n for n in names])
        assert result.returncode == 0, result.stderr[-3000:]
        docs = json.loads(result.stdout)
        assert sorted(docs) == ['llmfleet.vllm.' + n for n in names], (kind, sorted(docs))
        for name, doc in docs.items():
            body = doc.get('doc') or doc.get('entry_points', {})
            assert body, (kind, name, doc)


def test_playbooks_run_by_fqcn_and_results_go_to_the_project(project):
    for playbook in ('pivot', 'rollout', 'site', 'benchmark'):
        result = run(project, 'ansible-playbook', '--syntax-check', 'llmfleet.vllm.' + playbook)
        assert result.returncode == 0, (playbook, result.stdout[-2000:], result.stderr[-2000:])
    (project.path / 'where.yml').write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.debug:\n        msg: \"RESULTS={{ lookup('llmfleet.vllm.results_dir') }}\"\n")
    result = run(project, 'ansible-playbook', 'where.yml')
    assert result.returncode == 0, result.stdout[-2000:]
    assert 'RESULTS=%s' % (project.path / 'results') in result.stdout, result.stdout[-2000:]
    result = run(project, 'ansible-playbook', 'where.yml', '-e', 'llmfleet_results_dir=elsewhere/runs')
    assert 'RESULTS=%s' % (project.path / 'elsewhere' / 'runs') in result.stdout, result.stdout[-2000:]
