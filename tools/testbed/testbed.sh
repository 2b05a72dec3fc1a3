#!/usr/bin/env bash
# Local systemd test hosts for the collection: real systemd as PID 1 in
# systemd-nspawn machines, built from Debian packages (no image registry).
# See docs/testbed.md for why nspawn and not podman/docker.
#
#   testbed.sh build                 debootstrap the cached base rootfs (once)
#   testbed.sh up NAME SSH_PORT [IMAGE]  boot a fresh machine NAME from the base rootfs (or a saved IMAGE),
#                                    sshd on 127.0.0.1:SSH_PORT
#   testbed.sh down NAME             power it off and delete it
#   testbed.sh reboot NAME           a clean reboot (units stop, the machine boots again from its own rootfs)
#   testbed.sh save NAME IMAGE       power NAME off and keep its rootfs as IMAGE (a cached layer for later ups)
#   testbed.sh has-image IMAGE       exit 0 when IMAGE is cached
#   testbed.sh base-key              the key of the base rootfs (images built on it carry it in their name)
#   testbed.sh exec NAME CMD...      run CMD inside NAME (nsenter)
#   testbed.sh standin NAME          put the STAND-IN vLLM server (tests/standin/vllm, not vLLM) in NAME's
#                                    /opt/vllm-standin, a venv over its python3, for tests of the collection's own
#                                    logic (they pass vllm_install_venv=/opt/vllm-standin); docs/testbed.md
#   testbed.sh list                  machines that are up
set -euo pipefail

SUITE=${TESTBED_SUITE:-bookworm}
MIRROR=${TESTBED_MIRROR:-http://deb.debian.org/debian}
CACHE=${TESTBED_CACHE:-/var/cache/llmfleet-testbed}
STATE=${TESTBED_STATE:-/var/lib/llmfleet-testbed}
# python3-apt: ansible's apt module; python3-venv/pip: vllm_install; procps, iproute2: health checks; rsync: the hosts
# seed each other (roles/model_seed).
PACKAGES=systemd,systemd-sysv,dbus,python3,python3-venv,python3-pip,python3-apt,openssh-server,sudo,ca-certificates,procps,iproute2,curl,libnuma1,libgomp1,g++,rsync
ROOTFS_KEY=$(printf '%s %s %s v1' "$SUITE" "$PACKAGES" "$MIRROR" | sha256sum | cut -c1-12)
BASE=$CACHE/rootfs-$SUITE-$ROOTFS_KEY
SSH_KEY=$CACHE/id_ed25519
# hybrid (default): systemd inside tracks units on cgroup v2 and learns at once that a stopped
# unit's cgroup is empty; legacy: cgroup v1 only, where that notification never reaches a
# container and every stop waits out TimeoutStopSec.
CGROUP_MODE=${TESTBED_CGROUP_MODE:-hybrid}
CGROUP_HIERARCHIES=(/sys/fs/cgroup/systemd /sys/fs/cgroup/unified)

log() { printf '[testbed] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

need_tools() {
  local missing=()
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
  command -v ssh >/dev/null || missing+=(openssh-client)
  if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

cmd_build() {
  need_tools
  mkdir -p "$CACHE"
  [[ -f $SSH_KEY ]] || ssh-keygen -q -t ed25519 -N '' -f "$SSH_KEY" -C llmfleet-testbed
  if [[ -f $BASE/.complete ]]; then log "base rootfs cached: $BASE"; return; fi
  local tmp=$BASE.tmp.$$
  rm -rf "$tmp"
  log "debootstrap $SUITE into $tmp (several minutes, cached afterwards)"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/debootstrap.log" >&2; rm -rf "$tmp"; die "debootstrap failed (log: $CACHE/debootstrap.log)"; }
  cp /etc/apt/sources.list.d/debian.sources "$tmp/etc/apt/sources.list.d/" 2>/dev/null || true
  # Keep what a booted test host does not need from slowing boot or touching the host.
  chroot "$tmp" systemctl mask systemd-networkd.service systemd-resolved.service \
    systemd-timesyncd.service getty@tty1.service console-getty.service apt-daily.timer apt-daily-upgrade.timer >/dev/null 2>&1 || true
  chroot "$tmp" systemctl enable ssh.service >/dev/null 2>&1
  rm -f "$tmp"/etc/ssh/ssh_host_*  # generated per machine at boot (up)
  touch "$tmp/.complete"
  mv "$tmp" "$BASE"
  log "base rootfs ready: $BASE ($(du -sh "$BASE" | cut -f1))"
}

# Without systemd as the host's PID 1 nobody gives nspawn a cgroup of its own: every machine would
# put its units under the same /payload tree. Each machine gets its own cgroup in every hierarchy.
machine_cgroups() { local h; for h in "${CGROUP_HIERARCHIES[@]}"; do [[ -d $h ]] && echo "$h/llmfleet-testbed/$1"; done; }

enter_machine_cgroup() {
  local cg
  for cg in $(machine_cgroups "$1"); do mkdir -p "$cg"; echo "$BASHPID" >"$cg/cgroup.procs"; done
}

remove_machine_cgroup() {
  local cg
  for cg in $(machine_cgroups "$1"); do
    [[ -d $cg ]] && find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

# The machine's init: nspawn's child now (asked each time; early on nspawn briefly has a helper child).
leader_pid() { pgrep -P "$(cat "$STATE/$1/nspawn.pid" 2>/dev/null)" 2>/dev/null | tail -1; }

cmd_up() {
  local name=${1:?name} port=${2:?ssh port} image=${3:-}
  local src=$BASE
  if [[ -n $image ]]; then src=$CACHE/images/$image; [[ -f $src/.complete ]] || die "no image $image in $CACHE/images"; fi
  [[ $name =~ ^[a-z0-9][a-z0-9-]{0,30}$ ]] || die "machine name '$name' must match [a-z0-9-]"
  cmd_build
  local dir=$STATE/$name root=$STATE/$name/rootfs
  if [[ -f $dir/nspawn.pid ]] && kill -0 "$(cat "$dir/nspawn.pid")" 2>/dev/null; then
    log "$name already up (pid $(leader_pid "$name"))"; return
  fi
  cmd_down "$name" 2>/dev/null   # leftovers of an earlier run under this name
  if ss -Hltn "sport = :$port" | grep -q .; then die "ssh port $port is already in use on this host"; fi
  mkdir -p "$dir/upper" "$dir/work" "$root"
  # The image stays read-only below a per-machine overlay: an up takes no copy of its ~4 GB, a down deletes only
  # what the machine wrote. Where overlayfs cannot be mounted, a full copy.
  if mount -t overlay "llmfleet-$name" -o "lowerdir=$src,upperdir=$dir/upper,workdir=$dir/work" "$root" 2>/dev/null; then
    log "overlay of ${image:-base} rootfs for $name"
  else
    log "copying ${image:-base} rootfs for $name (no overlayfs here)"
    rmdir "$root"; cp -a --reflink=auto "$src" "$root"
  fi
  echo "$name" >"$root/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$name" >"$root/etc/hosts"
  chroot "$root" ssh-keygen -A >/dev/null
  # Trust what the host trusts (package registries may sit behind a TLS-inspecting proxy).
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null 2>&1
  fi
  install -d -m 0700 "$root/root/.ssh"
  install -m 0600 "$SSH_KEY.pub" "$root/root/.ssh/authorized_keys"
  printf 'Port %s\nListenAddress 127.0.0.1\nPermitRootLogin prohibit-password\nUseDNS no\n' "$port" \
    >"$root/etc/ssh/sshd_config.d/testbed.conf"
  echo "$port" >"$dir/ssh_port"
  boot_machine "$name"
}

# Boot (again) the machine whose rootfs is laid out under $STATE/NAME, and wait until it answers on ssh.
boot_machine() {
  local name=$1 dir=$STATE/$1 root=$STATE/$1/rootfs port
  port=$(cat "$dir/ssh_port")
  local binds=()
  [[ -d /opt/wheels ]] && binds+=(--bind-ro=/opt/wheels)   # local wheels (torch CPU) where the machine has them
  [[ -n ${TESTBED_EXTRA_BIND:-} ]] && binds+=(--bind="$TESTBED_EXTRA_BIND")
  # One cache of accepted vLLM command lines for every machine of a run (tools/run-tests.sh sets it, empty at the
  # run's start): its key is the installation (interpreter, vLLM's version, files and their mtime) and the command
  # lines, which machines booted from one image share, so a line vLLM's parser accepted on one is not parsed again on
  # another (8-12 CPU-s each; plugins/modules/vllm_args_check.py).
  [[ -n ${TESTBED_ARGS_CACHE:-} ]] && binds+=(--bind="$TESTBED_ARGS_CACHE:/var/cache/llmfleet")
  log "booting $name (ssh 127.0.0.1:$port)"
  local cgroup_env=()
  case $CGROUP_MODE in
    hybrid) ;;
    legacy) cgroup_env=(SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=0) ;;
    *) die "TESTBED_CGROUP_MODE must be hybrid or legacy, not '$CGROUP_MODE'" ;;
  esac
  (
    enter_machine_cgroup "$name"
    exec env "${cgroup_env[@]}" setsid systemd-nspawn -b -D "$root" --register=no --keep-unit \
      -M "$name" "${binds[@]}"
  ) </dev/null >"$dir/console.log" 2>&1 &
  echo $! >"$dir/nspawn.pid"
  local i leader=""
  for i in $(seq 1 120); do
    leader=$(pgrep -P "$(cat "$dir/nspawn.pid")" 2>/dev/null | head -1 || true)
    [[ -n $leader ]] && break
    kill -0 "$(cat "$dir/nspawn.pid")" 2>/dev/null || { tail -20 "$dir/console.log" >&2; die "nspawn for $name exited"; }
    sleep 0.5
  done
  [[ -n $leader ]] || die "no init process for $name"
  for i in $(seq 1 120); do
    if ssh_cmd "$name" true 2>/dev/null; then
      log "$name is up: init pid $(leader_pid "$name"), $(nsenter -t "$(leader_pid "$name")" -a systemctl is-system-running 2>/dev/null || true)"
      return
    fi
    sleep 1
  done
  tail -30 "$dir/console.log" >&2
  die "$name did not answer on ssh port $port"
}

ssh_cmd() {
  local name=$1; shift
  ssh -q -i "$SSH_KEY" -p "$(cat "$STATE/$name/ssh_port")" -o StrictHostKeyChecking=no \
    -o UserKnownHostsFile=/dev/null -o ConnectTimeout=3 -o BatchMode=yes root@127.0.0.1 "$@"
}

# nspawn processes of machine NAME, found by command line so that leftovers of a
# crashed run (state dir gone) are found too.
nspawn_pids() { pgrep -f -- "systemd-nspawn .* -M $1( |\$)" || true; }

unmount_rootfs() { if mountpoint -q "$1"; then umount "$1" 2>/dev/null || umount -l "$1"; fi; }

cmd_down() {
  local name=${1:?name} dir=$STATE/$1 leader pid
  leader=$(leader_pid "$name" || true)
  if [[ -n $leader ]] && kill -0 "$leader" 2>/dev/null; then
    nsenter -t "$leader" -a systemctl poweroff >/dev/null 2>&1 || true
    for _ in $(seq 1 60); do [[ -z $(nspawn_pids "$name") ]] && break; sleep 0.5; done
  fi
  for pid in $(nspawn_pids "$name"); do
    log "$name did not power off cleanly; killing nspawn $pid and its init"
    kill -9 $(pgrep -P "$pid") "$pid" 2>/dev/null || true
  done
  for _ in $(seq 1 20); do [[ -z $(nspawn_pids "$name") ]] && break; sleep 0.5; done
  remove_machine_cgroup "$name"
  unmount_rootfs "$dir/rootfs"
  rm -rf "$dir"
  log "$name is down"
}

# A clean reboot that keeps what the machine wrote: systemd stops every unit, the machine boots again from the same
# rootfs and starts what is enabled.
cmd_reboot() {
  local name=${1:?name} leader
  leader=$(leader_pid "$name") || die "$name is not up"
  nsenter -t "$leader" -a systemctl poweroff >/dev/null 2>&1 || true
  for _ in $(seq 1 120); do [[ -z $(nspawn_pids "$name") ]] && break; sleep 0.5; done
  [[ -z $(nspawn_pids "$name") ]] || die "$name did not power off"
  remove_machine_cgroup "$name"
  log "rebooting $name"
  boot_machine "$name"
}

cmd_save() {
  local name=${1:?name} image=${2:?image} dir=$STATE/$1
  [[ -d $dir/rootfs ]] || die "$name is not up"
  local leader; leader=$(leader_pid "$name" || true)
  [[ -n $leader ]] && nsenter -t "$leader" -a systemctl poweroff >/dev/null 2>&1 || true
  for _ in $(seq 1 60); do [[ -z $(nspawn_pids "$name") ]] && break; sleep 0.5; done
  [[ -z $(nspawn_pids "$name") ]] || die "$name did not power off; not saving a live rootfs"
  remove_machine_cgroup "$name"
  local dest=$CACHE/images/$image
  rm -rf "$dest" "$dest.tmp"; mkdir -p "$CACHE/images"
  if mountpoint -q "$dir/rootfs"; then
    cp -a "$dir/rootfs" "$dest.tmp"  # the overlay's merged view
    unmount_rootfs "$dir/rootfs"
  else
    mv "$dir/rootfs" "$dest.tmp"
  fi
  rm -f "$dest.tmp"/etc/ssh/ssh_host_* "$dest.tmp/root/.ssh/authorized_keys" "$dest.tmp/etc/ssh/sshd_config.d/testbed.conf"
  : >"$dest.tmp/etc/machine-id"
  mv "$dest.tmp" "$dest"
  rm -rf "$dir"
  log "saved $name as image $image ($(du -sh "$dest" | cut -f1))"
}

cmd_standin() {
  local name=${1:?name} root=$STATE/${1:-}/rootfs venv=/opt/vllm-standin python
  [[ -d $root/usr/bin ]] || die "no machine $name"
  python=$(cd "$root/usr/bin" && ls python3.[0-9]* | grep -E '^python3\.[0-9]+$' | sort -V | tail -1)
  rm -rf "${root:?}$venv"
  install -d "$root$venv/bin" "$root$venv/lib/$python/site-packages"
  printf 'home = /usr/bin\ninclude-system-site-packages = false\nversion = %s\n' "${python#python}" >"$root$venv/pyvenv.cfg"
  ln -s "/usr/bin/$python" "$root$venv/bin/python3"
  ln -s python3 "$root$venv/bin/python"
  cp -r "$(dirname "$0")/../../tests/standin/vllm" "$root$venv/lib/$python/site-packages/vllm"
  find "$root$venv" -name __pycache__ -prune -exec rm -rf {} +
  # What the JIT caches' key reads from a venv (jit_cache): the versions of vllm and torch, from their dist-info.
  local dist version
  version=$(sed -n 's/^VERSION = "\(.*\)"$/\1/p' "$(dirname "$0")/../../tests/standin/vllm/standin_server.py")
  for dist in vllm torch; do
    install -d "$root$venv/lib/$python/site-packages/$dist-$version.dist-info"
    printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$dist" "$version" \
      >"$root$venv/lib/$python/site-packages/$dist-$version.dist-info/METADATA"
  done
  printf '#!%s/bin/python3\nimport sys\nfrom vllm.entrypoints.cli.main import main\nsys.exit(main())\n' "$venv" >"$root$venv/bin/vllm"
  chmod 0755 "$root$venv/bin/vllm"
  log "stand-in vLLM server in $name:$venv ($python)"
}

cmd_exec() { local name=${1:?name}; shift; nsenter -t "$(leader_pid "$name")" -a "$@"; }

cmd_list() {
  local d
  for d in "$STATE"/*/; do
    [[ -f $d/nspawn.pid ]] || continue
    kill -0 "$(cat "$d/nspawn.pid")" 2>/dev/null && printf '%s ssh_port=%s\n' "$(basename "$d")" "$(cat "$d/ssh_port")"
  done
}

case ${1:-} in
  build) cmd_build ;;
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  reboot) shift; cmd_reboot "$@" ;;
  save) shift; cmd_save "$@" ;;
  has-image) [[ -f $CACHE/images/${2:?image}/.complete ]] ;;
  base-key) echo "$ROOTFS_KEY" ;;
  exec) shift; cmd_exec "$@" ;;
  standin) shift; cmd_standin "$@" ;;
  ssh) shift; ssh_cmd "$@" ;;
  list) cmd_list ;;
  key) echo "$SSH_KEY" ;;
  *) sed -n '2,13p' "$0"; exit 2 ;;
esac
