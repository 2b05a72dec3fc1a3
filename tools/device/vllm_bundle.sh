#!/usr/bin/env bash
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# Build what the H200 vLLM run carries (docs/gpu-validation.md), on the development host, from the repo root:
#   tools/device/vllm_bundle.sh [CHUNK_MIB]
# 1. Downloads (PyPI, --no-deps, Python 3.12 manylinux x86_64) vllm==0.26.0, tools/device/vllm-h200-deps.txt and
#    ansible-core with the two wheels of its own that the image lacks, into .whl/h200/wheels.
# 2. Writes the model skeleton (config, tokenizer) with tools/device/random_llama.py into .whl/h200/skel.tgz.
# 3. Packs the wheels into one tar and splits it over .whl/c00, .whl/c01, ... (one per device call, each at most
#    CHUNK_MIB, default 60, with c00 also holding skel.tgz and SHA256SUMS of every part and of the whole tar).
# The device side (tools/device/vllm_h200.sh carryN, install) moves each chunk out of the repo as it arrives,
# checks it, and reassembles the tar once all are there.
set -euo pipefail
chunk_mib=${1:-60}
py=${PYTHON:-.venv/bin/python}
root=.whl/h200
rm -rf "$root" .whl/c[0-9][0-9]
mkdir -p "$root/wheels" "$root/skel"
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_31_x86_64 \
    --platform manylinux_2_34_x86_64 -d "$root/wheels" "$@"
}
download vllm==0.26.0 ansible-core==2.19.14 resolvelib==1.2.1
download -r tools/device/vllm-h200-deps.txt
# One version of each: two wheels of one name would stop the --no-deps install.
dupes=$(ls "$root/wheels" | sed 's/-[0-9].*//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
[ -z "$dupes" ] || { echo "two versions of: $dupes" >&2; exit 1; }
"$py" tools/device/random_llama.py skeleton "$root/skel" >/dev/null
tar czf "$root/skel.tgz" -C "$root/skel" .
tar cf "$root/bundle.tar" -C "$root" wheels
chunk=$((chunk_mib * 1024 * 1024))
first=$((chunk - $(stat -c %s "$root/skel.tgz") - 65536))
mkdir -p .whl/c00
head -c "$first" "$root/bundle.tar" > .whl/c00/bundle.part00
tail -c +$((first + 1)) "$root/bundle.tar" | split -b "$chunk" -d -a 2 --numeric-suffixes=1 - "$root/bundle.part"
for part in "$root"/bundle.part[0-9][0-9]; do
  n=${part##*part}
  mkdir -p ".whl/c$n"
  mv "$part" ".whl/c$n/"
done
cp "$root/skel.tgz" .whl/c00/
(cd "$root" && sha256sum bundle.tar skel.tgz) > .whl/c00/SHA256SUMS
(cd .whl && for d in c[0-9][0-9]; do sha256sum "$d"/bundle.part*; done) | sed 's| c[0-9][0-9]/| |' >> .whl/c00/SHA256SUMS
ls "$root/wheels" | wc -l | sed 's/$/ wheels/'
du -sb .whl/c[0-9][0-9] | awk '{printf "%s %.1f MiB\n", $2, $1 / 1048576}'
