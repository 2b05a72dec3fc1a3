"""Every systemd service the collection installs is held to `systemd-analyze security` <= MAX_EXPOSURE, or named here
with the reason it cannot be (issue 43 item 3). The GPU metrics timer's service (roles/observability) is rendered
through ansible-playbook with the role's own check task, and its command line runs as it is written: a user without
privileges, `-S`, so that no `.pth` file of the vLLM venv runs, as root or as anyone. NVML is a test double here (no
GPU): a `pynvml.py` of two fake GPUs in a venv of its own."""
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from bare_venv import bare_venv
from systemd_security import MAX_EXPOSURE, exposure

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
ROLE = REPO / 'roles' / 'observability'
GPU_UNIT = 'llmfleet-gpu-metrics.service'
CHECK_TASK = "Check that observability_gpu_python has NVML's bindings (nvidia-ml-py)"

# Where each service template is held to MAX_EXPOSURE.
HELD = {
    'roles/service_deploy/templates/vllm.service.j2':
        'tests/unit/roles/test_service_unit.py (every golden unit, the launcher and device variants)',
    'roles/ray_cluster/templates/ray-head.service.j2': 'tests/unit/playbooks/test_ray_units.py',
    'roles/ray_cluster/templates/ray-worker.service.j2': 'tests/unit/playbooks/test_ray_units.py',
    'roles/observability/templates/llmfleet-gpu-metrics.service.j2': 'here',
}
# Services that cannot be, and why.
EXCEPTIONS = {
    'roles/nvidia_driver/templates/nvidia-uvm-nodes.service.j2':
        'loads nvidia_uvm and makes its /dev/nvidia-uvm* nodes once at boot (modprobe, mknod: CAP_SYS_MODULE and '
        'CAP_MKNOD as root), so that the sandboxed CUDA units need neither; it runs the collection\'s script alone',
}
# Templates that are parts of services, not services.
INCLUDES = {'roles/ray_cluster/templates/ray-sandbox.service.j2': 'the Ray head and worker units include it'}

# NVML's test double (no GPU here): two fake GPUs.
FAKE_PYNVML = REPO / 'tests' / 'fixtures' / 'nvml' / 'pynvml.py'
# What a package of the venv could ship: a .pth line runs at every start of a Python that processes the site.
PTH_HOOK = "import os; open(os.environ['HOOK_MARKER'], 'w').write('ran')\n"


def test_every_service_template_is_held_or_named():
    found = {str(p.relative_to(REPO)) for p in REPO.glob('roles/*/templates/*.service.j2')}
    named = set(HELD) | set(EXCEPTIONS) | set(INCLUDES)
    assert found == named, 'hold a new service to MAX_EXPOSURE, or name why not: %s' % sorted(found ^ named)


def _role_task(name):
    tasks = yaml.safe_load((ROLE / 'tasks' / 'gpu_metrics.yml').read_text())
    for task in tasks + [t for block in tasks for t in block.get('block', [])]:
        if task.get('name') == name:
            return task
    raise AssertionError('no task %r in roles/observability/tasks/gpu_metrics.yml' % name)


@pytest.fixture(scope='module')
def gpu_unit():
    """The role's check task and the service rendered from its template, for a venv of its own under a folder every user
    may enter: {unit, venv_python, site, lib, found (the check's answer), hook_marker}."""
    base = Path(tempfile.mkdtemp(prefix='llmfleet-gpu-'))
    base.chmod(0o755)
    try:
        venv = base / 'venv'
        site = bare_venv(venv)
        shutil.copy(FAKE_PYNVML, site / 'pynvml.py')
        (site / 'zz-hook.pth').write_text(PTH_HOOK)
        lib = base / 'lib'
        lib.mkdir(mode=0o755)
        for name in ('atomic_write.py', 'prom_text.py', 'gpu_textfile.py'):
            (lib / name).write_text((REPO / 'plugins' / 'module_utils' / name).read_text())
        check = dict(_role_task(CHECK_TASK), register='found')
        play_vars = dict(yaml.safe_load((ROLE / 'vars' / 'main.yml').read_text()), observability_gpu_python=str(venv / 'bin' / 'python'),
                         observability__gpu_lib_dir=str(lib), observability_textfile_dir='/var/lib/prometheus/node-exporter',
                         ansible_python_interpreter=sys.executable)
        play = [{'hosts': 'localhost', 'connection': 'local', 'gather_facts': False, 'vars': play_vars, 'tasks': [
            check,
            {'name': 'Keep the answer', 'ansible.builtin.copy': {'content': '{{ found.rc }} {{ found.stdout }}',
                                                                 'dest': str(base / 'found'), 'mode': '0644'}},
            {'name': 'Render the unit', 'ansible.builtin.template': {
                'src': str(ROLE / 'templates' / (GPU_UNIT + '.j2')), 'dest': str(base / GPU_UNIT), 'mode': '0644'},
             'vars': {'observability__gpu_pynvml_path': '{{ found.stdout | trim }}'}}]}]
        (base / 'play.yml').write_text(yaml.safe_dump(play))
        markers = base / 'markers'  # where the hook could write, as nobody too: its silence means it never ran
        markers.mkdir()
        markers.chmod(0o1777)
        marker = markers / 'hook-ran-in-the-check'
        result = subprocess.run([str(BIN / 'ansible-playbook'), '-i', 'localhost,', str(base / 'play.yml')], cwd=REPO,
                                capture_output=True, text=True, check=False,
                                env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
                                         HOOK_MARKER=str(marker)))
        assert result.returncode == 0, result.stdout[-3000:]
        yield {'unit': base / GPU_UNIT, 'venv_python': venv / 'bin' / 'python', 'site': site, 'lib': lib,
               'found': (base / 'found').read_text(), 'check_marker': marker}
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _commands(unit: Path, key: str) -> list:
    return [line.split('=', 1)[1] for line in unit.read_text().splitlines() if line.startswith(key + '=')]


def test_gpu_metrics_service_is_sandboxed(gpu_unit, systemd_analyze):
    unit = gpu_unit['unit']
    score, report = exposure(systemd_analyze, unit)
    assert score <= MAX_EXPOSURE, report
    text = unit.read_text()
    assert 'DynamicUser=true\n' in text and 'CapabilityBoundingSet=\n' in text and 'DevicePolicy=closed\n' in text
    # The user's code runs in ExecStart alone; root ("+") only gives the file systemd opened its mode and name.
    assert '\nUser=' not in text and not [c for c in _commands(unit, 'ExecStart') if c.startswith(('+', '!'))]
    assert [c.split()[0] for c in _commands(unit, 'ExecStartPre') + _commands(unit, 'ExecStartPost')] == [
        '+/bin/rm', '+/bin/chmod', '+/bin/mv']
    # No path of its own there (a runtime or state directory, a link): nothing for the user to point elsewhere.
    assert 'RuntimeDirectory' not in text and 'StateDirectory' not in text and 'ReadWritePaths' not in text


def test_the_role_finds_pynvml_as_nobody_and_runs_no_pth_file(gpu_unit):
    """The role's own check task (as the playbook ran it): the folder pynvml comes from, and the venv's hook never ran."""
    assert gpu_unit['found'] == '0 %s' % gpu_unit['site'], gpu_unit['found']
    assert not gpu_unit['check_marker'].exists()


def test_gpu_metrics_writer_runs_without_privileges_and_no_pth_file_of_the_venv(gpu_unit, tmp_path):
    """The unit's commands as written: ExecStart as nobody, its stdout into the file StandardOutput= names (opened here
    by root, as systemd does), then ExecStartPost: node_exporter's directory holds llmfleet-gpu.prom with both fake GPUs,
    0644, and nothing else; the venv's .pth hook never ran. The same command without -S runs it (the check can fail)."""
    unit = gpu_unit['unit']
    textfile = Path(tempfile.mkdtemp(prefix='llmfleet-textfile-'))
    try:
        textfile.chmod(0o755)  # nobody reaches the markers below (the control shows the hook can write there)
        text_unit = unit.read_text().replace('/var/lib/prometheus/node-exporter', str(textfile))
        [start] = [line.split('=', 1)[1] for line in text_unit.splitlines() if line.startswith('ExecStart=')]
        [output] = [line.split('=', 1)[1] for line in text_unit.splitlines() if line.startswith('StandardOutput=')]
        # file:, not truncate: - every command of the unit gets this stdout, and truncate: would empty it at the chmod.
        assert output.startswith('file:' + str(textfile) + '/') and not output.endswith('.prom'), output
        argv = shlex.split(start)
        markers = textfile / 'markers'
        markers.mkdir()
        markers.chmod(0o1777)
        nobody = pwd.getpwnam('nobody')
        as_nobody = ['setpriv', '--reuid=%d' % nobody.pw_uid, '--regid=%d' % nobody.pw_gid, '--clear-groups']
        env = {'PATH': '/usr/bin:/bin', 'HOOK_MARKER': str(markers / 'hook-ran')}
        with open(output[len('file:'):], 'w', encoding='utf-8') as stdout:
            done = subprocess.run(as_nobody + argv, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True, check=False)
        assert done.returncode == 0, done.stderr
        assert argv[1] == '-S' and not (markers / 'hook-ran').exists()
        for post in [line.split('=', 1)[1] for line in text_unit.splitlines() if line.startswith('ExecStartPost=')]:
            subprocess.run(shlex.split(post[1:]), check=True)
        written = textfile / 'llmfleet-gpu.prom'
        text = written.read_text()
        assert 'llmfleet_gpu_power_watts{gpu="1",uuid="GPU-fake-1",name="Fake GPU"} 123.456' in text, text
        assert oct(os.stat(written).st_mode & 0o777) == '0o644'
        assert sorted(p.name for p in textfile.iterdir()) == ['llmfleet-gpu.prom', 'markers']
        control = subprocess.run(as_nobody + [argv[0]] + argv[2:], env=dict(env, HOOK_MARKER=str(markers / 'control')),
                                 capture_output=True, text=True, check=False)
        assert (markers / 'control').read_text() == 'ran', control.stderr
    finally:
        shutil.rmtree(textfile, ignore_errors=True)
