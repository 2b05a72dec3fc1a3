"""The gateway's window of a stop-then-start, counted from HAProxy's own lines (issue 44 item 3): the access log's
format is the one recorded on the H100 (tests/fixtures/nvidia/h100-pivot-hold-journal-gateway.txt), the hold's own
line the one roles/gateway/files/llmfleet-hold.lua writes."""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from ansible_collections.llmfleet.vllm.plugins.module_utils.gateway_window import percentile, window_stats

REPO = Path(__file__).resolve().parents[4]
RECORDED = REPO / 'tests' / 'fixtures' / 'nvidia' / 'h100-pivot-hold-journal-gateway.txt'
LUA = REPO / 'roles' / 'gateway' / 'files' / 'llmfleet-hold.lua'
CLOSED, OPENED = 1000.0, 1040.0


def access(backend, status):
    """An access log line of the recorded format, for another backend and status."""
    line = next(line for line in RECORDED.read_text().splitlines() if 'llmfleet_held/held' in line)
    message = line.split(']: ', 1)[1]
    assert ' llmfleet_held/held ' in message and ' 200 ' in message, message
    return message.replace('llmfleet_held/held', backend).replace(' 200 ', ' %d ' % status, 1)


def test_held_and_refused_requests_of_the_slot_within_its_window():
    recorded = RECORDED.read_text()
    assert '[WARNING]  (3808) : Server slot_default/port8000 is going DOWN' in recorded \
        and ']: Server slot_default/port8000 is going DOWN' in recorded
    entries = [
        (CLOSED + 1, 'llmfleet-hold slot=default held 39.0 s'),
        (OPENED + 0.2, 'llmfleet-hold slot=default held 38.5 s'),
        (OPENED + 0.3, 'llmfleet-hold slot=default held 1.2 s'),
        (OPENED + 4.0, 'llmfleet-hold slot=default held 20.0 s'),  # let go as the window opened, logged late
        (OPENED + 9.0, 'llmfleet-hold slot=default held 9.9 s'),  # past the settle time: another window's
        (CLOSED - 5, 'llmfleet-hold slot=default held 3.0 s'),  # before the window
        (CLOSED + 2, 'llmfleet-hold slot=other held 30.0 s'),  # another slot
        (CLOSED + 3, 'llmfleet-hold slot=default refused: 1 held already (gateway_hold_max)'),
        (CLOSED + 3, access('slot_default/<NOSRV>', 503)),  # that refusal's access line
        (CLOSED + 4, access('slot_default/<NOSRV>', 503)),  # no hold (e.g. pivot_hold=false)
        (CLOSED + 5, access('slot_other/<NOSRV>', 503)),
        (CLOSED + 6, access('slot_default/port8000', 200)),
        (OPENED + 1, access('llmfleet_held/held', 200)),
        (OPENED + 2, access('slot_default/<NOSRV>', 503)),  # after the window
        (CLOSED + 7, 'Server slot_default/port8000 is going DOWN for maintenance. 0 active and 0 backup servers left.'),
        # HAProxy 2.6 prints each Lua log line to its stderr too, which the journal keeps under the same identifier
        # (as its warnings, twice in the recording): that copy is not a second request.
        (CLOSED + 1, '[info] 340/152024 (6926) : llmfleet-hold slot=default held 39.0 s'),
        # /health is never held and answers 503 while the slot is closed: a probe, not a client refused.
        (CLOSED + 8, access('slot_default/<NOSRV>', 503).replace('POST /v1/completions', 'GET /health')),
    ]
    stats = window_stats(entries, 'default', CLOSED, OPENED)
    assert stats == {'closed_s': 40.0, 'held_requests': 4, 'held_wait_max_s': 39.0, 'held_wait_p95_s': 39.0,
                     'refused_requests': 2, 'refused_at_bound': 1}, stats


def test_a_window_with_nothing_held_or_refused():
    assert window_stats([(CLOSED + 1, access('slot_default/port8000', 200))], 'default', CLOSED, OPENED + 0.04) == {
        'closed_s': 40.0, 'held_requests': 0, 'held_wait_max_s': None, 'held_wait_p95_s': None, 'refused_requests': 0,
        'refused_at_bound': 0}


def test_p95_is_the_nearest_rank():
    assert percentile(list(range(1, 21)), 0.95) == 19 and percentile([5.0], 0.95) == 5.0 and percentile([], 0.95) is None


def test_the_lua_writes_the_lines_counted():
    """The hold's line is what window_stats reads: the Lua's text for each verdict."""
    lua = LUA.read_text()
    assert 'core.Info("llmfleet-hold slot=" .. slot .. " " .. text)' in lua
    for text in ('"held " .. waited', '"refused: " .. hold_max', '"refused: waited " .. waited'):
        assert 'verdict(txn, slot, %s' % text in lua, text


def test_the_module_reads_the_journal_of_the_window(tmp_path):
    """gateway_window runs journalctl for the window's whole seconds and counts its JSON entries (a journalctl on PATH
    that answers with entries: the real one's -o json fields; there is no journal of HAProxy here)."""
    calls = tmp_path / 'calls'
    entries = [{'__REALTIME_TIMESTAMP': str(int((CLOSED + 2) * 1e6)), 'MESSAGE': 'llmfleet-hold slot=default held 38.0 s'},
               {'__REALTIME_TIMESTAMP': str(int((CLOSED + 3) * 1e6)),
                'MESSAGE': list(access('slot_default/<NOSRV>', 503).encode())},  # journald's bytes form
               {'__REALTIME_TIMESTAMP': 'x', 'MESSAGE': 'no time'}]
    fake = tmp_path / 'bin' / 'journalctl'
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "$@" >> %s\ncat <<"EOF"\n%s\nnot json\nEOF\n' % (calls, '\n'.join(map(json.dumps, entries))))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    args = json.dumps({'ANSIBLE_MODULE_ARGS': {'slot': 'default', 'closed_at': CLOSED + 0.5, 'opened_at': OPENED + 0.5}})
    done = subprocess.run([sys.executable, '-m', 'ansible_collections.llmfleet.vllm.plugins.modules.gateway_window', args],
                          capture_output=True, text=True, check=False,
                          env=dict(os.environ, PATH='%s:%s' % (fake.parent, os.environ['PATH']),
                                   PYTHONPATH=str(REPO / '.ansible' / 'collections')))
    result = json.loads(done.stdout)
    assert (result['closed_s'], result['held_requests'], result['refused_requests'], result['changed']) == (40.0, 1, 1, False), result
    assert calls.read_text().split() == ['--no-pager', '-o', 'json', '-t', 'haproxy', '--since', '@999', '--until', '@1047']
