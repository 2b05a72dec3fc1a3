# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The models root as a disk: its free bytes, the model directories in it (prune candidates, oldest first) and the
model directories each host sharing it serves. The one reading of a models root that both disk planners' callers use
(llmfleet.vllm.hf_snapshot's space check, the pivot's llmfleet.vllm.models_root_usage); the plan itself is
fit_check.disk_plan.

Hosts that share a root (llmfleet_storage_group) each keep a record ROOT/.llmfleet/serving/<host>.json (the pivot:
{host, dirs: [names under ROOT]}; records of older releases name one {model}); roles/ray_cluster keeps
<host>.ray.json the same way (serving_record_path names both). Dot dirs are never model dirs.
"""
from __future__ import annotations

import glob
import json
import os

SERVING_RECORDS = os.path.join('.llmfleet', 'serving')


def existing_ancestor(path):
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def free_bytes(path):
    """Bytes an unprivileged writer may still use on the filesystem of path (or of its nearest existing parent)."""
    st = os.statvfs(existing_ancestor(path))
    return st.f_bavail * st.f_frsize


def dir_usage(path):
    """Bytes allocated under path (st_blocks, symlinks not followed) and number of files."""
    total, count = 0, 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            total += st.st_blocks * 512 if hasattr(st, 'st_blocks') else st.st_size
            count += 1
    return total, count


def model_dirs(root, exclude=None):
    """[{path, size_bytes, mtime}] of the model directories directly under root, oldest first by the directory's mtime
    (model_fetch writes its manifest there last), then by path: not dot dirs, symlinks or ``exclude`` (the download
    target). Only read: nothing is deleted here."""
    exclude = os.path.realpath(exclude) if exclude else None
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(root, name)
        if name.startswith('.') or not os.path.isdir(path) or os.path.islink(path) or os.path.realpath(path) == exclude:
            continue
        found.append({'path': path, 'size_bytes': dir_usage(path)[0], 'mtime': os.stat(path).st_mtime})
    found.sort(key=lambda c: (c['mtime'], c['path']))
    return found


def serving_record_path(root, host, variant=None):
    """ROOT/.llmfleet/serving/<host>.json, or <host>.<variant>.json for another way of serving (variant ray): the one
    place a serving record's path is spelt; served_by reads every record there."""
    if not host or '/' in host or host.startswith('.'):
        raise ValueError('serving_record_path: host must be an inventory host name, got %r' % (host,))
    if variant is not None and (not variant or not variant.isalnum()):
        raise ValueError('serving_record_path: variant must be letters and digits, got %r' % (variant,))
    name = host + ('.' + variant if variant else '') + '.json'
    return os.path.join(os.path.normpath(root), SERVING_RECORDS, name)


def served_by(root):
    """{record name (file name without .json): [dir names under root]} of the serving records, those naming none left
    out; an unreadable record names none."""
    found = {}
    for record in sorted(glob.glob(os.path.join(root, SERVING_RECORDS, '*.json'))):
        try:
            with open(record) as handle:
                data = json.load(handle)
            dirs = [str(d) for d in data['dirs']] if 'dirs' in data else [str(data['model'])]
        except (OSError, ValueError, KeyError, TypeError):
            dirs = []
        if dirs:
            found[os.path.basename(record)[:-len('.json')]] = dirs
    return found


def usage(root):
    """{free_bytes, candidates, served_by} of a models root (which may not exist yet)."""
    return {'free_bytes': free_bytes(root), 'candidates': model_dirs(root), 'served_by': served_by(root)}
