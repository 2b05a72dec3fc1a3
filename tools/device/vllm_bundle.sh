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
. "$(dirname "$0")/lib.sh"
root=.whl/h200 chunk_mib=${1:-60} py=${PYTHON:-.venv/bin/python}
new_bundle "$root"
download_wheels "$root/wheels" vllm==0.26.0 ansible-core==2.19.14 resolvelib==1.2.1
download_wheels "$root/wheels" -r tools/device/vllm-h200-deps.txt
# One version of each: two wheels of one name would stop the --no-deps install.
dupes=$(ls "$root/wheels" | sed 's/-[0-9].*//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)
[ -z "$dupes" ] || { echo "two versions of: $dupes" >&2; exit 1; }
"$py" tools/device/random_llama.py skeleton "$root/skel" >/dev/null
tar czf "$root/skel.tgz" -C "$root/skel" .
tar cf "$root/bundle.tar" -C "$root" wheels
chunk_bundle "$root" "$chunk_mib" skel.tgz
