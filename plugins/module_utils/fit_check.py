# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Does a catalog entry fit a host? GPU memory, KV cache, parallelism rules vLLM enforces, attention backends, disk space,
host RAM for a sleeping model."""
from __future__ import annotations

import os.path
import re

from ansible_collections.llmfleet.vllm.plugins.module_utils.catalog import gpus_needed

MIB = 1024 ** 2
GIB = 1024 ** 3
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
# Below this share of usable GPU memory left for KV cache after weights, warn (few concurrent sequences fit).
KV_HEADROOM_WARN_FRACTION = 0.1
# One max_model_len sequence's KV cache above this share of what is left after weights: warn. vLLM also
# keeps activations, CUDA graphs and (Kimi) the vision encoder there, which fit_check does not model. The
# one measured point: Kimi-K2.5 INT4, 8x 96 GB, gpu_memory_utilization 0.93 -> ~450K FP8 tokens of KV
# cache (rtx6kpro, shared/MODEL-FACTS.md) = 14.7 GiB of the 20.5 GiB left after weights, i.e. ~0.72.
KV_SEQUENCE_WARN_FRACTION = 0.7
# Compute-capability majors that have a sparse-MLA (DeepSeek sparse attention, `index_topk`) backend in stock
# vLLM 0.26 (v1/attention/backends/mla: FLASHMLA_SPARSE 9.x/10.x, FLASH_ATTN_MLA_SPARSE 9.x, FLASHINFER_MLA_SPARSE 10.x).
SPARSE_MLA_COMPUTE_MAJORS = (9, 10)
SPARSE_MLA_SM12X = (
    'stock vLLM has no sparse-MLA backend that can serve it on SM12x: vLLM 0.26 picks FLASHINFER_MLA_SPARSE_SM120'
    ' (platforms/cuda.py), whose FlashInfer kernel livelocks under sustained load (GPUs at 100%% with no token out;'
    ' vllm-project/vllm PRs #49026 and #54929, open, reported on GLM-5.2 with vLLM 0.26.0/0.28.0); older vLLM found'
    ' no backend at all ("No valid attention backend ... use_sparse=True", rtx6kpro 2026-03-08). The hand run'
    ' served GLM-5 on SM120 only with a custom Triton sparse-MLA backend patched into vLLM (seeds 000/001)')
# Space kept free after a download: the larger of these (HF cache temp files, logs, compile caches).
DISK_MARGIN_BYTES = 10 * GIB
DISK_MARGIN_FRACTION = 0.05


def _gib(n):
    return '%.1f GiB' % (n / GIB)


def host_gpus(facts):
    """{gpu_count, gpu_memory_mib, nvlink, compute_capability} from itself or from the llmfleet_gpu fact of
    llmfleet.vllm.gpu_facts ({gpu_count, gpus: [{memory_total_mib, compute_capability}], topology: {nvlink}};
    the smallest GPU counts; compute_capability: the distinct values, e.g. ['12.0'])."""
    if 'gpus' not in facts or 'gpu_memory_mib' in facts:
        return facts
    gpus = [g for g in facts['gpus'] if isinstance(g, dict)]
    memory = [g.get('memory_total_mib') for g in gpus if g.get('memory_total_mib')]
    capability = sorted({str(g['compute_capability']) for g in gpus if g.get('compute_capability')})
    return {'gpu_count': facts.get('gpu_count'), 'gpu_memory_mib': min(memory) if memory else None,
            'nvlink': bool((facts.get('topology') or {}).get('nvlink')), 'compute_capability': capability or None}


def _capabilities(value):
    """'12.0', 9.0 or a list of them -> ([(major, minor)], bad values); None -> ([], [])."""
    if value is None:
        return [], []
    found, bad = set(), []
    for item in value if isinstance(value, list) else [value]:
        major, _dot, minor = str(item).partition('.')
        if isinstance(item, bool) or not major.isdigit() or not (minor or '0').isdigit():
            bad.append(item)
        else:
            found.add((int(major), int(minor or 0)))
    return sorted(found), bad


def _quant_unit(entry):
    """(the size a TP shard of an expert's intermediate dimension must be a multiple of, its words) or (None, None)."""
    quant = entry['quantization']
    block = quant.get('weight_block_size')
    if block:  # vLLM fp8.py: intermediate_size_per_partition % block_n (gate/up) and % block_k (down, TP > 1)
        unit = max(block)
        for size in block:
            if unit % size:
                unit *= size  # keep it a multiple of both
        return unit, '%s weight block %s' % (quant['method'], block)
    if quant.get('group_size'):  # vLLM compressed_tensors_moe_wna16(_marlin).py: intermediate_size_per_partition % group_size
        return quant['group_size'], '%s group size %d' % (quant['method'], quant['group_size'])
    return None, None


def _heads_split(arch, tp):
    """Whether vLLM can split the attention (and, GQA/MHA, the KV) heads over tp GPUs."""
    heads, kv_heads = arch['num_attention_heads'], arch['num_key_value_heads']
    if heads and heads % tp:
        return False
    if arch['attention'] == 'mla' or not kv_heads:
        return True
    return not kv_heads % tp if tp <= kv_heads else not tp % kv_heads


def _kv_bytes_per_token(entry, serving, tp, pp):
    """(KV-cache bytes one token takes on one GPU, how it was counted) or (None, what is unknown)."""
    arch = entry['architecture']
    layers = arch.get('num_hidden_layers')
    dtype = serving.get('kv_cache_dtype') or 'auto'
    elem = 1 if dtype.startswith('fp8') else 2  # auto: the checkpoint's BF16/FP16 (no seed entry asks for FP8 KV)
    if arch['attention'] == 'mla':
        rank, rope = arch.get('kv_lora_rank'), arch.get('qk_rope_head_dim')
        missing = [k for k, v in (('num_hidden_layers', layers), ('kv_lora_rank', rank), ('qk_rope_head_dim', rope))
                   if v is None]
        if missing:
            return None, ', '.join(missing)
        if arch.get('index_topk') and elem == 1:
            # fp8_ds_mla: FP8 latent + one FP32 scale per 128 + BF16 RoPE part (656 bytes for GLM-5; vLLM 0.26
            # flashinfer_mla_sparse.py). The indexer's own small key cache is not counted.
            per_layer, how = rank + rank // 128 * 4 + rope * 2, 'MLA, packed fp8_ds_mla'
        else:
            per_layer, how = (rank + rope) * elem, 'MLA, (%d + %d) x %d bytes' % (rank, rope, elem)
        # Every TP rank keeps the whole latent; decode context parallelism splits the tokens across ranks.
        dcp = serving.get('decode_context_parallel_size') or 1
        how += ', one full copy per TP rank' + (' / DCP %d' % dcp if dcp > 1 else '')
        per_layer /= dcp
    else:
        head_dim, kv_heads = arch.get('head_dim'), arch.get('num_key_value_heads')
        missing = [k for k, v in (('num_hidden_layers', layers), ('head_dim', head_dim), ('num_key_value_heads', kv_heads))
                   if v is None]
        if missing:
            return None, ', '.join(missing)
        heads_per_gpu = max(kv_heads // tp, 1)
        per_layer = 2 * heads_per_gpu * head_dim * elem
        how = '%s, K+V x %d KV head(s) per GPU x %d x %d bytes' % (arch['attention'].upper(), heads_per_gpu, head_dim, elem)
    layers_per_gpu = -(-layers // pp)
    return int(per_layer * layers_per_gpu), '%s x %d layers' % (how, layers_per_gpu)


def fit_check(entry, gpus, tensor_parallel_size=None):
    """Check a validated catalog entry against host GPU facts.

    gpus: {gpu_count: int, gpu_memory_mib: int (per GPU), nvlink: bool, compute_capability: '12.0' or a list},
    or the llmfleet_gpu fact (see host_gpus). Returns {ok, errors, warnings, gpus_needed, weights_per_gpu_bytes,
    usable_per_gpu_bytes, kv_bytes_per_token, kv_bytes_per_sequence}.
    """
    gpus = host_gpus(gpus)
    serving = entry['serving']
    arch = entry['architecture']
    name = entry.get('name', '?')
    tp = tensor_parallel_size or serving['tensor_parallel_size']
    pp = serving.get('pipeline_parallel_size') or 1
    errors, warnings = [], []
    result = {'gpus_needed': gpus_needed(entry, tp), 'weights_per_gpu_bytes': None, 'usable_per_gpu_bytes': None,
              'kv_bytes_per_token': None, 'kv_bytes_per_sequence': None}

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

    dcp = serving.get('decode_context_parallel_size') or 1
    if tp % dcp:  # vLLM 0.26 config/parallel.py: DCP reuses the TP ranks
        errors.append('%s: decode_context_parallel_size %d must divide tensor_parallel_size %d (vLLM refuses to start)'
                      % (name, dcp, tp))

    # An expert's intermediate dimension split TP ways must stay a multiple of the quantization block/group
    # (vLLM checks it when it creates the MoE weights); expert parallelism keeps every expert whole on one GPU.
    moe = arch.get('moe_intermediate_size')
    unit, unit_words = _quant_unit(entry)
    if moe and unit and tp > 1 and not serving.get('enable_expert_parallel'):
        if moe % tp or (moe // tp) % unit:
            better = [t for t in range(tp - 1, 0, -1) if not moe % t and not (moe // t) % unit and _heads_split(arch, t)]
            errors.append('%s: tensor_parallel_size %d splits each expert\'s %d-wide projection into %s-wide shards,'
                          ' not a multiple of the %s: vLLM refuses to load the weights. Use expert parallelism'
                          ' (enable_expert_parallel: true keeps experts whole)%s'
                          % (name, tp, moe, ('%g' % (moe / tp)), unit_words,
                             ' or tensor_parallel_size %d (%d-wide shards)' % (better[0], moe // better[0]) if better else ''))

    if entry['engine'] == 'cpu':
        return dict(result, gpus_needed=0, ok=not errors, errors=errors, warnings=warnings)

    count, mem_mib = gpus.get('gpu_count'), gpus.get('gpu_memory_mib')
    count_ok = isinstance(count, int) and not isinstance(count, bool) and count >= 0
    mem_ok = isinstance(mem_mib, (int, float)) and not isinstance(mem_mib, bool) and mem_mib > 0
    if not count_ok:
        errors.append('%s: host gpu_count must be a non-negative integer, got %r' % (name, count))
    elif count < result['gpus_needed']:
        errors.append('%s: needs %d GPUs (TP %d x PP %d x DP %d), host has %d'
                      % (name, result['gpus_needed'], tp, pp, serving.get('data_parallel_size') or 1, count))
    if not mem_ok:
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
        else:
            left = usable - per_gpu
            if left < usable * KV_HEADROOM_WARN_FRACTION:
                warnings.append('%s: only %s per GPU left for KV cache after %s of weights; expect few concurrent sequences'
                                % (name, _gib(left), _gib(per_gpu)))
            _kv_fit(entry, serving, tp, pp, left, result, errors, warnings)

    minimum = entry.get('vram_minimum_gb')
    if minimum and mem_ok and count_ok and count >= result['gpus_needed']:
        total = mem_mib * MIB * result['gpus_needed']
        if total < minimum * 1e9:
            errors.append('%s: its recipe needs at least %g GB of GPU memory in all; the %d GPUs it gets have %.0f GB'
                          ' (%d MiB each): use GPUs with more memory or more of them'
                          % (name, minimum, result['gpus_needed'], total / 1e9, mem_mib))

    capabilities, bad = _capabilities(gpus.get('compute_capability'))
    if bad:
        errors.append('%s: host compute_capability must be "MAJOR.MINOR" (e.g. "12.0"), got %r' % (name, bad))
    majors = sorted({major for major, _minor in capabilities})
    if arch.get('index_topk'):  # DeepSeek sparse attention (DSA) on MLA: needs a sparse-MLA attention backend
        if not capabilities and not bad:
            warnings.append('%s: GPU compute capability unknown, sparse-MLA backend (DeepSeek sparse attention) not checked'
                            % name)
        for major in majors:
            if major == 12:
                errors.append('%s: sparse-MLA model (DeepSeek sparse attention) on compute capability %s: %s'
                              % (name, _cc(capabilities, major), SPARSE_MLA_SM12X))
            elif major not in SPARSE_MLA_COMPUTE_MAJORS:
                errors.append('%s: sparse-MLA model (DeepSeek sparse attention) on compute capability %s: stock vLLM 0.26'
                              ' has sparse-MLA backends for compute capability 9.x (Hopper) and 10.x (B200/GB200) only'
                              % (name, _cc(capabilities, major)))
    elif arch['attention'] == 'mla' and 12 in majors and (serving.get('kv_cache_dtype') or '').startswith('fp8'):
        warnings.append('%s: FP8 KV cache for an MLA model on compute capability %s: the hand runs found FP8 KV broken on'
                        ' SM120 (seed 001, early-2026 vLLM); the rtx6kpro line runs it with TRITON_MLA. Check the first'
                        ' answers' % (name, _cc(capabilities, 12)))

    if arch['attention'] == 'mla' and tp > 1 and not gpus.get('nvlink', False):
        warnings.append('%s: MLA model with tensor parallelism %d over PCIe-only GPUs (no NVLink): the per-layer'
                        ' all-reduce crosses PCIe; the hand-run Kimi-K2.5 NVFP4 at TP 8 was all-reduce bound'
                        ' (~61 tok/s single stream vs 84 tok/s for GQA MiniMax-M2.5 at TP 4)' % (name, tp))
    return dict(result, ok=not errors, errors=errors, warnings=warnings)


def _cc(capabilities, major):
    return '/'.join('%d.%d' % c for c in capabilities if c[0] == major)


def _kv_fit(entry, serving, tp, pp, left, result, errors, warnings):
    """vLLM refuses to start unless one sequence of max_model_len fits the KV cache; check that against the
    memory left per GPU after weights (an upper bound: activations and CUDA graphs take part of it)."""
    name = entry.get('name', '?')
    length = serving.get('max_model_len') or entry['architecture'].get('max_position_embeddings')
    per_token, how = _kv_bytes_per_token(entry, serving, tp, pp)
    if per_token is None:
        warnings.append('%s: KV-cache size per token unknown (architecture: %s), max_model_len fit not checked'
                        % (name, how))
        return
    result['kv_bytes_per_token'] = per_token
    if not length:
        warnings.append('%s: neither max_model_len nor architecture.max_position_embeddings is known, KV-cache fit of'
                        ' one sequence not checked' % name)
        return
    need = per_token * length
    result['kv_bytes_per_sequence'] = need
    what = ('%s: one sequence of max_model_len %d needs %s of KV cache per GPU (%d bytes/token: %s)'
            % (name, length, _gib(need), per_token, how))
    if need > left:
        errors.append('%s, only %s per GPU is left after weights, before activations: vLLM refuses to start.'
                      ' Lower max_model_len, use an FP8 KV cache, decode context parallelism or more GPUs'
                      % (what, _gib(left)))
    elif need > left * KV_SEQUENCE_WARN_FRACTION:
        warnings.append('%s, %d%% of the %s left per GPU after weights; activations and CUDA graphs need part of it:'
                        ' vLLM may refuse to start (lower max_model_len if it does)' % (what, round(100 * need / left), _gib(left)))


def models_root_path(root):
    """The models root as every comparison of paths under it uses it: absolute and normalised (no trailing or
    doubled '/', no '.' or '..'), so '/srv/models/' and '/srv/models' are the same root. The one owner of that rule."""
    if not isinstance(root, str) or not root.startswith('/'):
        raise ValueError('the models root (pivot_models_root) must be an absolute path such as /srv/models, got %r' % (root,))
    return '/' + os.path.normpath(root).lstrip('/')


def _norm_path(path):
    return '/' + os.path.normpath(path).lstrip('/') if path.startswith('/') else os.path.normpath(path)


def dir_names_under(paths, root):
    """Sorted names of the directories in paths that lie directly under the models root (a serving record's dirs);
    paths elsewhere, empty or None entries are left out."""
    root = models_root_path(root)
    names = set()
    for path in paths or []:
        if isinstance(path, str) and path:
            path = _norm_path(path)
            if os.path.dirname(path) == root and os.path.basename(path) not in ('', '.', '..'):
                names.add(os.path.basename(path))
    return sorted(names)


def disk_plan(needed_bytes, free_bytes, downloaded_bytes=0, candidates=None, protect=None,
              margin_bytes=DISK_MARGIN_BYTES, margin_fraction=DISK_MARGIN_FRACTION, models_root=None, keep=None):
    """Plan the disk space for a download.

    needed_bytes: the model's full size; downloaded_bytes: what of it is already on disk (resume).
    candidates: [{path, size_bytes, mtime}] model dirs that may be pruned; those with an mtime go oldest first
    (ties by path), the others after them in the given order.
    protect: paths never pruned (the serving model, the download target); keep: names of dirs under models_root
    never pruned (pivot_prune_keep, models other hosts of the storage serve). Paths are compared normalised
    (models_root_path), so a trailing '/' on the root or a path changes nothing.
    The margin kept free is max(margin_bytes, margin_fraction x needed_bytes).
    Returns {ok, to_download_bytes, required_free_bytes, free_bytes, short_by_bytes, prune, prune_bytes,
    ok_after_prune, errors}: ok means the download fits now; prune lists the dirs that would have to go.
    """
    errors = []
    for label, value in (('needed_bytes', needed_bytes), ('free_bytes', free_bytes), ('downloaded_bytes', downloaded_bytes)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            errors.append('%s must be a non-negative integer number of bytes, got %r' % (label, value))
    protect_list, keep = list(protect or []), list(keep or [])
    for i, path in enumerate(protect_list):
        if path is not None and not isinstance(path, str):
            errors.append('protect[%d] must be a path, got %r' % (i, path))
    for i, name in enumerate(keep):
        if name is not None and not isinstance(name, str):
            errors.append('keep[%d] must be a directory name under the models root, got %r' % (i, name))
    root = None
    if keep and any(keep):
        try:
            root = models_root_path(models_root)
        except ValueError as exc:
            errors.append('keep needs models_root: %s' % exc)
    candidates = candidates or []
    for i, cand in enumerate(candidates):
        if not isinstance(cand, dict) or not isinstance(cand.get('path'), str) or \
                not isinstance(cand.get('size_bytes'), int) or cand['size_bytes'] < 0 or \
                not isinstance(cand.get('mtime', 0), (int, float)) or isinstance(cand.get('mtime'), bool):
            errors.append('candidates[%d] must be {path: str, size_bytes: int >= 0} (mtime: a number, optional), got %r' % (i, cand))
    if errors:
        return {'ok': False, 'ok_after_prune': False, 'errors': errors, 'prune': [], 'prune_bytes': 0}
    protect = {_norm_path(p) for p in protect_list if p}
    protect |= {_norm_path(os.path.join(root, name)) for name in keep if name}
    # Oldest first: sorted() is stable, so candidates without an mtime keep their given order, after the others.
    candidates = sorted(candidates, key=lambda c: (0, c['mtime'], _norm_path(c['path'])) if 'mtime' in c else (1, 0, ''))

    margin = max(margin_bytes, int(needed_bytes * margin_fraction))
    to_download = max(needed_bytes - downloaded_bytes, 0)
    # Nothing to download writes nothing: a full disk must not block a re-run of a model already there.
    required = to_download + margin if to_download else 0
    short = max(required - free_bytes, 0)
    prune, freed = [], 0
    for cand in candidates:
        if freed >= short:
            break
        if _norm_path(cand['path']) in protect:
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
    model gets (default 0..TP x PP x DP - 1). Returns {ok, errors, checked: [{index, free_mib, needed_mib}]}.
    """
    serving = entry['serving']
    util = serving.get('gpu_memory_utilization') or VLLM_DEFAULT_GPU_MEMORY_UTILIZATION
    ids = list(range(gpus_needed(entry))) if gpu_ids is None else list(gpu_ids)
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


def mem_available_mib(meminfo_text):
    """MemAvailable of /proc/meminfo, in MiB (None when the text has none)."""
    match = re.search(r'^MemAvailable:\s+(\d+)\s*kB', meminfo_text or '', re.M)
    return int(match.group(1)) // 1024 if match else None


def sleep_ram_fit(weights_bytes, meminfo_text, margin_mib, model='the model'):
    """Whether host RAM holds a model's weights while vLLM's sleep mode (level 1) keeps them there: MemAvailable minus
    the margin must be at least the weights. {ok, weights_mib, available_mib, margin_mib, message}."""
    weights_mib = -(-int(weights_bytes) // MIB)
    available = mem_available_mib(meminfo_text)
    margin = int(margin_mib)
    result = {'ok': False, 'weights_mib': weights_mib, 'available_mib': available, 'margin_mib': margin, 'message': ''}
    if available is None:
        result['message'] = 'MemAvailable could not be read from /proc/meminfo, so the host RAM for %s asleep is unknown' % model
    elif available - margin < weights_mib:
        result['message'] = ('host RAM cannot hold %s asleep: its weights need %d MiB, MemAvailable is %d MiB and'
                             ' pivot_sleep_ram_margin_mib keeps %d MiB free (%d MiB short)'
                             % (model, weights_mib, available, margin, weights_mib - (available - margin)))
    else:
        result.update(ok=True, message='host RAM holds %s asleep: %d MiB of weights, %d MiB available, %d MiB kept free'
                      % (model, weights_mib, available, margin))
    return result
