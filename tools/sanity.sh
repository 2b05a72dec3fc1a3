#!/usr/bin/env bash
# Run `ansible-test sanity` on a copy of the working tree laid out as ansible_collections/llmfleet/vllm.
#   tools/sanity.sh [WORKDIR] [ansible-test sanity args...]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$repo/build/sanity}; shift || true
tree=$work/ansible_collections/llmfleet/vllm
rm -rf "$work"; mkdir -p "$tree"
cd "$repo"
git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do
  [[ -e $f ]] && cp --parents -a "$f" "$tree/"
done
cd "$tree"
git init -q && git add -A
exec "$repo/.venv/bin/ansible-test" sanity --python 3.11 --color no "$@"
