#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# The real vLLM CUDA run on the device tool's H200 (issue 17, docs/gpu-validation.md), from the repo root there:
#   tools/device/vllm_h200.sh PHASE...
# Phases, in the order of the run (several per device call; state between calls lives outside the repo copy):
#   probe        machine facts: glibc, PID 1, systemd, the Python environment, packages, GPU, CUDA as non-root
#   carryN       chunk N (.whl/cNN from tools/device/vllm_bundle.sh) to /root/carry, sha256-checked; carry0 also
#                unpacks the model skeleton and starts tools/device/random_llama.py weights in the background
#   install      reassemble the bundle (sha256), ansible-core to /tmp/site, vllm_install.yml, wait for the
#                weights, vllm_verify.yml (shard_verify fast and full)
#   serve-LABEL  vllm_serve.yml; cold: page cache dropped and the service's cache directory removed first;
#                sleep: the catalog entry's sleep profile (--enable-sleep-mode)
#   bench        /metrics, vllm_bench.yml (roles/benchmark), /metrics, one raw `vllm bench serve` result
#   stop-LABEL   unit_runner.py stop, timed
#   Issue 45's start facts (the label picks the environment laid over h200-vars.yml, see label_env):
#   serve-icacheN  Inductor's and Triton's caches in the service's cache directory instead of the private /tmp
#   serve-forkN    the same, and VLLM_WORKER_MULTIPROC_METHOD=fork (the CLI sets spawn when it is unset)
#   launch-LABEL   the ExecStart behind roles/service_deploy/files/vllm-launch.py: imports and prefetch, armed, go,
#                  served (launchfork*: fork; launchinproc*: VLLM_ENABLE_V1_MULTIPROCESSING=0, the engine in-process)
#   dropcaches     the page cache dropped (the next start reads the weights from disk, unless prefetched)
#   reseed         the JIT caches (vllm, torchinductor, triton) packed, the whole cache directory removed, the pack
#                  restored: a host that never compiled, given another host's caches; sizes in jit-cache-sizes.txt
#   qbench-LABEL   vllm bench serve at C = 1 (16 prompts) and C = 256 (1024 prompts), 128 in / 128 out
#   A label holding "eager" serves the catalog's eager profile (--enforce-eager).
#   sleepwake    tools/device/sleep_wake.py: 3 cycles of /sleep?level=1, /wake_up, first request
#   agree        bench/agreement.py (issue 46): throughput_check and vllm bench serve interleaved against the server's
#                counters at C = 8, 32, 128 (128 in / 128 out, 8 x C requests, 3 rounds)
#   pack         /root/h200 (results, logs, unit state) to $OUT/h200-vllm.tgz
# The first failing phase ends the list, except that pack still runs when named.
# Env: H200_SERVICE_USER (default vllm: the unit's User=), H200_VENV (default: the venv python3 runs in).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
repo=$(pwd)
RES=/root/h200
CARRY=/root/carry
SITE=/tmp/site
SHIM=/tmp/llmfleet-shim
MODEL=h200-llama3-8b-random
MODEL_DIR=/srv/models/$MODEL
UNIT=vllm-$MODEL.service
URL=http://127.0.0.1:8000
user=${H200_SERVICE_USER:-vllm}
mkdir -p "$RES" "$CARRY"
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
py=$(command -v python3)
read -r prefix base_prefix < <($py -c 'import sys; print(sys.prefix, sys.base_prefix)')
if [ -n "${H200_VENV:-}" ]; then venv=$H200_VENV; site=true
elif [ "$prefix" != "$base_prefix" ]; then venv=$prefix; site=false  # the image's own venv, holding its torch
else venv=/opt/vllm; site=true; fi                                     # a new venv that sees the system's torch
coll=/tmp/llmfleet-coll
mkdir -p $coll/ansible_collections/llmfleet
ln -sfn "$repo" $coll/ansible_collections/llmfleet/vllm
export PYTHONPATH=$coll:$SITE PATH=$SHIM:$PATH
export ANSIBLE_COLLECTIONS_PATH=$coll ANSIBLE_STDOUT_CALLBACK=ansible.builtin.default ANSIBLE_NOCOLOR=1
export ANSIBLE_LOCALHOST_WARNING=0 ANSIBLE_INVENTORY_UNPARSED_WARNING=0 ANSIBLE_DEPRECATION_WARNINGS=0
$py "$repo/tools/device/unit_runner.py" shims $SHIM >/dev/null
playbook() {
  (cd /tmp && $py -m ansible.cli.playbook -i localhost, -c local -e ansible_python_interpreter="$py" \
    -e out=$RES -e venv="$venv" "$@")
}
fetch() { $py -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())' "$1"; }
step() { echo; echo "===== $* ($(date -u +%T), $(awk '{print $1}' /proc/uptime) s up)"; }

probe() {
  uname -a; grep PRETTY /etc/os-release; ldd --version | head -1
  echo "PID 1: $(tr '\0' ' ' < /proc/1/cmdline) ($(cat /proc/1/comm))"
  for c in systemctl journalctl systemd-run runuser setpriv gcc nvcc curl; do echo "$c: $(command -v $c || echo -)"; done
  echo "python3 $py prefix=$prefix base_prefix=$base_prefix -> venv $venv (create with system site-packages: $site)"
  cat "$prefix/pyvenv.cfg" 2>/dev/null; ls -ld "$prefix" "$prefix/bin/pip" "$prefix/bin/activate" 2>&1
  $py -m pip list 2>/dev/null | grep -iE '^(torch|triton|numpy|transformers|tokenizers|huggingface.hub|safetensors|numba|llvmlite|protobuf|setuptools|aiohttp|pydantic|fastapi|uvicorn|openai|msgspec|pyzmq|cachetools|blake3|cryptography|jinja2|pyyaml|packaging|nvidia-ml-py|uvloop|torchvision|grpcio|matplotlib|pandas|typing.extensions|anyio|httpx|vllm) '
  nvidia-smi --query-gpu=name,memory.total,memory.used,power.draw,power.limit,driver_version --format=csv,noheader
  ls -l /dev/nvidia* | head -8
  env | grep -E '^(LD_LIBRARY_PATH|CUDA|NVIDIA|PATH)=' ; ulimit -n -Hn
  df -h / /tmp | tail -2; free -g | head -2; nproc; ls /usr/share/common-licenses | head -3
  echo "CUDA as nobody: $(setpriv --reuid=65534 --regid=65534 --clear-groups $py -c 'import torch; print(torch.cuda.is_available(), torch.cuda.get_device_name(0))' 2>&1 | tail -1)"
  sync; echo 3 > /proc/sys/vm/drop_caches && echo "drop_caches: ok"
}

carry() {
  local n; n=$(carry_chunk "$1" $CARRY) || return 1
  if [ "$n" = 00 ]; then
    (cd $CARRY && grep " skel.tgz\$" SHA256SUMS | sha256sum -c -) || return 1
    mkdir -p $MODEL_DIR && tar xzf $CARRY/skel.tgz -C $MODEL_DIR || return 1
    setsid bash -c "$py $repo/tools/device/random_llama.py weights $MODEL_DIR > $RES/model-weights.log 2>&1; echo \$? > $RES/model-weights.rc" \
      < /dev/null > /dev/null 2>&1 &
    echo "weight writer started (pid $!)"
  fi
  ls -la $CARRY | tail -n +2; df -h / | tail -1
  [ -f $RES/model-weights.rc ] && echo "weights: rc $(cat $RES/model-weights.rc)" || tail -c 300 $RES/model-weights.log 2>/dev/null
  return 0
}

install() {
  (cd $CARRY && cat bundle.part[0-9][0-9] > bundle.tar && grep " bundle.tar\$" SHA256SUMS | sha256sum -c - \
    && tar xf bundle.tar && rm -f bundle.part[0-9][0-9] bundle.tar) || return 1
  ls $CARRY/wheels | wc -l
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE \
    $CARRY/wheels/{ansible_core,resolvelib,cryptography,cffi,pycparser}-*.whl || return 1
  $py -m ansible.cli.playbook --version | head -1
  # The image's venv was made by uv without a pip script; ansible.builtin.pip looks for <venv>/bin/pip.
  if [ ! -x "$venv/bin/pip" ] && [ -x "$venv/bin/python3" ]; then
    printf '#!/bin/sh\nexec %s -m pip "$@"\n' "$venv/bin/python3" > "$venv/bin/pip" && chmod 755 "$venv/bin/pip"
    echo "wrote $venv/bin/pip: $("$venv/bin/pip" --version)"
  fi
  local t0=$SECONDS
  playbook "$repo/tools/device/vllm_install.yml" -e wheels=$CARRY/wheels -e deps_file="$repo/tools/device/vllm-h200-deps.txt" \
    -e python="$py" -e site_packages=$site || return 1
  echo "vllm_install.yml: $((SECONDS - t0)) s"
  for _ in $(seq 1 300); do [ -f $RES/model-weights.rc ] && break; sleep 1; done
  cat $RES/model-weights.log; [ "$(cat $RES/model-weights.rc 2>/dev/null)" = 0 ] || return 1
  du -sb $MODEL_DIR; ls -la $MODEL_DIR
  playbook "$repo/tools/device/vllm_verify.yml" -e model_dir=$MODEL_DIR
}

# label_env LABEL: the JSON object of variables laid over h200_environment for that start.
label_env() {
  local jit='"TORCHINDUCTOR_CACHE_DIR": "/var/cache/llmfleet-vllm/torchinductor", "TRITON_CACHE_DIR": "/var/cache/llmfleet-vllm/triton"'
  case $1 in
    icache*) echo "{$jit}" ;;
    fork*|launchfork*) echo "{$jit, \"VLLM_WORKER_MULTIPROC_METHOD\": \"fork\"}" ;;
    launchinproc*) echo "{$jit, \"VLLM_ENABLE_V1_MULTIPROCESSING\": \"0\"}" ;;
    plainfork*) echo '{"VLLM_WORKER_MULTIPROC_METHOD": "fork"}' ;;
    sleep) echo '{"VLLM_SERVER_DEV_MODE": "1"}' ;;
    *) echo "{}" ;;
  esac
}

serve() {
  local label=$1 profile="" launch=${2:-}
  [ "$label" = sleep ] && profile=sleep
  case $label in *eager*) profile=eager ;; *fewgraphs*) profile=fewgraphs ;; esac
  if [ "$label" = cold ]; then
    rm -rf /var/cache/llmfleet-vllm
    sync; echo 3 > /proc/sys/vm/drop_caches || echo "could not drop the page cache"
  fi
  rm -rf "/tmp/torchinductor_$user"  # the unit has PrivateTmp=true: every start sees an empty /tmp
  # The launcher's run directory is the unit's RuntimeDirectory=, which systemd makes and unit_runner.py does not.
  install -d -m 0755 /run/llmfleet-launch && install -d -o "$user" -g "$user" -m 0700 "/run/llmfleet-launch/${UNIT%.service}"
  playbook "$repo/tools/device/vllm_serve.yml" -e label="$label" -e profile="$profile" -e service_user="$user" \
    -e "{\"extra_env\": $(label_env "$label")}" ${launch:+-e launch_dir=/var/cache/llmfleet-vllm/launch-$label}
  local rc=$?
  grep -E "time_to_ready_s|ready_at|go_at|ActiveState|import_s|prefetch_s|cuda_initialised" $RES/ready-$label.json 2>/dev/null
  return $rc
}

bench() {
  ulimit -n 65536
  fetch $URL/metrics > $RES/metrics-before-bench.txt
  local ready
  ready=$($py -c 'import json, sys; print(json.load(open(sys.argv[1]))["time_to_ready_s"])' $RES/ready-cold.json)
  playbook "$repo/tools/device/vllm_bench.yml" -e ready_s="$ready" || return 1
  fetch $URL/metrics > $RES/metrics-after-bench.txt
  # One raw result file of vLLM's own client, as it writes it (the role keeps only the parsed levels).
  (cd /tmp && "$venv/bin/vllm" bench serve --backend vllm --base-url $URL --endpoint /v1/completions --model $MODEL_DIR \
    --served-model-name $MODEL --dataset-name random --random-input-len 128 --random-output-len 128 --ignore-eos \
    --max-concurrency 64 --num-prompts 256 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 \
    --save-result --result-dir $RES --result-filename vllm-bench-raw-c64.json) 2>&1 | tail -40
  fetch $URL/metrics > $RES/metrics-after-raw-bench.txt
}

reseed() {
  local c=/var/cache/llmfleet-vllm
  (cd $c && du -sb vllm torchinductor triton) | tee $RES/jit-cache-sizes.txt
  tar -C $c -cf /root/jit.tar vllm torchinductor triton && rm -rf $c && mkdir -p $c && tar -C $c -xf /root/jit.tar \
    && chown -R "$user:$user" $c && ls -la $c
}

qbench() {
  local c n
  for c in 1 256; do
    n=$((c == 1 ? 16 : 1024))
    (cd /tmp && "$venv/bin/vllm" bench serve --backend vllm --base-url $URL --endpoint /v1/completions --model $MODEL_DIR \
      --served-model-name $MODEL --dataset-name random --random-input-len 128 --random-output-len 128 --ignore-eos \
      --max-concurrency $c --num-prompts $n --save-result --result-dir $RES --result-filename "qbench-$1-c$c.json") 2>&1 \
      | grep -E "Output token throughput|Median TTFT|Median TPOT|Successful"
  done
}

stop_unit() {
  $py "$repo/tools/device/unit_runner.py" stop $UNIT | tee "$RES/stop-$1.json"
}

pack() {
  cp /run/llmfleet-units/* $RES/ 2>/dev/null
  nvidia-smi > $RES/nvidia-smi-end.txt 2>&1
  rm -rf $RES/results/.run-*
  tar czf "$OUT/h200-vllm.tgz" -C $RES . && ls -la "$OUT"
}

h200_phase() {
  local phase=$1 rc
  case $phase in
    probe) probe ;;
    carry[0-9]*) carry "${phase#carry}" ;;
    install) install ;;
    serve-*) serve "${phase#serve-}" ;;
    launch-*) serve "${phase#launch-}" launch ;;
    dropcaches) sync; echo 3 > /proc/sys/vm/drop_caches ;;
    reseed) reseed ;;
    qbench-*) qbench "${phase#qbench-}" ;;
    bench) bench ;;
    stop-*) stop_unit "${phase#stop-}" ;;
    agree) (ulimit -n 65536; cd /tmp && $py "$repo/bench/agreement.py" --base-url $URL --model $MODEL --tokenizer $MODEL_DIR \
      --vllm-bench "$venv/bin/vllm bench serve" --ansible-playbook "$py -m ansible.cli.playbook" --concurrency ${AGREE_CONCURRENCY:-8 32 128} \
      --input-len 128 --output-len 128 --prompts-per-concurrency 8 --rounds ${AGREE_ROUNDS:-3} --out $RES/bench-agreement.json) ;;
    sleepwake) $py "$repo/tools/device/sleep_wake.py" $URL $MODEL $RES/sleep-wake.json --cycles 3 ;;
    pack) pack ;;
    *) echo "unknown phase $phase"; false ;;
  esac
}

run_phases h200_phase "$@"
