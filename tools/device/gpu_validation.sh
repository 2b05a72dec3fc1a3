#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# GPU validation of llmfleet.vllm.gpu_facts, nccl_shm_cleanup and module_utils/gpu_power on a real
# NVIDIA host (run through the device tool from the repo root; see docs/gpu-validation.md).
#   tools/device/gpu_validation.sh OUTDIR
# Needs: python3 with torch (CUDA) and, on PYTHONPATH, ansible-core + nvidia-ml-py.
set -uo pipefail
out=${1:?outdir}; mkdir -p "$out"
repo=$(pwd)
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
py=$(command -v python3)
coll=/tmp/llmfleet-coll; mkdir -p $coll/ansible_collections/llmfleet
ln -sfn "$repo" $coll/ansible_collections/llmfleet/vllm
export PYTHONPATH=$coll:${PYTHONPATH:-}
export ANSIBLE_COLLECTIONS_PATH=$coll ANSIBLE_STDOUT_CALLBACK=ansible.builtin.default ANSIBLE_NOCOLOR=1
export ANSIBLE_LOCALHOST_WARNING=0 ANSIBLE_INVENTORY_UNPARSED_WARNING=0
playbook() { (cd /tmp && $py -m ansible.cli.playbook -i localhost, -c local -e ansible_python_interpreter=$py -e out="$out" "$@"); }
step() { echo; echo "===== $* ($(date -u +%T))"; }

step environment
uname -r; $py --version; $py -c 'import torch, pynvml, ansible; print("torch", torch.__version__, torch.version.cuda, "gpus", torch.cuda.device_count(), "| pynvml", pynvml.__file__, "| ansible", ansible.__file__)'
$py -m ansible.cli.playbook --version | head -3
ls -la /dev/shm

step "raw nvidia-smi outputs"
nvidia-smi > "$out/h200-nvidia-smi.txt" 2>&1; cat "$out/h200-nvidia-smi.txt"
nvidia-smi -q > "$out/h200-nvidia-smi-q.txt" 2>&1
f=index,name,uuid,memory.total,memory.used,compute_cap,power.draw,power.limit,utilization.gpu,pci.bus_id,persistence_mode,driver_version
nvidia-smi --query-gpu=$f --format=csv,noheader,nounits > "$out/h200-query-gpu.csv" 2>&1; cat "$out/h200-query-gpu.csv"
nvidia-smi topo -m > "$out/h200-topo-m.txt" 2>&1; cat -A "$out/h200-topo-m.txt" | head -20
nvidia-smi --query-gpu=power.draw --format=csv,noheader,nounits

step "NVML record"
$py "$repo/tools/device/nvml_record.py" "$out/h200-nvml.json"

step "gpu_facts through ansible-playbook"
playbook "$repo/tools/device/facts.yml"; echo "facts.yml rc=$?"

step "power sampler during bf16 matmul"
$py "$repo/tools/device/power_matmul.py" "$out/h200-power.json" 20; echo "power rc=$?"

step "shared memory: real torch NCCL / multiprocessing holder"
date > /dev/shm/nccl-stale-planted; date > /dev/shm/torch_stale_planted; touch -d '-2 hours' /dev/shm/nccl-stale-planted
ls -la /dev/shm > "$out/shm-listing-0-before.txt"
setsid $py "$repo/tools/device/shm_holder.py" "$out/shm-holder.json" > "$out/shm-holder.log" 2>&1 &
holder=$!
for i in $(seq 1 120); do [ -f "$out/shm-holder.json" ] && break; sleep 1; done
cat "$out/shm-holder.json" || { cat "$out/shm-holder.log"; }
ls -la /dev/shm | tee "$out/shm-listing-1-live.txt"
playbook "$repo/tools/device/shm.yml" -e phase=live; echo "shm live rc=$?"
ls -la /dev/shm | tee "$out/shm-listing-2-after-live-run.txt"
step "SIGKILL the holder's session and its children in other sessions (torch_shm_manager), pid by pid"
pids=$($py -c "
import os,sys
s=int(sys.argv[1]); r=[]
for p in os.listdir('/proc'):
    if p.isdigit():
        try: f=open('/proc/%s/stat'%p).read().rsplit(')',1)[1].split()
        except OSError: continue
        if int(f[3])==s or int(f[1])==s: r.append(p)
print(' '.join(r))" $holder)
for p in $pids; do echo "kill -9 $p ($(cat /proc/$p/comm 2>/dev/null), sid $(cut -d' ' -f6 /proc/$p/stat 2>/dev/null))"; kill -9 $p; done
sleep 3
ls -la /dev/shm | tee "$out/shm-listing-3-killed.txt"
playbook "$repo/tools/device/shm.yml" -e phase=killed; echo "shm killed rc=$?"
ls -la /dev/shm | tee "$out/shm-listing-4-final.txt"
cat "$out/shm-holder.log" | tail -20
step done
