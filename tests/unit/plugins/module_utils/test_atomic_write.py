"""Durable atomic writes (plugins/module_utils/atomic_write.py; issue #27, review L9): the system calls, seen with
strace on real processes - the temp file is fsynced before the rename, the directory after it - for the helper and for
the host_slots module as Ansible runs it; and no module writes a record or state file around the helper."""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
COLLECTIONS = str(REPO / '.ansible' / 'collections')


def _strace(argv, tmp_path):
    if not shutil.which('strace'):
        pytest.fail('strace not found: install it (apt-get install strace)')
    log = tmp_path / 'strace.log'
    proc = subprocess.run(['strace', '-f', '-y', '-o', str(log), '-e', 'trace=fsync,fdatasync,rename,renameat,renameat2',
                           *argv], capture_output=True, text=True, check=False,
                          env=dict(os.environ, PYTHONPATH=COLLECTIONS))
    return proc, log.read_text().splitlines()


def _order(lines, path):
    """[('fsync', '<path fsynced>') | ('rename', '<to>')] of the calls that concern path's directory, in order."""
    directory = os.path.dirname(path)
    events = []
    for line in lines:
        sync = re.search(r'\bf(?:data)?sync\(\d+<([^>]*)>\) = 0', line)
        if sync and (sync.group(1) == directory or os.path.dirname(sync.group(1)) == directory):
            events.append(('fsync', sync.group(1)))
        move = re.search(r'\brename(?:at2?)?\(.*"([^"]+)".*"([^"]+)"', line)
        if move and ' = 0' in line:
            events.append(('rename', move.group(2)))
    return events


def _assert_durable(events, path):
    renames = [i for i, (kind, target) in enumerate(events) if kind == 'rename' and target.endswith(os.path.basename(path))]
    assert renames, events
    last = renames[-1]
    before, after = events[:last], events[last + 1:]
    assert any(kind == 'fsync' and target != os.path.dirname(path) for kind, target in before), \
        'the temp file is not fsynced before the rename: %s' % events
    assert ('fsync', os.path.dirname(path)) in after, 'the directory is not fsynced after the rename: %s' % events


def test_atomic_write_fsyncs_the_file_before_and_the_directory_after_the_rename(tmp_path):
    path = tmp_path / 'records' / 'r.json'
    code = ('from ansible_collections.llmfleet.vllm.plugins.module_utils.atomic_write import atomic_write; '
            'atomic_write(%r, %r, mode=0o640)' % (str(path), '{"a": 1}\n'))
    proc, lines = _strace([sys.executable, '-c', code], tmp_path)
    assert proc.returncode == 0, proc.stderr
    _assert_durable(_order(lines, str(path)), str(path))
    assert path.read_text() == '{"a": 1}\n' and stat.S_IMODE(path.stat().st_mode) == 0o640
    assert os.listdir(path.parent) == ['r.json']  # no temp file left


def test_atomic_write_leaves_no_temp_file_when_it_fails(tmp_path):
    from ansible_collections.llmfleet.vllm.plugins.module_utils.atomic_write import atomic_write
    target = tmp_path / 'is-a-dir'
    target.mkdir()
    (target / 'x').write_text('keep')
    with pytest.raises(OSError):
        atomic_write(str(target), 'data')
    assert sorted(os.listdir(tmp_path)) == ['is-a-dir'] and (target / 'x').read_text() == 'keep'


def test_host_slots_state_file_is_written_durably(tmp_path):
    """The host_slots module, run as Ansible runs it: slots.json fsynced, renamed, its directory fsynced."""
    state = tmp_path / 'state'
    args = {'state_dir': str(state), 'action': 'set', 'slot': 'b', 'model': 'tiny-llama-b', 'revision': '1' * 40,
            'model_dir': '/srv/models/tiny-llama-b', 'port': 8000, 'since': 5.0}
    payload = json.dumps({'ANSIBLE_MODULE_ARGS': dict(args, _ansible_check_mode=False, _ansible_diff=False)})
    proc, lines = _strace([sys.executable, '-m', 'ansible_collections.llmfleet.vllm.plugins.modules.host_slots', payload],
                          tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout)['changed'], proc.stdout + proc.stderr
    _assert_durable(_order(lines, str(state / 'slots.json')), str(state / 'slots.json'))


# Modules that write records or state: every such write goes through module_utils/atomic_write (one owner).
WRITERS = ('host_slots', 'benchmark_record', 'benchmark_power', 'throughput_check', 'benchmark_report', 'vllm_args_check')


@pytest.mark.parametrize('module', WRITERS)
def test_modules_write_records_only_through_atomic_write(module):
    tree = ast.parse((REPO / 'plugins' / 'modules' / (module + '.py')).read_text())
    direct = [node.lineno for node in ast.walk(tree)
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ('rename', 'replace')
              and isinstance(node.func.value, ast.Name) and node.func.value.id == 'os']
    assert direct == [], '%s renames files itself (lines %s): use atomic_write / replace_durably' % (module, direct)
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
               and node.module.endswith('module_utils.atomic_write')]
    assert imports, '%s does not use module_utils.atomic_write' % module
