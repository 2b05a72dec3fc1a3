# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Does a catalog entry fit a host? GPU memory, head divisibility for tensor parallelism, and disk space."""
from __future__ import annotations

MIB = 1024 ** 2
GIB = 1024 ** 3
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# Below this share of usable GPU memory left for KV cache after weights, warn (few concurrent sequences fit).
KV_HEADROOM_WARN_FRACTION = 0.1
# Space kept free after a download: the larger of these (HF cache temp files, logs, compile caches).
DISK_MARGIN_BYTES = 10 * GIB
DISK_MARGIN_FRACTION = 0.05


def _gib(n):
    return '%.1f GiB' % (n / GIB)


def host_gpus(facts):
    """{gpu_count, gpu_memory_mib, nvlink} from itself or from the llmfleet_gpu fact of llmfleet.vllm.gpu_facts
    ({gpu_count, gpus: [{memory_total_mib}], topology: {nvlink}}; the smallest GPU counts)."""
    if 'gpus' not in facts or 'gpu_memory_mib' in facts:
        return facts
    memory = [g.get('memory_total_mib') for g in facts['gpus'] if isinstance(g, dict) and g.get('memory_total_mib')]
    return {'gpu_count': facts.get('gpu_count'), 'gpu_memory_mib': min(memory) if memory else None,
            'nvlink': bool((facts.get('topology') or {}).get('nvlink'))}


def fit_check(entry, gpus, tensor_parallel_size=None):
    """Check a validated catalog entry against host GPU facts.

    gpus: {gpu_count: int, gpu_memory_mib: int (per GPU), nvlink: bool}, or the llmfleet_gpu fact (see host_gpus).
    Returns {ok, errors, warnings, gpus_needed, weights_per_gpu_bytes, usable_per_gpu_bytes}.
    """
    gpus = host_gpus(gpus)
    serving = entry['serving']
    arch = entry['architecture']
    name = entry.get('name', '?')
    tp = tensor_parallel_size or serving['tensor_parallel_size']
    pp = serving.get('pipeline_parallel_size') or 1
    dp = serving.get('data_parallel_size') or 1
    errors, warnings = [], []
    result = {'gpus_needed': tp * pp * dp, 'weights_per_gpu_bytes': None, 'usable_per_gpu_bytes': None}

    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        return dict(result, ok=False, errors=['%s: tensor_parallel_size must be a positive integer, got %r' % (name, tp)],
                    warnings=[])

    heads, kv_heads = arch['num_attention_heads'], arch['num_key_value_heads']
    if heads is None:
        warnings.append('%s: num_attention_heads unknown, tensor-parallel divisibility not checked' % name)
    elif heads % tp:
        errors.append('%s: tensor_parallel_size %d does not divide num_attention_heads %d; vLLM refuses to start'
                      ' (use a TP that divides %d)' % (name, tp, heads, heads))
    if arch['attention'] == 'mla':
        pass  # MLA caches one compressed latent per token; every TP rank keeps a full copy, no KV-head split.
    elif kv_heads is None:
        warnings.append('%s: num_key_value_heads unknown, KV-head split not checked' % name)
    elif tp <= kv_heads and kv_heads % tp:
        errors.append('%s: tensor_parallel_size %d does not divide num_key_value_heads %d; vLLM cannot split'
                      ' the KV heads evenly' % (name, tp, kv_heads))
    elif tp > kv_heads and tp % kv_heads:
        errors.append('%s: tensor_parallel_size %d exceeds num_key_value_heads %d and is not a multiple of it;'
                      ' vLLM can only replicate KV heads a whole number of times' % (name, tp, kv_heads))
    elif tp > kv_heads:
        warnings.append('%s: tensor_parallel_size %d > num_key_value_heads %d: vLLM replicates each KV head on %d GPUs,'
                        ' so KV-cache memory per GPU does not shrink beyond one head' % (name, tp, kv_heads, tp // kv_heads))

    if entry['engine'] == 'cpu':
        return dict(result, gpus_needed=0, ok=not errors, errors=errors, warnings=warnings)

    count, mem_mib = gpus.get('gpu_count'), gpus.get('gpu_memory_mib')
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        errors.append('%s: host gpu_count must be a non-negative integer, got %r' % (name, count))
    elif count < result['gpus_needed']:
        errors.append('%s: needs %d GPUs (TP %d x PP %d x DP %d), host has %d'
                      % (name, result['gpus_needed'], tp, pp, dp, count))
    if not isinstance(mem_mib, (int, float)) or isinstance(mem_mib, bool) or mem_mib <= 0:
        errors.append('%s: host gpu_memory_mib must be a positive number, got %r' % (name, mem_mib))
    elif entry['size_bytes'] is None:
        warnings.append('%s: size_bytes unknown, GPU memory fit not checked' % name)
    else:
        util = serving.get('gpu_memory_utilization') or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
        usable = int(mem_mib * MIB * util)
        per_gpu = entry['size_bytes'] // (tp * pp)
        result.update(weights_per_gpu_bytes=per_gpu, usable_per_gpu_bytes=usable)
        if per_gpu >= usable:
            errors.append('%s: weights need %s per GPU at TP %d x PP %d, only %s usable per GPU (%d MiB x %s);'
                          ' raise tensor/pipeline parallelism or gpu_memory_utilization'
                          % (name, _gib(per_gpu), tp, pp, _gib(usable), mem_mib, util))
        elif usable - per_gpu < usable * KV_HEADROOM_WARN_FRACTION:
            warnings.append('%s: only %s per GPU left for KV cache after %s of weights; expect few concurrent sequences'
                            % (name, _gib(usable - per_gpu), _gib(per_gpu)))

    if arch['attention'] == 'mla' and tp > 1 and not gpus.get('nvlink', False):
        warnings.append('%s: MLA model with tensor parallelism %d over PCIe-only GPUs (no NVLink): the per-layer'
                        ' all-reduce crosses PCIe; the hand-run Kimi-K2.5 NVFP4 at TP 8 was all-reduce bound'
                        ' (~61 tok/s single stream vs 84 tok/s for GQA MiniMax-M2.5 at TP 4)' % (name, tp))
    return dict(result, ok=not errors, errors=errors, warnings=warnings)


def disk_plan(needed_bytes, free_bytes, downloaded_bytes=0, candidates=None, protect=None,
              margin_bytes=DISK_MARGIN_BYTES, margin_fraction=DISK_MARGIN_FRACTION):
    """Plan the disk space for a download.

    needed_bytes: the model's full size; downloaded_bytes: what of it is already on disk (resume).
    candidates: [{path, size_bytes}] model dirs that may be pruned, in the order to prune them (e.g. oldest first).
    protect: paths never pruned (the serving model, the download target).
    The margin kept free is max(margin_bytes, margin_fraction x needed_bytes).
    Returns {ok, to_download_bytes, required_free_bytes, free_bytes, short_by_bytes, prune, prune_bytes,
    ok_after_prune, errors}: ok means the download fits now; prune lists the dirs that would have to go.
    """
    errors = []
    for label, value in (('needed_bytes', needed_bytes), ('free_bytes', free_bytes), ('downloaded_bytes', downloaded_bytes)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            errors.append('%s must be a non-negative integer number of bytes, got %r' % (label, value))
    protect = {p.rstrip('/') for p in protect or []}
    candidates = candidates or []
    for i, cand in enumerate(candidates):
        if not isinstance(cand, dict) or not isinstance(cand.get('path'), str) or \
                not isinstance(cand.get('size_bytes'), int) or cand['size_bytes'] < 0:
            errors.append('candidates[%d] must be {path: str, size_bytes: int >= 0}, got %r' % (i, cand))
    if errors:
        return {'ok': False, 'ok_after_prune': False, 'errors': errors, 'prune': [], 'prune_bytes': 0}

    margin = max(margin_bytes, int(needed_bytes * margin_fraction))
    to_download = max(needed_bytes - downloaded_bytes, 0)
    # Nothing to download writes nothing: a full disk must not block a re-run of a model already there.
    required = to_download + margin if to_download else 0
    short = max(required - free_bytes, 0)
    prune, freed = [], 0
    for cand in candidates:
        if freed >= short:
            break
        if cand['path'].rstrip('/') in protect:
            continue
        prune.append(cand['path'])
        freed += cand['size_bytes']
    return {
        'ok': short == 0,
        'to_download_bytes': to_download,
        'margin_bytes': margin,
        'required_free_bytes': required,
        'free_bytes': free_bytes,
        'short_by_bytes': short,
        'prune': prune if short else [],
        'prune_bytes': freed if short else 0,
        'ok_after_prune': freed >= short,
        'short_after_prune_bytes': max(short - freed, 0),
        'errors': [] if freed >= short else [
            'need %s free (%s to download + %s margin), have %s; pruning every allowed candidate frees only %s'
            % (_gib(required), _gib(to_download), _gib(margin), _gib(free_bytes), _gib(freed))],
    }


def gpu_memory_free(entry, gpu_facts, gpu_ids=None):
    """Whether the GPUs a model will use have the memory vLLM claims free right now.

    vLLM refuses to start when a GPU's free memory is below gpu_memory_utilization x total (another
    process, a dead server's leftovers). gpu_facts: the llmfleet_gpu fact; gpu_ids: the GPU indexes the
    model gets (default 0..TP x PP - 1). Returns {ok, errors, checked: [{index, free_mib, needed_mib}]}.
    """
    serving = entry['serving']
    util = serving.get('gpu_memory_utilization') or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    count = (serving.get('tensor_parallel_size') or 1) * (serving.get('pipeline_parallel_size') or 1)
    ids = list(range(count)) if gpu_ids is None else list(gpu_ids)
    by_index = {gpu.get('index'): gpu for gpu in gpu_facts.get('gpus') or []}
    errors, checked = [], []
    for index in ids:
        gpu = by_index.get(index)
        if gpu is None:
            errors.append('GPU %s is not on this host' % index)
            continue
        total, used = gpu.get('memory_total_mib'), gpu.get('memory_used_mib')
        if total is None or used is None:
            errors.append('GPU %s: memory use unknown' % index)
            continue
        needed = int(total * util)
        checked.append({'index': index, 'free_mib': total - used, 'needed_mib': needed})
        if total - used < needed:
            errors.append('GPU %s has %d MiB free, %s needs %d MiB (gpu_memory_utilization %s x %d MiB): another process'
                          ' holds %d MiB' % (index, total - used, entry.get('name', 'the model'), needed, util, total, used))
    return {'ok': not errors, 'errors': errors, 'checked': checked}
