"""roles/service_deploy/files/vllm-launch.py as its unit runs it (a real process): a held start imports, reads the
weights into the page cache within its RAM budget, says it is armed and waits for its hold file to go; an unheld start
goes at once; a hold nobody lifts ends with exit status 3. The vLLM CLI it hands over to is a stand-in package here
(`vllm.entrypoints.cli.main` writing its argv); the CPU test bed runs the real one behind every pivot."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
LAUNCHER = REPO / 'roles' / 'service_deploy' / 'files' / 'vllm-launch.py'
STAND_IN_CLI = '''import json, os, sys
def main():
    with open(os.environ["STAND_IN_OUT"], "w") as handle:
        json.dump({"argv": sys.argv, "method": os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")}, handle)
    return 0
'''


def stand_in_vllm(tmp_path):
    pkg = tmp_path / 'site' / 'vllm' / 'entrypoints' / 'cli'
    pkg.mkdir(parents=True)
    for init in (tmp_path / 'site' / 'vllm', pkg.parent, pkg):
        (init / '__init__.py').write_text('')
    (pkg / 'main.py').write_text(STAND_IN_CLI)
    return tmp_path / 'site'


def launch(tmp_path, *own, weights=None, env=None):
    run_dir = tmp_path / 'run'
    weights = weights or tmp_path / 'weights'
    weights.mkdir(exist_ok=True)
    (weights / 'model-00001-of-00001.safetensors').write_bytes(os.urandom(3 * 1024 * 1024))
    (weights / '.cache').mkdir(exist_ok=True)
    (weights / '.cache' / 'skipped').write_bytes(b'x' * 1000)
    argv = [sys.executable, str(LAUNCHER), '--run-dir', str(run_dir), *own, '--prefetch', str(weights), '--',
            '/opt/vllm/bin/vllm', 'serve', str(weights), '--port', '8001']
    environ = dict(os.environ, PYTHONPATH=str(stand_in_vllm(tmp_path)), STAND_IN_OUT=str(tmp_path / 'cli.json'),
                   VLLM_WORKER_MULTIPROC_METHOD='fork', **(env or {}))
    return subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=environ), run_dir


def events(stderr):
    return [json.loads(line.split(': ', 1)[1]) for line in stderr.splitlines() if line.startswith('llmfleet-launch: ')]


def wait_for(path, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, path
        time.sleep(0.05)


def test_a_held_start_reads_the_weights_waits_for_its_hold_to_go_then_hands_over(tmp_path):
    hold = tmp_path / 'unit.hold'
    hold.write_text('')
    proc, run_dir = launch(tmp_path, '--hold-file', str(hold), '--wait-s', '120', '--prefetch-ram-fraction', '0.5')
    wait_for(run_dir / 'armed')
    armed = json.loads((run_dir / 'armed').read_text())
    assert armed['held'] is True and armed['prefetch_bytes'] == 3 * 1024 * 1024 and armed['prefetch_files'] == 1
    time.sleep(0.5)
    assert proc.poll() is None and not (tmp_path / 'cli.json').exists()  # still held
    released_at = time.monotonic()
    hold.unlink()
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    went = json.loads((run_dir / 'went').read_text())
    assert went['held'] is True and went['waited_s'] >= 0.5
    assert abs(went['monotonic_s'] - released_at) < 1.0  # the go is the hold's removal (polled every 20 ms)
    cli = json.loads((tmp_path / 'cli.json').read_text())
    assert cli == {'argv': ['vllm', 'serve', str(tmp_path / 'weights'), '--port', '8001'], 'method': 'fork'}
    assert [e['event'] for e in events(err)] == ['imported', 'prefetched', 'armed', 'go']


def test_an_unheld_start_goes_at_once_without_reading_the_weights(tmp_path):
    proc, run_dir = launch(tmp_path, '--hold-file', str(tmp_path / 'absent.hold'), '--wait-s', '120')
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not (run_dir / 'armed').exists() and json.loads((run_dir / 'went').read_text())['held'] is False
    assert [e['event'] for e in events(err)] == ['imported', 'go']


def test_a_hold_left_by_a_start_that_never_ran_holds_nothing(tmp_path):
    """A hold written an hour ago (systemd refused that start, or the controller was killed before it): the next
    start of the unit (a boot, a rollback) goes at once and says why."""
    stale = tmp_path / 'unit.hold'
    stale.write_text('')
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    proc, run_dir = launch(tmp_path, '--hold-file', str(stale), '--wait-s', '120')
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads((run_dir / 'went').read_text())['held'] is False
    assert [e['event'] for e in events(err)] == ['stale_hold', 'imported', 'go'] and events(err)[0]['age_s'] >= 3599


def test_a_hold_nobody_lifts_ends_with_status_3_and_weights_over_the_ram_budget_are_not_read(tmp_path):
    hold = tmp_path / 'unit.hold'
    hold.write_text('')
    # A fraction of MemAvailable no 3 MiB fits in: said, not read.
    proc, run_dir = launch(tmp_path, '--hold-file', str(hold), '--wait-s', '1', '--prefetch-ram-fraction', '0.0000001')
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    armed = json.loads((run_dir / 'armed').read_text())
    assert armed['prefetch_bytes'] == 0 and 'over the' in armed['prefetch_skipped'], armed
    assert events(err)[-1]['event'] == 'gave_up' and not (run_dir / 'went').exists()
    assert not (tmp_path / 'cli.json').exists()


def test_a_start_whose_serving_link_was_moved_while_held_fails_with_status_4(tmp_path):
    """The unit points the model's serving link at its revision before it starts; the old unit restarted meanwhile
    would point it back: the held start then refuses to serve another revision under its name."""
    serve_link = REPO / 'roles' / 'service_deploy' / 'files' / 'serve-link'
    link = tmp_path / 'models' / '.llmfleet-serve' / 'm'
    new, old = tmp_path / 'weights', tmp_path / 'old-revision'
    new.mkdir()
    old.mkdir()
    subprocess.run(['sh', str(serve_link), str(link), str(new)], check=True)
    assert os.readlink(link) == str(new) and oct(link.parent.stat().st_mode & 0o777) == '0o755'
    strict = subprocess.run(['sh', '-c', 'umask 077; sh "$0" "$1" "$2"', str(serve_link), str(tmp_path / 'u' / 'm'), str(new)],
                            check=True)  # the unit's UMask=0077: what the script creates stays traversable
    assert strict.returncode == 0 and oct((tmp_path / 'u').stat().st_mode & 0o777) == '0o755'
    refused = subprocess.run(['sh', str(serve_link), 'relative/link', str(new)], capture_output=True, text=True,
                             check=False)
    assert refused.returncode == 2 and 'LINK must be absolute' in refused.stderr
    assert subprocess.run(['sh', str(serve_link), str(link), str(tmp_path / 'absent')], check=False).returncode == 2
    assert os.readlink(link) == str(new)
    hold = tmp_path / 'unit.hold'
    hold.write_text('')
    proc, run_dir = launch(tmp_path, '--hold-file', str(hold), '--wait-s', '120', '--serve-link', str(link),
                           '--serve-target', str(new))
    wait_for(run_dir / 'armed')
    subprocess.run(['sh', str(serve_link), str(link), str(old)], check=True)  # the old unit started again
    hold.unlink()
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 4, err
    assert events(err)[-1] == dict(events(err)[-1], event='link_moved', want=str(new), found=str(old))
    assert not (run_dir / 'went').exists() and not (tmp_path / 'cli.json').exists()


def test_the_test_beds_standin_server_serves_behind_the_launcher_once_released(tmp_path):
    # tests/standin/vllm (the STAND-IN the test bed may run instead of vLLM for tests of the collection's own logic)
    # through the launcher as a unit runs it: held, released, then serving on its port.
    import socket
    import urllib.request
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    model = tmp_path / 'model'
    model.mkdir()
    (model / 'config.json').write_text('{"max_position_embeddings": 512}')
    hold = tmp_path / 'unit.hold'
    hold.write_text('')
    argv = [sys.executable, str(LAUNCHER), '--run-dir', str(tmp_path / 'run'), '--hold-file', str(hold), '--wait-s', '60',
            '--', '/opt/vllm-standin/bin/vllm', 'serve', str(model), '--host', '127.0.0.1', '--port', str(port),
            '--served-model-name', 'chat', '--max-num-seqs', '4']
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO / 'tests' / 'standin')))
    try:
        wait_for(tmp_path / 'run' / 'armed')
        hold.unlink()
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None and time.monotonic() < deadline
            try:
                with urllib.request.urlopen('http://127.0.0.1:%d/v1/models' % port, timeout=2) as resp:
                    assert [m['id'] for m in json.load(resp)['data']] == ['chat']
                break
            except OSError:
                time.sleep(0.05)
        assert (tmp_path / 'run' / 'went').exists()
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_an_armed_file_an_earlier_start_left_is_not_this_starts(tmp_path):
    """wait-ready.py (the arm's wait): a unit rewritten without the launcher (-e llmfleet_fast_start=false) has no
    RuntimeDirectory=, so its stop keeps the launcher's directory of the start before; the next fast start's wait must
    not take that start's `armed` for its own. Found on the H100 (lease 5): the pivot stopped the old model 6 s before
    the new launcher had imported vLLM, and that wait was downtime."""
    import importlib.util
    spec = importlib.util.spec_from_file_location('wait_ready', REPO / 'roles' / 'service_deploy' / 'files' / 'wait-ready.py')
    wait_ready = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wait_ready)
    armed = tmp_path / 'armed'
    wait_ready.main_pid = lambda unit: 4242
    assert not wait_ready.healthy('file://%s' % armed, 'vllm-x.service')
    armed.write_text(json.dumps({'pid': 1717, 'armed_at': 1.0}))
    assert not wait_ready.healthy('file://%s' % armed, 'vllm-x.service')
    armed.write_text(json.dumps({'pid': 4242, 'armed_at': 2.0}))
    assert wait_ready.healthy('file://%s' % armed, 'vllm-x.service')
