#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# A real systemd GPU host on the device tool's H200 machine (issue 28, docs/gpu-validation.md), from the repo root there:
#   tools/device/gpuhost.sh PHASE...
# The machine has no systemd (PID 1 is the VM's agent). This boots Debian 12's systemd 252 as PID 1 of a
# systemd-nspawn container whose userland is the machine's own root (Ubuntu 24.04, Python 3.12, torch 2.11.0+cu130)
# with the carried systemd/dbus/haproxy files laid over it (overlayfs; the upper layer on a tmpfs), the NVIDIA device
# nodes bound in. The controller (ansible-core, carried) runs inside that host: tools/device/gpuhost-inventory.yml.
# Phases (several per device call; state between calls lives in /root/carry, outside the repo copy):
#   carryN   chunk N (.whl/cNN from tools/device/gpuhost_bundle.sh) to /root/carry, sha256-checked; carry0 also
#            unpacks the model skeletons and starts the random weight writer (GPU) in the background
#   boot     lay the layer over /, boot systemd in the container, wait for `systemctl is-system-running`
#            (GPUHOST_UVM_BIND=0: without /dev/nvidia-uvm{,-tools}, which nvidia-uvm-nodes.service must then create)
#   reboot   power the host off and boot it again: enabled units start in systemd's order; records that order
#   driver   roles/nvidia_driver (tools/device/gpuhost_driver.yml), then the uvm unit's state and ordering
#   install  reassemble the wheelhouse (sha256), roles/vllm_install from it (tools/device/gpuhost_install.yml)
#   serve-M  roles/service_deploy started for model M (a or b) under systemd, then inspect it
#   inspect  live unit: systemd-analyze security, /proc status, journal, GPU processes, sandbox negative controls,
#            requests with the openai client
#   restart  stop (role) -> NVML memory and processes -> start (role), timed
#   bench-M  roles/benchmark with NVML power against model M (tools/device/gpuhost_bench.yml)
#   pivotprep  what playbooks/pivot.yml needs there: the local hub serving A and B (port 8090), huggingface_hub 2.4.0
#            in its venv, the haproxy user (Debian's postinst is not run for a layered package)
#   client-start / client-stop  an openai client on the gateway's alias `chat` (tools/traffic/continuous_client.py,
#            4 workers) and an NVML timeline (tools/device/nvml_timeline.py), as transient units, the whole time between
#   pivot-first|bluegreen|gatefail|revision  playbooks/pivot.yml (tools/device/gpuhost-pivot/ inventory): A behind the
#            gateway; B blue/green on the same GPU; A again with a gate it cannot pass (must fail and roll back);
#            a new commit of B on the hub (stop-then-start)
#   pivot-revslow|revfast|revfast2|revslow2  new commits of B, stop-then-start: -e llmfleet_fast_start=false (the old
#            path) and fast start (armed beside the old B; issue 45)
#   pivot-revfew|revfew2|revfew3  the same with the profile fewgraphs (9 CUDA graph sizes; item 4)
#   pivot-revrec, jitseedprep, pivot-revseedm  item 2 as built: the caches recorded and fetched after a gate, kept as the
#            fleet's, the host's emptied, then given to the next start by pivot_jit_cache_seed (checked file by file)
#   cachefleet / cacheseed, pivot-revcold|revseed  a copy of the unit's JIT caches kept as the fleet's, the host's
#            emptied (revcold: a host that never compiled), then the copy laid in (revseed: given the fleet's cache)
#   pivot-sfirst|sgatefail|rgatefail|sleep|wakeback|reloadback  rollback by wake (issue 33, see pivot_run), then
#   expiry   wait until the timer of the last sleep stopped B
#   observe  playbooks/observability.yml on the GPU host (issue 31): the GPU textfile timer (NVML), the host's textfile
#            and targets, the metric contract against the live CUDA vLLM; then the gateway's metrics listener
#            (HAProxy's and the slot's vLLM metrics) and the textfiles, recorded
#   pack     /root/carry/res to $OUT/gpuhost.tgz
# The first failing phase ends the list, except that pack still runs when named.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
repo=$(pwd)
CARRY=/root/carry
RES=$CARRY/res
O=/mnt/gpuhost-ovl
M=/root/gpuhost-root
PIDF=$CARRY/container.pid
PY=/opt/torch/.venv/bin/python3
MODELS=(gpuhost-llama1b-a gpuhost-llama1b-b)
HUB=$CARRY/hub  # the local hub's repos llmfleet-test/<model> (the pivot downloads them into /srv/models)
mkdir -p "$RES" /srv/models
export LC_ALL=C.UTF-8 PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
step() { echo; echo "===== $* ($(date -u +%T), $(awk '{print $1}' /proc/uptime) s up)"; }

inside() {
  [ -s $PIDF ] || { echo "no container"; return 1; }
  nsenter -t "$(cat $PIDF)" -m -u -i -n -p -r -w env -i PATH=/opt/torch/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 TERM=dumb SYSTEMD_PAGER= SYSTEMD_COLORS=0 "$@"
}
sync_repo() {  # the repo copy the controller inside uses (the device tool's working tree is outside the container)
  rm -rf $CARRY/repo && mkdir -p $CARRY/repo $CARRY/coll/ansible_collections/llmfleet
  tar -C "$repo" --exclude=./.whl --exclude=./.git -cf - . | tar -C $CARRY/repo -xf -
  ln -sfn $CARRY/repo $CARRY/coll/ansible_collections/llmfleet/vllm
}
playbook() {
  inside env PYTHONPATH=$CARRY/coll:$CARRY/site ANSIBLE_COLLECTIONS_PATH=$CARRY/coll ANSIBLE_NOCOLOR=1 \
    ANSIBLE_STDOUT_CALLBACK=ansible.builtin.default ANSIBLE_DEPRECATION_WARNINGS=0 ANSIBLE_LOCALHOST_WARNING=0 \
    ANSIBLE_HOST_KEY_CHECKING=0 ANSIBLE_LOCAL_TEMP=/root/.ansible/tmp \
    $PY -m ansible.cli.playbook -i $CARRY/repo/tools/device/gpuhost-inventory.yml -e out=$RES "$@"
}

carry() {
  local n; n=$(carry_chunk "$1" $CARRY) || return 1
  if [ "$n" = 00 ]; then
    (cd $CARRY && grep -E " (skel|layer|ctl).tgz\$" SHA256SUMS | sha256sum -c -) || return 1
    mkdir -p $CARRY/site /tmp/llmfleet-coll/ansible_collections/llmfleet
    ln -sfn "$repo" /tmp/llmfleet-coll/ansible_collections/llmfleet/vllm
    mkdir -p $CARRY/ctl $CARRY/coll && tar xzf $CARRY/ctl.tgz -C $CARRY/ctl || return 1
    cp -a $CARRY/ctl/ansible_collections $CARRY/coll/ || return 1
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $CARRY/site $CARRY/ctl/*.whl || return 1
    local m
    for m in "${MODELS[@]}"; do
      mkdir -p $HUB/llmfleet-test/$m && tar xzf $CARRY/skel.tgz -C $HUB/llmfleet-test/$m || return 1
    done
    # Weights of A and B (different seeds), one after the other, on the GPU, while the next chunks arrive. A hub repo
    # holds what the Hub would: not random_llama's own manifest (model_fetch writes its manifest under that name).
    setsid bash -c "for m in ${MODELS[*]}; do s=\$((s + 1)); PYTHONPATH=/tmp/llmfleet-coll python3 $repo/tools/device/random_llama.py weights $HUB/llmfleet-test/\$m \
      --shape llama3.2-1b --seed \$s --repo-id llmfleet-test/\$m || exit 1; rm -f $HUB/llmfleet-test/\$m/.llmfleet-manifest.json; \
      done > $RES/model-weights.log 2>&1; echo \$? > $RES/model-weights.rc" \
      < /dev/null > /dev/null 2>&1 &
    echo "weight writer started (pid $!): seeds 1 and 2"
  fi
  ls -la $CARRY | tail -n +2; df -h / | tail -1
  [ -f $RES/model-weights.rc ] && echo "weights: rc $(cat $RES/model-weights.rc)"
  return 0
}

# GPUHOST_UVM_BIND=0: do not bind /dev/nvidia-uvm{,-tools} into the host, so that nvidia-uvm-nodes.service must
# create them (mknod from /proc/devices) before the vLLM units can use CUDA.
UVM_BINDS="--bind=/dev/nvidia-uvm --bind=/dev/nvidia-uvm-tools"
[ "${GPUHOST_UVM_BIND:-1}" = 0 ] && UVM_BINDS=""
st=""
start_container() {  # start nspawn (its boot script written by boot) and wait until systemd is up
  setsid bash -c 'unshare -m --propagation private bash /root/gpuhost-boot.sh' </dev/null >>$RES/nspawn.log 2>&1 &
  local p="" i
  for i in $(seq 1 60); do sleep 1; p=$(ps -eo pid,comm | awk '$2=="systemd"{print $1}' | head -1); [ -n "$p" ] && break; done
  [ -n "$p" ] || { tr -d '\r' < $RES/nspawn.log | tail -20; return 1; }
  echo "$p" > $PIDF; echo "container PID 1 = $p (machine pid)"
  for i in $(seq 1 90); do st=$(inside systemctl is-system-running 2>/dev/null); case $st in running|degraded) break ;; esac; sleep 1; done
  echo "is-system-running: $st after $i s"
}

# Power the host off and boot it again on the same layers (the overlay stays): what is enabled starts at boot, in
# systemd's order. Records the UVM unit and the vLLM unit of this boot, their order and the first good /health.
reboot_host() {
  local old; old=$(cat $PIDF) t0=$SECONDS
  inside systemctl poweroff
  for _ in $(seq 1 90); do [ -d /proc/$old ] || break; sleep 1; done
  [ -d /proc/$old ] && { echo "the host did not power off"; return 1; }
  echo "powered off in $((SECONDS - t0)) s"; t0=$SECONDS
  start_container || return 1
  local m=gpuhost-llama1b-a ok=""
  for _ in $(seq 1 300); do
    ok=$(inside $PY -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8000/health", timeout=2).status)' 2>/dev/null)
    [ "$ok" = 200 ] && break; sleep 1
  done
  echo "boot -> /health 200: $((SECONDS - t0)) s (status $ok)"
  { echo "boot -> /health: $((SECONDS - t0)) s, status $ok"; inside systemctl is-system-running
    inside ls -l /dev/nvidia-uvm /dev/nvidia-uvm-tools
    inside systemctl show nvidia-uvm-nodes.service -p ActiveState -p Result -p ExecMainExitTimestampMonotonic -p ActiveEnterTimestampMonotonic
    inside systemctl show vllm-$m.service -p ActiveState -p UnitFileState -p InactiveExitTimestampMonotonic -p ExecMainStartTimestampMonotonic -p After
    echo "--- critical-chain"; inside systemd-analyze critical-chain --no-pager vllm-$m.service
    echo "--- journal of this boot"; inside journalctl -b --no-pager -o short-monotonic -u nvidia-uvm-nodes.service -u vllm-$m.service | grep -v 'POST /v1' | head -40
  } > $RES/reboot.txt 2>&1
  cat $RES/reboot.txt
  [ "$ok" = 200 ]
}

boot() {
  mountpoint -q $O || { mkdir -p $O && mount -t tmpfs -o size=48g gpuhost-ovl $O; } || return 1
  local U=$O/upper W=$O/w WK=$O/wk L=$O/layer
  rm -rf $U $W $WK $L; mkdir -p $U $W $WK $L $M
  tar xzf $CARRY/layer.tgz -C $L || return 1
  cp -a $L/sysd/. $U/
  local added="" f n
  for f in $(cd $L/libs && find . -type f -o -type l); do
    n=$(basename "$f"); case $n in lib*) ;; *) continue ;; esac
    if ! ldconfig -p | grep -q "^[[:space:]]$n "; then mkdir -p "$U/$(dirname "$f")"; cp -a "$L/libs/$f" "$U/$f"; added="$added $n"; fi
  done
  echo "libraries the machine lacks, added:$added" | tee $RES/layer-libs.txt
  mount -t overlay gpuhost -o lowerdir=$U:/,upperdir=$W,workdir=$WK $M || { echo "overlay failed"; return 1; }
  mkdir -p $M/usr/local/nvidia && mount --rbind /usr/local/nvidia $M/usr/local/nvidia
  chroot $M ldconfig && chroot $M ldconfig -p | grep -E "libcuda.so.1 |libnvidia-ml.so.1 " | head -2
  cat > /root/gpuhost-boot.sh <<EOS
mount --bind /proc $M/proc; mount --rbind /sys $M/sys; mount --rbind /dev $M/dev; mount -t tmpfs tmpfs $M/run
mkdir -p $M/mnt/c $M/root/carry $M/srv/models; mount --rbind /root/carry $M/root/carry; mount --rbind /srv/models $M/srv/models
mount --bind $M $M/mnt/c
exec chroot $M /usr/bin/systemd-nspawn -D /mnt/c -b --register=no --keep-unit --link-journal=no --capability=all -M gpuhost \
  --bind=/dev/nvidia0 --bind=/dev/nvidiactl $UVM_BINDS --bind=/dev/nvidia-caps \
  --bind-ro=/usr/local/nvidia --bind=/root/carry --bind=/srv/models
EOS
  start_container || return 1
  { echo "is-system-running: $st"; inside systemctl --version | head -1; inside cat /proc/1/comm; grep PRETTY $M/etc/os-release
    inside systemctl --failed --no-legend; inside ls -l /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools
    inside nvidia-smi -L
    # Without the UVM nodes bound in, CUDA is not tried here: the nodes must come from nvidia-uvm-nodes.service.
    [ -n "$UVM_BINDS" ] && inside $PY -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available())'
    inside haproxy -vv | head -3; } 2>&1 | tee $RES/boot.txt
  ldd $M/usr/sbin/haproxy | grep -i "not found"; ldd $M/usr/lib/systemd/systemd | grep -i "not found"
  [ "$st" = running ] || [ "$st" = degraded ]
}

driver() {
  sync_repo
  playbook $CARRY/repo/tools/device/gpuhost_driver.yml 2>&1 | tee $RES/driver-play.log; local rc=${PIPESTATUS[0]}
  { echo "--- systemctl cat"; inside systemctl cat nvidia-uvm-nodes.service
    echo "--- is-enabled: $(inside systemctl is-enabled nvidia-uvm-nodes.service)"
    inside systemctl show nvidia-uvm-nodes.service -p ActiveState -p SubState -p Result -p ExecMainStatus -p Before -p After -p WantedBy
    echo "--- journal"; inside journalctl -u nvidia-uvm-nodes.service --no-pager -o short-iso
    echo "--- modules-load.d"; inside ls -la /etc/modules-load.d/
    echo "--- reverse dependencies (what waits for it)"; inside systemctl list-dependencies --reverse --plain nvidia-uvm-nodes.service
    echo "--- /proc/devices nvidia"; grep nvidia /proc/devices; ls -l /sys/module | grep -i nvidia; ls /sys/module/nvidia /sys/module/nvidia_uvm
    echo "--- /proc/driver/nvidia/version"; cat /proc/driver/nvidia/version
  } > $RES/driver-unit.txt 2>&1
  cat $RES/driver-unit.txt | head -60
  return $rc
}

install() {
  [ -d $CARRY/wheelhouse ] || (cd $CARRY && cat bundle.part[0-9][0-9] > bundle.tar && grep " bundle.tar\$" SHA256SUMS | sha256sum -c - \
    && mkdir -p wheelhouse && tar xf bundle.tar -C wheelhouse --strip-components=1 && rm -f bundle.part[0-9][0-9] bundle.tar) || return 1
  ls $CARRY/wheelhouse | wc -l
  sync_repo
  # The image's venv was made by uv without a pip script; ansible.builtin.pip looks for <venv>/bin/pip.
  inside sh -c "[ -x /opt/torch/.venv/bin/pip ] || { printf '#!/bin/sh\nexec /opt/torch/.venv/bin/python3 -m pip \"\$@\"\n' > /opt/torch/.venv/bin/pip; chmod 755 /opt/torch/.venv/bin/pip; }"
  local t0=$SECONDS
  playbook $CARRY/repo/tools/device/gpuhost_install.yml -e wheelhouse=$CARRY/wheelhouse \
    -e requirements=$CARRY/repo/tools/device/vllm-h200-deps.txt 2>&1 | tee -a $RES/install-play.log; local rc=${PIPESTATUS[0]}
  echo "gpuhost_install.yml: $((SECONDS - t0)) s" | tee -a $RES/install-play.log
  cat $RES/model-weights.log 2>/dev/null | tail -30
  return $rc
}

serve() {
  local m=gpuhost-llama1b-$1
  for _ in $(seq 1 120); do [ -f $RES/model-weights.rc ] && break; sleep 1; done
  [ "$(cat $RES/model-weights.rc 2>/dev/null)" = 0 ] || { cat $RES/model-weights.log; return 1; }
  [ -d /srv/models/$m ] || cp -al $HUB/llmfleet-test/$m /srv/models/$m || return 1
  sync_repo
  local t0=$SECONDS
  playbook $CARRY/repo/tools/device/gpuhost_serve.yml -e model=$m -e label=start-$1 2>&1 | tee $RES/serve-$1-play.log; local rc=${PIPESTATUS[0]}
  echo "gpuhost_serve.yml: $((SECONDS - t0)) s" | tee -a $RES/serve-$1-play.log
  [ $rc -eq 0 ] || inside journalctl -u vllm-$m.service --no-pager -n 80
  return $rc
}

inspect() {
  local m=gpuhost-llama1b-${1:-a}
  sync_repo
  inside $PY $CARRY/repo/tools/device/gpuhost_inspect.py vllm-$m.service $m $RES 2>&1 | tee $RES/inspect-$1.log
  return ${PIPESTATUS[0]}
}

restart() {
  local m=gpuhost-llama1b-${1:-a} t0=$SECONDS
  playbook $CARRY/repo/tools/device/gpuhost_serve.yml -e model=$m -e state=stopped -e label=stop-$1 2>&1 | tail -5
  echo "stop: $((SECONDS - t0)) s"
  inside $PY $CARRY/repo/tools/device/nvml_snapshot.py > $RES/nvml-between-stop-start.json; cat $RES/nvml-between-stop-start.json
  inside systemctl show vllm-$m.service -p ActiveState -p MainPID -p ExecMainStatus > $RES/unit-after-stop.txt
  t0=$SECONDS
  playbook $CARRY/repo/tools/device/gpuhost_serve.yml -e model=$m -e label=restart-$1 2>&1 | tail -5; local rc=${PIPESTATUS[0]}
  echo "start: $((SECONDS - t0)) s"
  inside $PY $CARRY/repo/tools/device/nvml_snapshot.py > $RES/nvml-after-restart.json
  return $rc
}

pivotprep() {
  for _ in $(seq 1 240); do [ -f $RES/model-weights.rc ] && break; sleep 1; done
  [ "$(cat $RES/model-weights.rc 2>/dev/null)" = 0 ] || { cat $RES/model-weights.log; return 1; }
  sync_repo
  rm -rf $CARRY/tools && mkdir -p $CARRY/tools && cp -a $CARRY/repo/tools/localhub $CARRY/repo/tools/traffic/continuous_client.py \
    $CARRY/repo/tools/device/nvml_timeline.py $CARRY/tools/ || return 1
  # No sudo in the host's userland: Ansible's become to the service user (the pivot's JIT cache module) through runuser.
  inside sh -c 'command -v sudo >/dev/null || install -m 0755 /dev/stdin /usr/local/bin/sudo' < $CARRY/repo/tools/device/sudo-shim.sh \
    && inside sudo -H -S -n -u vllm /bin/sh -c id || return 1
  # Debian's haproxy postinst (not run: the package was laid over the root): its user and chroot dir.
  inside sh -c 'getent passwd haproxy >/dev/null || useradd --system --home-dir /var/lib/haproxy --no-create-home \
    --shell /usr/sbin/nologin haproxy; mkdir -p /var/lib/haproxy /run/haproxy' || return 1
  inside systemctl show -p LoadState -p FragmentPath haproxy.service
  # huggingface_hub 2.4.0 (what model_fetch pins) in a venv of its own that sees the image's packages after its own.
  local hf=/opt/llmfleet-hf site=/opt/llmfleet-hf/lib/python3.12/site-packages
  inside sh -c "[ -x $hf/bin/python ] || $PY -m venv --without-pip $hf" || return 1
  inside $PY -m pip install -q --no-index --no-deps --no-compile --target $site $CARRY/wheelhouse/huggingface_hub-2.4.0-*.whl || return 1
  inside sh -c "echo /opt/torch/.venv/lib/python3.12/site-packages > $site/zz-image-venv.pth"
  inside $hf/bin/python -c 'import huggingface_hub, httpx2; print("huggingface_hub", huggingface_hub.__version__)' || return 1
  inside systemctl stop llmfleet-hub.service 2>/dev/null
  inside systemd-run --unit=llmfleet-hub --collect -p StandardOutput=append:$RES/hub.log -p StandardError=append:$RES/hub.log \
    $PY $CARRY/tools/localhub/server.py --root $HUB --port 8090 --quiet || return 1
  local i
  for i in $(seq 1 120); do
    inside $PY -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:8090/api/models/llmfleet-test/gpuhost-llama1b-a", timeout=30)' \
      2>/dev/null && break
    sleep 1
  done
  echo "local hub answers after $i s"; inside $PY -c 'import json, urllib.request as u
for m in ("a", "b"):
    info = json.load(u.urlopen("http://127.0.0.1:8090/api/models/llmfleet-test/gpuhost-llama1b-" + m, timeout=60))
    print(m, info.get("sha"), len(info.get("siblings") or []), "files")' | tee $RES/hub-repos.txt
}

# The unit's JIT caches (vLLM's compile cache and Triton's kernels, issue 45 item 2): cachefleet keeps a copy as "the
# fleet's cache" and empties the host's (a host that never compiled); cacheseed empties it again and lays the copy in,
# owned as the cache directory is (the copy by hand: what seeding does once its manifest is verified).
JIT_DIRS="vllm .triton torchinductor .nv"
cache_fleet() {
  inside sh -c "cd /var/cache/llmfleet-vllm && rm -rf $CARRY/fleetcache && mkdir -p $CARRY/fleetcache && cp -a vllm .triton $CARRY/fleetcache/ \
    && rm -rf $JIT_DIRS && du -s $CARRY/fleetcache/vllm $CARRY/fleetcache/.triton && ls -la" 2>&1 | tee $RES/cache-fleet.txt
  [ ${PIPESTATUS[0]} -eq 0 ]
}
# The two directories, not the copy's top (root's): the cache directory keeps its owner, and the copy gets it.
cache_seed() {
  inside sh -c "cd /var/cache/llmfleet-vllm && du -s $JIT_DIRS; o=\$(stat -c %u:%g .) && rm -rf $JIT_DIRS \
    && cp -a $CARRY/fleetcache/vllm $CARRY/fleetcache/.triton . && chown -R \$o vllm .triton && du -s vllm .triton && ls -la" \
    2>&1 | tee $RES/cache-seed.txt
  [ ${PIPESTATUS[0]} -eq 0 ]
}
# After pivot-revrec: its tar and the manifest beside the caches are the fleet's; the host's caches go (a host that
# never compiled), the manifest with them.
jit_seed_prep() {
  inside sh -c "cd /var/cache/llmfleet-vllm && ls -la $CARRY/jit-fleet.tar && cp llmfleet-jit-manifest.json $RES/jit-fleet-manifest.json \
    && rm -rf $JIT_DIRS llmfleet-jit-manifest.json && ls -la" 2>&1 | tee $RES/jit-seed-prep.txt
  [ ${PIPESTATUS[0]} -eq 0 ] || return 1
  $PY -c 'import json, sys; json.dump({"pivot_jit_cache_seed": {"manifest": json.load(open(sys.argv[1])), "archive": sys.argv[2]}},
    open(sys.argv[3], "w"))' $RES/jit-fleet-manifest.json $CARRY/jit-fleet.tar $CARRY/jit-seed.json
}

client_start() {
  rm -f $RES/client.stop
  inside systemd-run --unit=gpuhost-client --collect -p StandardOutput=append:$RES/client.log -p StandardError=append:$RES/client.log \
    $PY $CARRY/tools/continuous_client.py --base-url http://127.0.0.1:8080/v1 --model chat --workers 4 --seconds 3000 --timeout-s 400 \
    --stop-file $RES/client.stop --output $RES/client.json || return 1
  inside systemd-run --unit=gpuhost-nvml --collect -p StandardOutput=append:$RES/nvml-timeline.log \
    -p StandardError=append:$RES/nvml-timeline.log $PY $CARRY/tools/nvml_timeline.py $RES/nvml-timeline.jsonl $RES/client.stop
  sleep 5; inside systemctl is-active gpuhost-client.service gpuhost-nvml.service
}

client_stop() {
  touch $RES/client.stop
  for _ in $(seq 1 120); do [ -f $RES/client.json ] && break; sleep 1; done
  $PY -c 'import json, sys; d = json.load(open(sys.argv[1])); d.pop("requests_log"); print(json.dumps(d, indent=1))' $RES/client.json
}

# A new commit of B on the local hub (its generation_config.json changes).
publish_b() {
  inside $PY - $HUB llmfleet-test/gpuhost-llama1b-b <<'PY' | tee -a $RES/hub-publish.txt
import json, os, sys, time
sys.path.insert(0, "/root/carry/tools/localhub")
from hub_repos import RepoStore
root, repo_id = sys.argv[1:3]
config = os.path.join(root, repo_id, "generation_config.json")
data = json.load(open(config))
data["llmfleet_published_at"] = time.time()
print(*RepoStore(root).publish_commit(repo_id, {"generation_config.json": (json.dumps(data, indent=2) + "\n").encode()}))
PY
}
# playbooks/pivot.yml on the GPU host with the client on `chat` running. EXPECT=fail: the pivot must fail (and roll back).
pivot_run() {
  local name=$1 expect=ok; shift
  case $name in
    first) set -- -e model=gpuhost-llama1b-a -e pivot_gateway=true -e pivot_alias=chat ;;
    bluegreen) set -- -e model=gpuhost-llama1b-b ;;
    gatefail) expect=fail; set -- -e model=gpuhost-llama1b-a -e pivot_gate_min_output_tok_s=1000000 ;;
    revision) publish_b || return 1; set -- -e model=gpuhost-llama1b-b -e revision=main ;;
    # Fast start (issue 45): new commits of B, stop-then-start, with the old path (revslow*) and the fast one
    # (revfast*: armed beside the old B, then the model's other unit goes).
    revslow|revslow2) publish_b || return 1; set -- -e model=gpuhost-llama1b-b -e revision=main -e llmfleet_fast_start=false ;;
    revfast|revfast2|revfast3|revfast4|revfast5) publish_b || return 1; set -- -e model=gpuhost-llama1b-b -e revision=main ;;
    # The weight loaders (item 3), each a fast revision pivot with the profile of gpuhost-vars.yml.
    revrunai|revfastst) publish_b || return 1; set -- -e model=gpuhost-llama1b-b -e revision=main \
      -e pivot_profile=$([ $name = revrunai ] && echo runai || echo fastst) ;;
    # Item 4: fewer CUDA graph sizes (the profile's first start compiles for its new key, the second is warm).
    revfew|revfew2|revfew3) publish_b || return 1; set -- -e model=gpuhost-llama1b-b -e revision=main -e pivot_profile=fewgraphs ;;
    # Item 2's premise: a host that never compiled (revcold, after cachefleet) and one given the fleet's cache
    # (revseed, after cacheseed), both fast revision pivots with the default profile.
    revcold|revseed) publish_b || return 1; set -- -e model=gpuhost-llama1b-b -e revision=main ;;
    # Item 2 as built: revrec records the caches after its gate and fetches their tar (the canary's part of a rollout);
    # jitseedprep keeps it with its manifest as the fleet's and empties the host's caches; revseedm is given them by
    # pivot_jit_cache_seed (a later host's part), checked file by file before its start.
    revrec) publish_b || return 1; set -- -e model=gpuhost-llama1b-b -e revision=main -e pivot_jit_cache_archive=$CARRY/jit-fleet.tar ;;
    revseedm) publish_b || return 1; set -- -e model=gpuhost-llama1b-b -e revision=main -e @$CARRY/jit-seed.json ;;
    # Rollback by wake (issue 33): A's unit gets sleep mode; B fails its gate and A wakes; B fails again without
    # sleep and A restarts; B passes and A sleeps; A again is a wake (B sleeps, 60 s); B once B's timer stopped it.
    sfirst) set -- -e model=gpuhost-llama1b-a -e pivot_gateway=true -e pivot_alias=chat -e pivot_sleep_previous=true ;;
    sgatefail) expect=fail; set -- -e model=gpuhost-llama1b-b -e pivot_blue_green=false -e pivot_sleep_previous=true \
      -e pivot_gate_min_output_tok_s=1000000 ;;
    rgatefail) expect=fail; set -- -e model=gpuhost-llama1b-b -e pivot_blue_green=false -e pivot_gate_min_output_tok_s=1000000 ;;
    sleep) set -- -e model=gpuhost-llama1b-b -e pivot_blue_green=false -e pivot_sleep_previous=true ;;
    wakeback) set -- -e model=gpuhost-llama1b-a -e pivot_blue_green=false -e pivot_sleep_previous=true -e pivot_keep_previous_s=60 ;;
    reloadback) set -- -e model=gpuhost-llama1b-b -e pivot_blue_green=false ;;
    *) echo "unknown pivot $name"; return 1 ;;
  esac
  # More pivot variables for this call (e.g. PIVOT_EXTRA="-e pivot_prune=true" when the disk runs short), split on blanks.
  local extra=()
  read -ra extra <<<"${PIVOT_EXTRA:-}"
  set -- "$@" "${extra[@]}"
  sync_repo
  local t0=$SECONDS rc
  inside env PYTHONPATH=$CARRY/coll:$CARRY/site ANSIBLE_COLLECTIONS_PATH=$CARRY/coll ANSIBLE_NOCOLOR=1 \
    ANSIBLE_STDOUT_CALLBACK=ansible.builtin.default ANSIBLE_DEPRECATION_WARNINGS=0 ANSIBLE_LOCAL_TEMP=/root/.ansible/tmp \
    $PY -m ansible.cli.playbook -i $CARRY/repo/tools/device/gpuhost-pivot $CARRY/repo/playbooks/pivot.yml "$@" \
    > $RES/pivot-$name.log 2>&1
  rc=$?
  echo "pivot-$name: rc $rc in $((SECONDS - t0)) s (expected: $expect)" | tee -a $RES/pivots.txt
  # The controller keeps a model's latest record only: this pivot's, before a later pivot of the model replaces it.
  local record; record=$(find $RES/controller -name '*-latest.json' -printf '%T@ %p\n' 2>/dev/null | sort -rn | head -1 | cut -d' ' -f2-)
  [ $rc -ne 0 ] || [ -z "$record" ] || cp "$record" $RES/pivot-$name-record.json
  grep -A12 "Pivot summary\|PLAY RECAP" $RES/pivot-$name.log | tail -30
  [ $rc -eq 0 ] || grep -B2 -A6 "FAILED\|fatal:" $RES/pivot-$name.log | tail -40
  { echo "--- $name"; inside cat /var/lib/llmfleet/slots.json; inside systemctl list-units --no-legend 'vllm-*' 'llmfleet-asleep-*'; } >> $RES/slots-after.txt 2>&1
  # The units' own log (vLLM's landmarks and the launcher's lines: the start's phases), since this pivot began.
  inside journalctl --no-pager -o short-unix -u 'vllm-*' --since "-$((SECONDS - t0 + 5))s" > $RES/journal-$name.txt 2>&1
  inside sh -c "cp /var/lib/llmfleet/pivots/*rolled-back.json $RES/ 2>/dev/null; ls /var/lib/llmfleet/asleep 2>/dev/null"
  inside $PY $CARRY/repo/tools/device/nvml_snapshot.py > $RES/nvml-after-$name.json 2>&1
  if [ $expect = fail ]; then [ $rc -ne 0 ]; else [ $rc -eq 0 ]; fi
}

# The sleeping model's timer (pivot_keep_previous_s of the last pivot) stops its unit without a controller.
expiry() {
  local unit=vllm-gpuhost-llama1b-${1:-b}.service i state
  for i in $(seq 1 180); do
    state=$(inside systemctl show -p ActiveState --value $unit)
    [ "$state" = inactive ] && break
    sleep 1
  done
  echo "$unit: $state after $i s" | tee $RES/expiry.txt
  inside journalctl --no-pager -o short-iso -u "llmfleet-asleep-${unit%.service}.timer" -u "llmfleet-asleep-${unit%.service}.service" -u $unit -n 30 >> $RES/expiry.txt 2>&1
  inside $PY $CARRY/repo/tools/device/nvml_snapshot.py > $RES/nvml-after-expiry.json 2>&1
  [ "$state" = inactive ]
}

observe() {
  sync_repo
  local tf=/var/lib/prometheus/node-exporter
  inside mkdir -p $tf $RES/targets
  local t0=$SECONDS rc
  inside env PYTHONPATH=$CARRY/coll:$CARRY/site ANSIBLE_COLLECTIONS_PATH=$CARRY/coll ANSIBLE_NOCOLOR=1 \
    ANSIBLE_STDOUT_CALLBACK=ansible.builtin.default ANSIBLE_DEPRECATION_WARNINGS=0 ANSIBLE_LOCAL_TEMP=/root/.ansible/tmp \
    $PY -m ansible.cli.playbook -i $CARRY/repo/tools/device/gpuhost-pivot $CARRY/repo/playbooks/observability.yml \
    -e observability_prometheus_host=localhost -e observability_targets_dir=$RES/targets -e observability_gpu_python=$PY \
    > $RES/observe-play.log 2>&1
  rc=$?
  echo "observability.yml: rc $rc in $((SECONDS - t0)) s"; grep -A3 "PLAY RECAP" $RES/observe-play.log
  [ $rc -eq 0 ] || grep -B2 -A12 "fatal:\|FAILED" $RES/observe-play.log | tail -40
  sleep 20  # the timer writes the GPU file again (every 15 s)
  inside sh -c "cp $tf/*.prom $RES/; systemctl status --no-pager llmfleet-gpu-metrics.timer llmfleet-gpu-metrics.service" \
    > $RES/observe-units.txt 2>&1
  inside $PY - $RES <<'PY'
import sys, urllib.request as u
res = sys.argv[1]
for name, url in (("observe-haproxy-metrics.txt", "http://127.0.0.1:8405/metrics"),
                  ("observe-slot-metrics.txt", "http://127.0.0.1:8405/slot/default/metrics"),
                  ("observe-vllm-direct-metrics.txt", "http://127.0.0.1:8000/metrics")):
    try:
        body = u.urlopen(url, timeout=10).read()
    except Exception as exc:  # noqa: BLE001
        body = ("ERROR %s\n" % exc).encode()
    open("%s/%s" % (res, name), "wb").write(body)
    print(name, len(body), "bytes")
PY
  ls -la $RES/*.prom $RES/targets; head -c 600 $RES/llmfleet-gpu.prom
  [ $rc -eq 0 ]
}

pack() {
  inside journalctl --no-pager -o short-iso -u 'vllm-*' -u nvidia-uvm-nodes.service > $RES/journal-units.txt 2>&1
  inside journalctl --no-pager -o short-iso -u haproxy.service -u llmfleet-hub.service -u gpuhost-client.service > $RES/journal-gateway.txt 2>&1
  nvidia-smi > $RES/nvidia-smi-end.txt 2>&1
  # The JIT caches the units keep (issue 45 item 0): what each start could reuse.
  inside sh -c 'du -s /var/cache/llmfleet-vllm/* /var/cache/llmfleet-vllm/.[a-z]* /var/cache/llmfleet-vllm/*/* 2>&1; ls -la /tmp' > $RES/cache-sizes.txt 2>&1
  tar czf "$OUT/gpuhost.tgz" -C $RES . && ls -la "$OUT"
}

gpuhost_phase() {
  local phase=$1 rc
  case $phase in
    carry[0-9]*) carry "${phase#carry}" ;;
    extralibs) mkdir -p $CARRY/extra; for d in .whl/extra/*.deb; do dpkg -x "$d" $CARRY/extra; done; cp -a $CARRY/extra/usr/lib/x86_64-linux-gnu/. $M/usr/lib/x86_64-linux-gnu/ \
      && chroot $M ldconfig && inside haproxy -vv > $RES/haproxy-vv.txt; head -3 $RES/haproxy-vv.txt; grep -q "^HAProxy version" $RES/haproxy-vv.txt ;;
    boot) boot ;;
    reboot) reboot_host ;;
    driver) driver ;;
    install) install ;;
    serve-*) serve "${phase#serve-}" ;;
    inspect-*) inspect "${phase#inspect-}" ;;
    restart-*) restart "${phase#restart-}" ;;
    bench-*) sync_repo; m=gpuhost-llama1b-${phase#bench-}; port=8000; [ "${phase#bench-}" = b ] && port=8001
      playbook $CARRY/repo/tools/device/gpuhost_bench.yml -e model=$m -e port=$port 2>&1 | tee $RES/bench-play.log
      rc=${PIPESTATUS[0]}; cp -r $RES/controller $RES/bench-controller 2>/dev/null; (exit $rc) ;;
    pivotprep) pivotprep ;;
    # fastsafetensors and the Run:ai streamer from .whl/loaders (carried), into vLLM's venv; what the image lacks only.
    loaders) rm -rf $CARRY/loaders && cp -a "$repo/.whl/loaders" $CARRY/loaders \
      && inside $PY -m pip install -q --no-index --no-compile --find-links $CARRY/loaders fastsafetensors runai-model-streamer \
      && inside $PY -c 'import fastsafetensors, runai_model_streamer; print("loaders", fastsafetensors.__file__, runai_model_streamer.__file__)' ;;
    cachefleet) cache_fleet ;;
    cacheseed) cache_seed ;;
    jitseedprep) jit_seed_prep ;;
    client-start) client_start ;;
    client-stop) client_stop ;;
    pivot-*) pivot_run "${phase#pivot-}" ;;
    expiry) expiry b ;;
    observe) observe ;;
    pack) pack ;;
    *) echo "unknown phase $phase"; false ;;
  esac
}

run_phases gpuhost_phase "$@"
