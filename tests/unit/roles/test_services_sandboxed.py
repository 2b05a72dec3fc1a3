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
from systemd_security import MAX_EXPOSURE, exposure

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
ROLE = REPO / 'roles' / 'observability'
GPU_UNIT = 'llmfleet-gpu-metrics.service'
SYSTEM_PYTHON = '/usr/bin/python3'
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

# A stand-in for NVML (no GPU here): the calls gpu_textfile.py makes, two GPUs.
FAKE_PYNVML = '''
class _Memory:
    used, total = 2 * 2**30, 80 * 2**30
class _Utilization:
    gpu = 37
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(index): return index
def nvmlDeviceGetMemoryInfo(handle): return _Memory()
def nvmlDeviceGetUtilizationRates(handle): return _Utilization()
def nvmlDeviceGetUUID(handle): return 'GPU-fake-%d' % handle
def nvmlDeviceGetName(handle): return b'Fake GPU'
def nvmlDeviceGetPowerUsage(handle): return 123456
def nvmlDeviceGetEnforcedPowerLimit(handle): return 700000
'''
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
        # Over the system's python3: the test's own interpreter may sit where nobody cannot reach it (a home directory).
        subprocess.run([SYSTEM_PYTHON, '-m', 'venv', '--without-pip', str(venv)], check=True)
        [site] = venv.glob('lib/python3*/site-packages')
        (site / 'pynvml.py').write_text(FAKE_PYNVML)
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
    # Nothing runs as root: no User= (a user of its own for each run), no "+" command outside the sandbox.
    assert '\nUser=' not in text and not [c for key in ('ExecStartPre', 'ExecStartPost', 'ExecStart')
                                          for c in _commands(unit, key) if c.startswith(('+', '!'))]


def test_the_role_finds_pynvml_as_nobody_and_runs_no_pth_file(gpu_unit):
    """The role's own check task (as the playbook ran it): the folder pynvml comes from, and the venv's hook never ran."""
    assert gpu_unit['found'] == '0 %s' % gpu_unit['site'], gpu_unit['found']
    assert not gpu_unit['check_marker'].exists()


def test_gpu_metrics_writer_runs_without_privileges_and_no_pth_file_of_the_venv(gpu_unit, tmp_path):
    """ExecStart as written, as nobody: the file lands in the runtime directory with both fake GPUs, and the venv's .pth
    hook never ran. The same command without -S runs it (the check can fail). node_exporter's directory links to that
    file (the role's link task names the runtime directory ExecStart writes to)."""
    unit = gpu_unit['unit']
    runtime = Path(tempfile.mkdtemp(prefix='llmfleet-run-'))
    try:
        runtime.chmod(0o755)
        run_dir = yaml.safe_load((ROLE / 'vars' / 'main.yml').read_text())['observability__gpu_run_dir']
        (runtime / run_dir).mkdir()
        nobody = pwd.getpwnam('nobody')
        os.chown(runtime / run_dir, nobody.pw_uid, nobody.pw_gid)
        [start] = _commands(unit, 'ExecStart')
        assert '--textfile-dir %t/' + run_dir in start, start
        argv = [word.replace('%t', str(runtime)) for word in shlex.split(start)]
        marker = runtime / run_dir / 'hook-ran'  # nobody may write there: the hook's silence means it never ran
        env = {'PATH': '/usr/bin:/bin', 'HOOK_MARKER': str(marker)}
        as_nobody = ['setpriv', '--reuid=%d' % nobody.pw_uid, '--regid=%d' % nobody.pw_gid, '--clear-groups']
        done = subprocess.run(as_nobody + argv, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        written = runtime / run_dir / 'llmfleet-gpu.prom'
        text = written.read_text()
        assert 'llmfleet_gpu_power_watts{gpu="1",uuid="GPU-fake-1",name="Fake GPU"} 123.456' in text, text
        assert os.stat(written).st_uid == nobody.pw_uid and oct(os.stat(written).st_mode & 0o777) == '0o644'
        assert argv[1] == '-S' and not marker.exists()
        control = subprocess.run(as_nobody + [argv[0]] + argv[2:], env=dict(env, HOOK_MARKER=str(runtime / run_dir / 'control')),
                                 capture_output=True, text=True, check=False)
        assert (runtime / run_dir / 'control').read_text() == 'ran', control.stderr
    finally:
        shutil.rmtree(runtime, ignore_errors=True)
    link = _role_task("Link node_exporter's textfile directory to the file the timer writes")['ansible.builtin.file']
    assert (link['src'], link['state'], link['path']) == (
        '/run/{{ observability__gpu_run_dir }}/llmfleet-gpu.prom', 'link', '{{ observability_textfile_dir }}/llmfleet-gpu.prom')
