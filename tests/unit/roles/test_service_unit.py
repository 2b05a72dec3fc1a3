"""service_deploy renders the real template through ansible-playbook: golden units, systemd-analyze verify and security,
bad input.

Set UPDATE_GOLDEN=1 to rewrite tests/golden/ from the current template (then review the diff).
"""
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from systemd_security import MAX_EXPOSURE, exposure

REPO = Path(__file__).resolve().parents[3]
GOLDEN = REPO / 'tests' / 'golden'
BIN = Path(sys.executable).parent
MODELS = ('kimi-k25-int4', 'kimi-k25-nvfp4', 'minimax-m25', 'glm5-nvfp4', 'tiny-llama-a')
API_KEY = 'golden-secret-4711'
# One inventory host per model or per bad-input case, all on the local connection: one ansible-playbook
# run covers them all in parallel, and a host that fails does not stop the others.
PLAYBOOK = """
- hosts: all
  connection: local
  gather_facts: false
  tasks:
    - name: Render the unit
      ansible.builtin.include_role:
        name: llmfleet.vllm.service_deploy
        tasks_from: render
"""


def run_hosts(tmp_path, hosts, *args):
    """Run the render playbook; hosts: {inventory name: role variables}.

    Returns {rc, raw (stdout), stats: {host: {ok, changed, failed, ...}}, failures: {host: [result dicts]}}.
    """
    (tmp_path / 'render.yml').write_text(PLAYBOOK)
    inventory = {'all': {'vars': {'ansible_python_interpreter': sys.executable},
                         'hosts': {name: dict(v) for name, v in hosts.items()}}}
    (tmp_path / 'inventory.json').write_text(json.dumps(inventory))
    result = subprocess.run([str(BIN / 'ansible-playbook'), '-i', str(tmp_path / 'inventory.json'), '-f', '10',
                             str(tmp_path / 'render.yml'), *args],
                            cwd=REPO, capture_output=True, text=True, check=False,
                            env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / 'ansible.cfg'), ANSIBLE_PIPELINING='1',
                                     ANSIBLE_NOCOLOR='1', ANSIBLE_CALLBACK_RESULT_FORMAT='json',
                                     ANSIBLE_CALLBACK_FORMAT_PRETTY='0'))
    report = {'rc': result.returncode, 'raw': result.stdout + result.stderr, 'stats': {}, 'failures': {}}
    for line in result.stdout.splitlines():
        fail = re.match(r'^fatal: \[([^]]+)\]: FAILED! => (\{.*\})$', line)
        if fail:
            report['failures'].setdefault(fail.group(1), []).append(json.loads(fail.group(2)))
        recap = re.match(r'^(\S+)\s+: ((?:\w+=\d+\s*)+)$', line)
        if recap:
            report['stats'][recap.group(1)] = {k: int(v) for k, v in re.findall(r'(\w+)=(\d+)', recap.group(2))}
    return report


def host_messages(report, host):
    """Every failure message the host got."""
    return [str(failure.get('msg', '')) for failure in report['failures'].get(host, [])]


def model_hosts(root, models=MODELS, **variables):
    return {m: dict(variables, service_deploy_model=m, service_deploy_render_root=str(root)) for m in models}


# Beside the golden units, in the same run (one ansible-playbook run per set-up, not one per test: issue 41), the hosts
# of the tests below that render one variant each, every one under a root of its own.
def variant_hosts(tmp):
    return {
        'shutdown': {'service_deploy_model': 'tiny-llama-a', 'service_deploy_render_root': str(tmp / 'shutdown'),
                     'service_deploy_shutdown_timeout_s': '60'},
        'extra-device': {'service_deploy_model': 'minimax-m25', 'service_deploy_render_root': str(tmp / 'extra-device'),
                         'service_deploy_device_allow_extra': ['char-gdrdrv rw', '/dev/infiniband/rdma_cm\nUser=root rw']},
        'check-mode': {'service_deploy_model': 'minimax-m25', 'service_deploy_render_root': str(tmp / 'check-mode')},
        'fast': {'service_deploy_model': 'minimax-m25', 'service_deploy_render_root': str(tmp / 'fast')},
        'spawn': {'service_deploy_model': 'minimax-m25', 'service_deploy_render_root': str(tmp / 'spawn'),
                  'service_deploy_environment': {'VLLM_WORKER_MULTIPROC_METHOD': 'spawn'},
                  'service_deploy_unit_name': 'vllm-minimax-m25-alt.service'},
        'plain': {'service_deploy_model': 'minimax-m25', 'service_deploy_render_root': str(tmp / 'plain'),
                  'service_deploy_fast_start': 'false'},
    }


# The second run (idempotence) renders a large model's unit and the tiny one again: the same tasks as every model's.
IDEMPOTENCE_MODELS = ('kimi-k25-int4', 'tiny-llama-a')


@pytest.fixture(scope='module')
def rendered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('render')
    root = tmp / 'root'
    first = run_hosts(tmp, dict(model_hosts(root, service_deploy_api_key=API_KEY), **variant_hosts(tmp)))
    assert first['rc'] == 0, first['raw']
    second = run_hosts(tmp, model_hosts(root, IDEMPOTENCE_MODELS, service_deploy_api_key=API_KEY))
    return {'tmp': tmp, 'root': root, 'first': first, 'second': second}


@pytest.mark.parametrize('model', MODELS)
def test_unit_matches_golden(rendered, model):
    unit = (rendered['root'] / 'etc/systemd/system' / ('vllm-%s.service' % model)).read_bytes()
    golden = GOLDEN / ('vllm-%s.service' % model)
    if os.environ.get('UPDATE_GOLDEN'):
        golden.write_bytes(unit)
    assert unit == golden.read_bytes(), 'rendered unit differs from %s (UPDATE_GOLDEN=1 to accept)' % golden


def test_second_render_changes_nothing(rendered):
    assert all(stats['changed'] > 0 for stats in rendered['first']['stats'].values())
    assert set(rendered['second']['stats']) == set(IDEMPOTENCE_MODELS), rendered['second']['stats']
    assert all(stats['changed'] == 0 and stats['failed'] == 0 for stats in rendered['second']['stats'].values()), \
        rendered['second']['stats']


def test_api_key_only_in_the_root_only_environment_file(rendered):
    root = rendered['root']
    for model in MODELS:
        unit = (root / 'etc/systemd/system' / ('vllm-%s.service' % model)).read_text()
        assert API_KEY not in unit and '--api-key' not in unit
        env = root / 'etc/llmfleet' / ('vllm-%s.env' % model)
        assert 'VLLM_API_KEY="%s"\n' % API_KEY in env.read_text()
        info = env.stat()
        assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == 0
    assert API_KEY not in rendered['first']['raw']  # no_log on the environment file


def test_environment_files_carry_gpu_assignment_and_seed_nccl_settings(rendered):
    env_dir = rendered['root'] / 'etc/llmfleet'
    minimax = (env_dir / 'vllm-minimax-m25.env').read_text()
    assert 'CUDA_VISIBLE_DEVICES="0,1,2,3"\nNCCL_P2P_LEVEL="SYS"\nNCCL_PROTO="LL"\n' in minimax
    assert 'CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6,7"' in (env_dir / 'vllm-kimi-k25-int4.env').read_text()
    tiny = (env_dir / 'vllm-tiny-llama-a.env').read_text()
    assert 'CUDA_VISIBLE_DEVICES' not in tiny
    tiny_unit = (rendered['root'] / 'etc/systemd/system/vllm-tiny-llama-a.service').read_text()
    assert '--kv-cache-memory-bytes 67108864' in tiny_unit


# Run inside a mount namespace of its own with a fresh tmpfs on /dev/shm (never the host's: other processes' segments
# live there): the segments, a process holding one open and one mapping another, then the rendered script from a
# working directory holding a file a name with a newline would point `rm` at.
SHM_SCENARIO = r"""
import json, mmap, os, subprocess, sys, time
script, victim_dir, decoy_dir = sys.argv[1:4]
subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=4m', 'llmfleet-shm-test', '/dev/shm'], check=True)
names = {'stale': 'nccl-shm-stale', 'held': 'psm_held', 'mapped': 'sem.mp-mapped', 'fresh': 'sem.mp-fresh',
         'other': 'unrelated', 'newline': 'nccl-x\nvictim'}
for key, name in names.items():
    with open('/dev/shm/' + name, 'wb') as handle:
        handle.write(b'x' * 4096)
    if key != 'fresh':
        os.utime('/dev/shm/' + name, (0, 0))  # older than a minute
holder = subprocess.Popen(['sleep', '60'], stdin=open('/dev/shm/psm_held', 'rb'))
mapper = subprocess.Popen([sys.executable, '-c', 'import mmap, sys, time; f = open(sys.argv[1], "rb"); '
                           'm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); f.close(); print(1, flush=True); time.sleep(60)',
                           '/dev/shm/sem.mp-mapped'], stdout=subprocess.PIPE)
try:
    assert mapper.stdout.readline() == b'1\n'  # mapped, file descriptor closed
    # LLMFLEET_SHM_DIR, which the unit's environment file could carry, must not move the deletion elsewhere.
    out = subprocess.run([script], capture_output=True, text=True, cwd=victim_dir,
                         env=dict(os.environ, LLMFLEET_SHM_DIR=decoy_dir))
finally:
    for proc in (holder, mapper):
        proc.kill()
        proc.wait()
print(json.dumps({'rc': out.returncode, 'stdout': out.stdout, 'stderr': out.stderr, 'shm': sorted(os.listdir('/dev/shm')),
                  'victim': sorted(os.listdir(victim_dir)), 'decoy': sorted(os.listdir(decoy_dir))}))
"""


def test_shm_cleanup_removes_only_unheld_stale_segments(rendered, tmp_path):
    """Issue #27 / review L6: the root cleanup read names line by line (a /dev/shm file 'nccl-x<newline>victim' made
    it run `rm -f -- victim` in its working directory) and took its directory from LLMFLEET_SHM_DIR."""
    script = rendered['root'] / 'usr/local/libexec/llmfleet/shm-cleanup'
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    victim, decoy = tmp_path / 'cwd', tmp_path / 'decoy'
    victim.mkdir()
    decoy.mkdir()
    (victim / 'victim').write_text('keep me')
    (decoy / 'nccl-decoy').write_text('keep me')
    os.utime(decoy / 'nccl-decoy', (0, 0))
    unshare = ['unshare', '--mount', '--propagation', 'private'] + (['--map-root-user'] if os.geteuid() else [])
    run = subprocess.run(unshare + [sys.executable, '-c', SHM_SCENARIO, str(script), str(victim), str(decoy)],
                         capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.splitlines()[-1])
    assert result['rc'] == 0, result
    assert result['stdout'] == 'shm-cleanup: removed stale /dev/shm/nccl-shm-stale\n', result
    assert result['shm'] == ['nccl-x\nvictim', 'psm_held', 'sem.mp-fresh', 'sem.mp-mapped', 'unrelated'], result
    assert result['victim'] == ['victim'] and result['decoy'] == ['nccl-decoy'], result
    assert 'LLMFLEET_SHM_DIR' not in script.read_text()


def test_systemd_analyze_verify_accepts_every_unit(systemd_analyze, rendered, tmp_path):
    # verify --root=R resolves ExecStart binaries and dependency units inside R: give it the rendered files, a stub
    # vLLM entry point and the host's unit directory (for sysinit.target & co). User= is not checked by verify.
    root = tmp_path / 'root'
    shutil.copytree(rendered['root'], root)
    shutil.copytree('/usr/lib/systemd/system', root / 'usr/lib/systemd/system', symlinks=True)
    for path in ('opt/vllm/bin/vllm', 'opt/vllm/bin/python3', 'bin/rm'):  # ExecStart= (fast start: python3), ExecStopPost=
        stub = root / path
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text('#!/bin/sh\n')
        stub.chmod(0o755)
    for model in MODELS:
        out = subprocess.run([systemd_analyze, 'verify', '--man=no', '--root=%s' % root,
                              '/etc/systemd/system/vllm-%s.service' % model], capture_output=True, text=True, check=False)
        assert out.returncode == 0 and out.stderr == '', (model, out.stderr)


def test_systemd_analyze_verify_catches_a_broken_unit(systemd_analyze, rendered, tmp_path):
    root = tmp_path / 'root'
    shutil.copytree(rendered['root'], root)
    shutil.copytree('/usr/lib/systemd/system', root / 'usr/lib/systemd/system', symlinks=True)
    # no stub of the venv's python3 (the fast start launcher's interpreter) this time
    out = subprocess.run([systemd_analyze, 'verify', '--man=no', '--root=%s' % root,
                          '/etc/systemd/system/vllm-minimax-m25.service'], capture_output=True, text=True, check=False)
    assert out.returncode != 0 and 'Command /opt/vllm/bin/python3 is not executable' in out.stderr


@pytest.mark.parametrize('model', MODELS)
def test_golden_unit_is_sandboxed(systemd_analyze, model):
    score, report = exposure(systemd_analyze, GOLDEN / ('vllm-%s.service' % model))
    assert score <= MAX_EXPOSURE, 'vllm-%s.service: exposure %.1f > %.1f\n%s' % (model, score, MAX_EXPOSURE, report)


def test_sandbox_keeps_what_gpu_serving_needs():
    """The relaxations the template explains stay: a better score must not cost the GPU hosts their model server."""
    for model in MODELS:
        unit = (GOLDEN / ('vllm-%s.service' % model)).read_text()
        settings = re.findall(r'^(\w+)=(.*)$', unit, re.M)
        assert ('DevicePolicy', 'closed') in settings and ('DeviceAllow', 'char-nvidia* rw') in settings  # /dev/nvidia*
        assert ('DeviceAllow', 'char-infiniband_verbs rw') in settings  # NCCL over InfiniBand
        assert ('RestrictAddressFamilies', 'AF_UNIX AF_INET AF_INET6 AF_NETLINK') in settings  # NCCL
        names = {name for name, _value in settings}
        # JIT (torch.compile, Triton), /dev/shm and /dev/nvidia*, the network, real users, other services' segments
        assert not names & {'MemoryDenyWriteExecute', 'PrivateDevices', 'PrivateNetwork', 'IPAddressDeny', 'PrivateUsers',
                            'ProcSubset', 'RemoveIPC', 'InaccessiblePaths'}, model
        denied = ' '.join(v for n, v in settings if n == 'SystemCallFilter')
        assert '@resources' not in denied and '@debug' not in denied and '@system-service' not in denied  # deny list only
        assert '%C/llmfleet-vllm' in dict(settings)['WorkingDirectory'] and ('ProtectSystem', 'strict') in settings
        # JIT caches kept across starts (PrivateTmp= empties /tmp, Inductor's default): issue 45 item 0.
        assert ('Environment', 'TORCHINDUCTOR_CACHE_DIR=%C/llmfleet-vllm/torchinductor '
                'TRITON_CACHE_DIR=%C/llmfleet-vllm/.triton/cache') in settings, model


def test_extra_device_allow_entries(systemd_analyze, rendered):
    unit_path = rendered['tmp'] / 'extra-device/etc/systemd/system/vllm-minimax-m25.service'
    unit = unit_path.read_text()
    assert 'DeviceAllow=char-nvidia* rw\nDeviceAllow=char-infiniband_verbs rw\nDeviceAllow=char-gdrdrv rw\n' \
           'DeviceAllow=/dev/infiniband/rdma_cm User=root rw\n' in unit  # one entry is one line, whatever it holds
    assert re.findall(r'^User=.*$', unit, re.M) == ['User=vllm']
    assert exposure(systemd_analyze, unit_path)[0] <= MAX_EXPOSURE


def test_shutdown_timeout_lets_requests_finish_and_systemd_waits_longer(rendered):
    """-e service_deploy_shutdown_timeout_s=60 (a string): vLLM waits 60 s for requests in flight after SIGTERM, and
    systemd's stop timeout covers that wait plus the engine's teardown."""
    unit = (rendered['tmp'] / 'shutdown/etc/systemd/system/vllm-tiny-llama-a.service').read_text()
    assert '    --shutdown-timeout 60\n' in unit and re.findall(r'^TimeoutStopSec=.*$', unit, re.M) == ['TimeoutStopSec=180']
    assert '--shutdown-timeout' not in (GOLDEN / 'vllm-tiny-llama-a.service').read_text()


def _entry(name):
    from ansible_collections.llmfleet.vllm.plugins.filter.catalog import catalog_entry
    return catalog_entry(name)


BAD_CASES = [
    ({'service_deploy_models_extra': {'minimax-m25': {'serving': {'tensor_parallel_size': 0}}}},
     "model 'minimax-m25': serving.tensor_parallel_size must be a positive integer, got 0"),
    ({'service_deploy_models_extra': {'minimax-m25': {'port': 99999}}},
     "model 'minimax-m25': port must be an integer port in 1024..65535 (vLLM runs without privileges: none below 1024), got 99999"),
    ({'service_deploy_models_extra': {'minimax-m25': {'serving': {'extra_args': ['--api-key', 'x']}}}},
     '--api-key must not be passed on the command line'),
    ({'service_deploy_models_extra': {'minimax-m25': {'serving': {'extra_args': ['--api_key', 'x']}}}},
     '--api-key must not be passed on the command line (extra_args has --api_key)'),
    ({'service_deploy_port': 80}, 'port 80 in 1024..65535 (vLLM runs without privileges'),
    ({'service_deploy_profile': 'tp16'}, "model 'minimax-m25' has no serving profile 'tp16'; profiles: tp8-ep"),
    ({'service_deploy_gpu_ids': [0, 1]}, 'service_deploy_gpu_ids [0, 1] must be 4 distinct GPU indexes'),
    ({'service_deploy_gpu_ids': [0, 1, 1, 2]}, 'must be 4 distinct GPU indexes'),
    ({'service_deploy_gpu_facts': {'gpu_count': 2, 'gpu_memory_mib': 97887, 'nvlink': False}},
     'minimax-m25: needs 4 GPUs (TP 4 x PP 1 x DP 1), host has 2'),
    ({'service_deploy_state': 'running'}, 'service_deploy_state'),
    ({'service_deploy_unit_name': '../vllm-x.service'}, 'service_deploy_unit_name "../vllm-x.service" must be empty or NAME.service'),
    ({'service_deploy_fast_start_hold_s': 0}, 'service_deploy_fast_start_hold_s 0 a whole number of seconds above 0'),
    ({'service_deploy_fast_start_prefetch_ram_fraction': 1.5}, 'service_deploy_fast_start_prefetch_ram_fraction 1.5 in 0..1'),
    # A caller's entry (the pivot passes the one it looked up) must be the model's.
    ({'service_deploy_entry': _entry('kimi-k25-int4')},
     'service_deploy_entry is the catalog entry of kimi-k25-int4, not of service_deploy_model minimax-m25'),
]


@pytest.fixture(scope='module')
def bad_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('bad')
    hosts = {'case%d' % i: dict(variables, service_deploy_model='minimax-m25', service_deploy_render_root=str(tmp / ('root%d' % i)))
             for i, (variables, _message) in enumerate(BAD_CASES)}
    hosts['unknown'] = {'service_deploy_model': 'kimi-k3', 'service_deploy_render_root': str(tmp / 'root-unknown')}
    hosts['good'] = {'service_deploy_model': 'minimax-m25', 'service_deploy_render_root': str(tmp / 'root-good')}
    hosts['given'] = {'service_deploy_model': 'minimax-m25', 'service_deploy_entry': _entry('minimax-m25'),
                      'service_deploy_render_root': str(tmp / 'root-given')}
    return tmp, run_hosts(tmp, hosts)


@pytest.mark.parametrize('case', range(len(BAD_CASES)))
def test_bad_input_fails_clearly_and_writes_nothing(bad_runs, case):
    tmp, report = bad_runs
    message = BAD_CASES[case][1]
    assert report['stats']['case%d' % case]['failed'] == 1
    assert any(message in m for m in host_messages(report, 'case%d' % case)), host_messages(report, 'case%d' % case)
    root = tmp / ('root%d' % case)
    assert not root.exists() or not any(p.is_file() for p in root.rglob('*'))


def test_unknown_model_lists_the_catalog(bad_runs):
    tmp, report = bad_runs
    assert any("unknown model 'kimi-k3'; known models: glm5-fp8, glm5-nvfp4, kimi-k25-int4" in m for m in host_messages(report, 'unknown'))
    assert not (tmp / 'root-unknown').exists()
    # the same run rendered the good host: failures stay per host
    assert report['stats']['good']['failed'] == 0 and (tmp / 'root-good/etc/systemd/system/vllm-minimax-m25.service').is_file()


def test_check_mode_shows_the_unit_diff_and_writes_nothing(rendered, tmp_path):
    root = rendered['tmp'] / 'check-mode'
    unit = root / 'etc/systemd/system/vllm-minimax-m25.service'
    before = unit.read_bytes()
    report = run_hosts(tmp_path, {'check-mode': {
        'service_deploy_model': 'minimax-m25', 'service_deploy_render_root': str(root),
        'service_deploy_models_extra': {'minimax-m25': {'serving': {'max_model_len': 4096}}}}}, '--check', '--diff')
    assert report['rc'] == 0, report['raw']
    assert report['stats']['check-mode']['changed'] == 1 and unit.read_bytes() == before
    assert '+    --max-model-len 4096 \\\n' in report['raw']


def test_an_entry_given_by_the_caller_renders_what_the_lookup_does(bad_runs):
    tmp, report = bad_runs
    unit = 'etc/systemd/system/vllm-minimax-m25.service'
    assert report['stats']['given']['failed'] == 0
    assert (tmp / 'root-given' / unit).read_bytes() == (tmp / 'root-good' / unit).read_bytes()


def test_fast_start_runs_vllm_behind_the_launcher_with_fork_and_false_restores_vllm_serve(systemd_analyze, rendered):
    """Issue #45: the default unit starts behind vllm-launch.py with VLLM_WORKER_MULTIPROC_METHOD=fork (the catalog
    or service_deploy_environment may set another method); its hold file is root's and removed by every stop; exit 3
    (a held start nobody let go) is not restarted. -e service_deploy_fast_start=false (a string) writes `vllm serve`
    as before. Both within the sandbox's exposure limit."""
    root = rendered['tmp']
    fast = (root / 'fast/etc/systemd/system/vllm-minimax-m25.service').read_text()
    exec_start = re.search(r'^ExecStart=((?:.*\\\n)*.*)$', fast, re.M).group(1).replace('\\\n', ' ')
    launcher_argv = exec_start.split(' -- ')[0].split()
    assert launcher_argv == [
        '/opt/vllm/bin/python3', '/usr/local/libexec/llmfleet/vllm-launch.py',
        '--run-dir', '/run/llmfleet-launch/vllm-minimax-m25', '--hold-file', '/run/llmfleet-launch/vllm-minimax-m25.hold',
        '--wait-s', '900', '--prefetch', '/srv/models/minimax-m25', '--serve-link', '/var/lib/llmfleet-serve/minimax-m25',
        '--serve-target', '/srv/models/minimax-m25', '--prefetch-ram-fraction', '0.5'], exec_start
    assert ' -- /opt/vllm/bin/vllm serve /var/lib/llmfleet-serve/minimax-m25 ' in re.sub(r'\s+', ' ', exec_start)
    settings = re.findall(r'^(\w+)=(.*)$', fast, re.M)
    assert ('RuntimeDirectory', 'llmfleet-launch/vllm-minimax-m25') in settings
    assert ('ExecStopPost', '+/bin/rm -f /run/llmfleet-launch/vllm-minimax-m25.hold') in settings
    assert ('RestartPreventExitStatus', '3 4') in settings
    # vLLM serves one path per model (its compile cache is keyed on it), pointed at this unit's revision as root first.
    assert ('ExecStartPre', '+/usr/local/libexec/llmfleet/serve-link /var/lib/llmfleet-serve/minimax-m25 '
            '/srv/models/minimax-m25') in settings
    assert (root / 'fast/usr/local/libexec/llmfleet/vllm-launch.py').read_text() == \
        (REPO / 'roles/service_deploy/files/vllm-launch.py').read_text()
    assert 'VLLM_WORKER_MULTIPROC_METHOD="fork"' in (root / 'fast/etc/llmfleet/vllm-minimax-m25.env').read_text()
    spawn_env = (root / 'spawn/etc/llmfleet/vllm-minimax-m25-alt.env').read_text()
    assert 'VLLM_WORKER_MULTIPROC_METHOD="spawn"' in spawn_env and 'fork' not in spawn_env
    alt = (root / 'spawn/etc/systemd/system/vllm-minimax-m25-alt.service').read_text()
    assert 'RuntimeDirectory=llmfleet-launch/vllm-minimax-m25-alt\n' in alt and 'SyslogIdentifier=vllm-minimax-m25-alt' in alt
    plain = (root / 'plain/etc/systemd/system/vllm-minimax-m25.service').read_text()
    assert re.search(r'^ExecStart=/opt/vllm/bin/vllm serve /srv/models/minimax-m25 ', plain, re.M), plain
    assert not re.search(r'^(RuntimeDirectory|ExecStopPost|RestartPreventExitStatus)=', plain, re.M)
    assert 'serve-link' not in plain
    assert 'VLLM_WORKER_MULTIPROC_METHOD' not in (root / 'plain/etc/llmfleet/vllm-minimax-m25.env').read_text()
    assert not (root / 'plain/usr/local/libexec/llmfleet/vllm-launch.py').exists()
    for unit_path in (root / 'fast/etc/systemd/system/vllm-minimax-m25.service',
                      root / 'plain/etc/systemd/system/vllm-minimax-m25.service'):
        assert exposure(systemd_analyze, unit_path)[0] <= MAX_EXPOSURE
