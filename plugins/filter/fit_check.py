# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters that decide whether a catalog model fits a host: GPUs (fit_check, gpu_memory_free), disk (disk_plan,
dir_names_under) and host RAM for a sleeping model (sleep_ram_fit)."""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmfleet.vllm.plugins.module_utils import fit_check as _fit


def fit_check(entry, gpus, tensor_parallel_size=None):
    """{ok, errors, warnings, ...} for a catalog entry (from catalog_entry) on a host's GPU facts."""
    if not isinstance(entry, dict) or 'serving' not in entry or 'architecture' not in entry:
        raise AnsibleFilterError('fit_check expects a catalog entry (use llmfleet.vllm.catalog_entry), got %r' % (entry,))
    if not isinstance(gpus, dict):
        raise AnsibleFilterError('fit_check expects GPU facts {gpu_count, gpu_memory_mib, nvlink, compute_capability}'
                                 ' or the llmfleet_gpu fact, got %r' % (gpus,))
    return _fit.fit_check(entry, gpus, tensor_parallel_size)


def disk_plan(needed, free_bytes, downloaded_bytes=0, candidates=None, protect=None,
              margin_bytes=_fit.DISK_MARGIN_BYTES, margin_fraction=_fit.DISK_MARGIN_FRACTION, models_root=None, keep=None):
    """Disk plan for downloading a model; needed is a catalog entry or a number of bytes."""
    if isinstance(needed, dict):
        if needed.get('size_bytes') is None:
            raise AnsibleFilterError('model %s: size_bytes unknown, cannot plan disk space; set it in llmfleet_models_extra'
                                     % needed.get('name', '?'))
        needed = needed['size_bytes']
    return _fit.disk_plan(needed, free_bytes, downloaded_bytes, candidates, protect, margin_bytes, margin_fraction,
                          models_root=models_root, keep=keep)


def dir_names_under(paths, models_root):
    """Names of the directories in paths directly under models_root (trailing '/' on either side changes nothing)."""
    if paths is not None and (isinstance(paths, (str, dict)) or not hasattr(paths, '__iter__')):
        raise AnsibleFilterError('dir_names_under expects a list of paths, got %r' % (paths,))
    try:
        return _fit.dir_names_under(paths, models_root)
    except ValueError as exc:
        raise AnsibleFilterError('dir_names_under: %s' % exc) from exc


def gpu_memory_free(entry, gpu_facts, gpu_ids=None):
    """{ok, errors, checked} for the GPUs the model will use, from the llmfleet_gpu fact."""
    if not isinstance(entry, dict) or 'serving' not in entry:
        raise AnsibleFilterError('gpu_memory_free expects a catalog entry (use llmfleet.vllm.catalog_entry), got %r' % (entry,))
    if not isinstance(gpu_facts, dict):
        raise AnsibleFilterError('gpu_memory_free expects the llmfleet_gpu fact of llmfleet.vllm.gpu_facts, got %r' % (gpu_facts,))
    return _fit.gpu_memory_free(entry, gpu_facts, gpu_ids)


def sleep_ram_fit(weights_bytes, meminfo_text, margin_mib, model='the model'):
    """{ok, weights_mib, available_mib, margin_mib, message}: whether host RAM holds the weights of a model asleep."""
    try:
        return _fit.sleep_ram_fit(weights_bytes, meminfo_text, margin_mib, model)
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError('sleep_ram_fit: %s' % exc) from exc


class FilterModule:
    def filters(self):
        return {'fit_check': fit_check, 'disk_plan': disk_plan, 'dir_names_under': dir_names_under, 'gpu_memory_free': gpu_memory_free,
                'sleep_ram_fit': sleep_ram_fit}
