# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Paths under the controller's results folder (llmfleet.vllm's module_utils results_paths owns the layout)."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.module_utils import results_paths


def pivot_records_dir(results_dir, host):
    return results_paths.pivot_records_dir(results_dir, host)


def pivot_record_path(results_dir, host, model):
    try:
        return results_paths.pivot_record_path(results_dir, host, model)
    except ValueError as exc:
        raise AnsibleFilterError('pivot_record_path: %s' % exc)


def host_pivot_record_name(model, ended_at, rolled_back=False):
    try:
        return results_paths.host_pivot_record_name(model, ended_at, rolled_back)
    except ValueError as exc:
        raise AnsibleFilterError('host_pivot_record_name: %s' % exc)


def parity_record_path(results_dir, host, model, digest):
    try:
        return results_paths.parity_record_path(results_dir, host, model, digest)
    except ValueError as exc:
        raise AnsibleFilterError('parity_record_path: %s' % exc)


def revision_lock_path(results_dir, model):
    try:
        return results_paths.revision_lock_path(results_dir, model)
    except ValueError as exc:
        raise AnsibleFilterError('revision_lock_path: %s' % exc)


def jit_cache_archive_path(results_dir, model):
    try:
        return results_paths.jit_cache_archive_path(results_dir, model)
    except ValueError as exc:
        raise AnsibleFilterError('jit_cache_archive_path: %s' % exc)


def revision_locks(results_dir):
    return results_paths.read_revision_locks(results_dir)


class FilterModule:
    def filters(self):
        return {'pivot_records_dir': pivot_records_dir, 'pivot_record_path': pivot_record_path,
                'host_pivot_record_name': host_pivot_record_name,
                'parity_record_path': parity_record_path, 'revision_lock_path': revision_lock_path,
                'revision_locks': revision_locks, 'jit_cache_archive_path': jit_cache_archive_path}
