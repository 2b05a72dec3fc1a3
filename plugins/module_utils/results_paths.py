# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The layout of the controller's results folder (the lookup llmfleet.vllm.results_dir finds the folder): the one
owner of where a host's pivot records, golden answers and the fleet's revision locks lie, which the pivot writes and the rollout, its canary gate,
the parity check, the benches and the tests read; and of how a folder of JSON records is read (read_json_files)."""
from __future__ import annotations

import json
import os
import time

PIVOTS_DIR = 'pivots'
LATEST_SUFFIX = '-latest.json'
PARITY_DIR = 'parity'
LOCKS_DIR = 'locks'
HOST_RECORD_STAMP = '%Y%m%dT%H%M%SZ'
ROLLED_BACK_SUFFIX = '-rolled-back'


def pivot_records_dir(results_dir, host):
    """<results>/<host>/pivots: the folder of the host's pivot records."""
    return os.path.join(str(results_dir), str(host), PIVOTS_DIR)


def pivot_record_path(results_dir, host, model):
    """<results>/<host>/pivots/<model>-latest.json: the record of the host's latest pivot to ``model``."""
    if not model or '/' in str(model):
        raise ValueError('a pivot record is named after a catalog model name (no "/"); got %s' % json.dumps(model))
    return os.path.join(pivot_records_dir(results_dir, host), str(model) + LATEST_SUFFIX)


def host_pivot_record_name(model, ended_at, rolled_back=False):
    """<UTC stamp of ended_at>-<model>[-rolled-back].json: a pivot's record on its host, in the state dir's records
    folder. Named after the end the record itself holds (the new model ready, as the host timed it, or the previous one
    serving again after a rollback, as the controller did), which observability.record_time reads back."""
    if not model or '/' in str(model):
        raise ValueError('a pivot record is named after a catalog model name (no "/"); got %s' % json.dumps(model))
    try:
        stamp = time.strftime(HOST_RECORD_STAMP, time.gmtime(float(ended_at)))
    except (TypeError, ValueError, OverflowError, OSError):
        raise ValueError('a pivot record is named after when the pivot ended (Unix seconds); got %s' % json.dumps(ended_at))
    return '%s-%s%s.json' % (stamp, model, ROLLED_BACK_SUFFIX if rolled_back else '')


def parity_record_path(results_dir, host, model, digest):
    """<results>/<host>/parity/<model>-<digest>.json: the golden answers of ``model`` on the host under one parity key."""
    if not model or '/' in str(model):
        raise ValueError('a parity record is named after a catalog model name (no "/"); got %s' % json.dumps(model))
    if not digest or not str(digest).isalnum():
        raise ValueError('a parity record is named after its key digest (letters and digits); got %s' % json.dumps(digest))
    return os.path.join(str(results_dir), str(host), PARITY_DIR, '%s-%s.json' % (model, digest))


def read_pivot_record(results_dir, host, model):
    """The record of the host's latest pivot to ``model`` (a dict)."""
    with open(pivot_record_path(results_dir, host, model), encoding='utf-8') as handle:
        return json.load(handle)


def revision_lock_path(results_dir, model):
    """<results>/locks/<model>.json: the commit every host serves ``model`` at (rollout.yml writes it)."""
    if not model or '/' in str(model):
        raise ValueError('a revision lock is named after a catalog model name (no "/"); got %s' % json.dumps(model))
    return os.path.join(str(results_dir), LOCKS_DIR, '%s.json' % model)


def jit_cache_archive_path(results_dir, model):
    """<results>/locks/<model>.jit.tar: the JIT caches a rollout's canary built for ``model``, whose manifest its
    revision lock holds (jit_cache); the fleet's hosts are seeded from it."""
    return revision_lock_path(results_dir, model)[:-len('.json')] + '.jit.tar'


def _load_json(path):
    with open(path, encoding='utf-8') as handle:
        return json.load(handle)


def read_json_files(directory, load=_load_json, broken=(OSError, ValueError)):
    """[(name, content)] of every *.json file in ``directory``, by name (no folder: []). ``load(path)`` reads one
    file; a file whose load raises one of ``broken`` is skipped, any other error is raised."""
    named = []
    if not os.path.isdir(directory):
        return named
    for name in sorted(os.listdir(directory)):
        if not name.endswith('.json'):
            continue
        try:
            named.append((name, load(os.path.join(directory, name))))
        except broken:
            continue
    return named


def read_revision_locks(results_dir):
    """{model: commit} of every revision lock in the results (none: {}); a lock that is not JSON is skipped."""
    locks = {}
    for name, lock in read_json_files(os.path.join(str(results_dir), LOCKS_DIR)):
        if isinstance(lock, dict) and lock.get('commit'):
            locks[str(lock.get('model') or name[:-len('.json')])] = str(lock['commit'])
    return locks
