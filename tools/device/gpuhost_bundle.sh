#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# Build what the systemd GPU host run carries (tools/device/gpuhost.sh, docs/gpu-validation.md), on a Debian 12
# development host, from the repo root:   tools/device/gpuhost_bundle.sh [CHUNK_MIB]
#   layer.tgz  Debian 12's systemd 252, systemd-container (nspawn), systemd-sysv, dbus and haproxy 2.6 files
#              (haproxy also needs libopentracing-c-wrapper0 and libopentracing1: added after the 2026-12-04 run,
#              which carried them in a separate call, gpuhost.sh extralibs)
#              (apt-get download + dpkg -x; /lib, /bin, /sbin moved under usr/ for the machine's merged /usr), and
#              in libs/ the shared libraries they load that an Ubuntu 24.04 root may lack (gpuhost.sh boot adds only
#              those the machine's ldconfig does not know)
#   ctl.tgz    the controller: ansible-core 2.19.14 and the wheels of its own the image lacks, and the collection
#              community.general (the pivot's filters; found missing by the 2026-12-05 run), from .venv
#   skel.tgz   the Llama-3.2-1B-shaped model's config and tokenizer (tools/device/random_llama.py skeleton)
#   the wheelhouse: vLLM 0.26.0, huggingface_hub 2.4.0 (the pivot's model_fetch venv, gpuhost.sh pivotprep) and tools/device/vllm-h200-deps.txt (PyPI, --no-deps, CPython 3.12 manylinux x86_64)
#              in one tar split over .whl/c00 ... (each chunk at most CHUNK_MIB, default 59; c00 also holds the three
#              tarballs above and SHA256SUMS of every part, of the tar and of the tarballs)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
root=.whl/gpuhost chunk_mib=${1:-59} py=${PYTHON:-.venv/bin/python}
new_bundle "$root"
mkdir -p "$root/debs" "$root/layer/sysd" "$root/layer/libs" "$root/ctl"
(cd "$root/debs" && apt-get download -q systemd systemd-container systemd-sysv dbus dbus-bin dbus-daemon \
  dbus-system-bus-common haproxy libsystemd-shared libdbus-1-3 libip4tc2 libapparmor1 libkmod2 liblua5.3-0 libpcre2-8-0 \
  libssl3 libcrypt1 libopentracing-c-wrapper0 libopentracing1 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
for d in "$root"/debs/*.deb; do
  case $(basename "$d") in
    lib*) dpkg -x "$d" "$root/layer/libs" ;;
    *) dpkg -x "$d" "$root/layer/sysd" ;;
  esac
done
for part in sysd libs; do
  r=$root/layer/$part
  for top in lib bin sbin; do
    if [ -d "$r/$top" ]; then mkdir -p "$r/usr/$top"; cp -a "$r/$top/." "$r/usr/$top/"; rm -rf "${r:?}/$top"; fi
  done
  rm -rf "$r/usr/share/doc" "$r/usr/share/man" "$r/usr/share/locale" "$r/usr/share/lintian"
done
ls "$root"/debs | sed 's/_amd64.deb\|_all.deb//' > "$root/layer/debs.txt"
tar czf "$root/layer.tgz" -C "$root/layer" .
# Reuse the wheels tools/device/vllm_bundle.sh downloaded, if any.
[ -d .whl/h200/wheels ] && cp -n .whl/h200/wheels/*.whl "$root/wheels/" 2>/dev/null || true
download_wheels "$root/wheels" vllm==0.26.0 ansible-core==2.19.14 resolvelib==1.2.1 huggingface_hub==2.4.0
download_wheels "$root/wheels" -r tools/device/vllm-h200-deps.txt
dupes=$(ls "$root/wheels" | sed 's/-[0-9].*//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
[ -z "$dupes" ] || { echo "two versions of: $dupes" >&2; exit 1; }
cp "$root"/wheels/{ansible_core,resolvelib,cryptography,cffi,pycparser}-*.whl "$root/ctl/"
cg=$("$py" -c 'import ansible_collections.community.general as c; print(list(c.__path__)[0])')
mkdir -p "$root/ctl/ansible_collections/community" && cp -a "$cg" "$root/ctl/ansible_collections/community/general"
tar czf "$root/ctl.tgz" -C "$root/ctl" .
"$py" tools/device/random_llama.py skeleton "$root/skel" --shape llama3.2-1b >/dev/null
tar czf "$root/skel.tgz" -C "$root/skel" .
tar cf "$root/bundle.tar" -C "$root" wheels
chunk_bundle "$root" "$chunk_mib" skel.tgz layer.tgz ctl.tgz
