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
# ansible-test fetches a pip bootstrap script from a host CI cannot reach: seed its cache with ours.
pip_ver=$("$repo/.venv/bin/python" -c 'import re, ansible_test._internal.python_requirements as m, inspect
print(re.search(r"pip=.([0-9.]+)", inspect.getsource(m.get_venv_packages)).group(1))')
cache=~/.ansible/test/cache/get_pip_${pip_ver//./_}.py
[[ -f $cache ]] || { mkdir -p "$(dirname "$cache")"; cp "$repo/tools/ansible_test_get_pip.py" "$cache"; }
cd "$tree"
git init -q && git add -A
exec "$repo/.venv/bin/ansible-test" sanity --python 3.11 --color no "$@"
