#!/usr/bin/env bash
# Print the name of a cached test-bed image with the vLLM CPU engine installed by roles/vllm_install,
# building it first when missing. The name carries a hash of the role and the base rootfs's key, so editing the role or
# the base's packages rebuilds it.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
testbed=$repo/tools/testbed/testbed.sh
CACHE=${TESTBED_CACHE:-/var/cache/llmfleet-testbed}
port=${VLLM_IMAGE_BUILD_PORT:-2299}
key=$(cd "$repo" && find roles/vllm_install roles/model_fetch/tasks/hub_client.yml roles/model_fetch/defaults tools/testbed/vllm-image.yml inventory/testbed/group_vars/all/testbed.yml -type f -print0 \
      | sort -z | xargs -0 sha256sum | cat - <("$testbed" base-key) | sha256sum | cut -c1-12)
image=vllm-cpu-$key
mkdir -p "$CACHE"
exec 9>"$CACHE/vllm-image.lock"
flock 9
if ! "$testbed" has-image "$image"; then
  builder=img-build-$$
  trap '"$testbed" down "$builder" >/dev/null 2>&1 || true' EXIT
  "$testbed" up "$builder" "$port" >&2
  printf 'all:\n  hosts:\n    %s:\n      ansible_port: %s\n' "$builder" "$port" >"$CACHE/$builder.inventory.yml"
  (cd "$repo" && ANSIBLE_CONFIG=$repo/ansible.cfg "$repo/.venv/bin/ansible-playbook" \
      -i "$CACHE/$builder.inventory.yml" -e @inventory/testbed/group_vars/all/testbed.yml tools/testbed/vllm-image.yml) >&2
  rm -f "$CACHE/$builder.inventory.yml"
  "$testbed" save "$builder" "$image" >&2
  trap - EXIT
fi
echo "$image"
