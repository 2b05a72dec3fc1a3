#!/usr/bin/env bash
# Print the name of a cached test-bed image with the vLLM CPU engine installed by roles/vllm_install,
# building it first when missing. The name carries a hash of the role and the base rootfs's key, so editing the role or
# the base's packages rebuilds it. The build is molecule's vllm_install scenario on a bare machine (converge, idempotence,
# verify), recorded beside the image; `vllm-image.sh --proof` prints that record (make test's molecule-vllm_install job).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
testbed=$repo/tools/testbed/testbed.sh
CACHE=${TESTBED_CACHE:-/var/cache/llmfleet-testbed}
port=${VLLM_IMAGE_BUILD_PORT:-2299}
key=$(cd "$repo" && find roles/vllm_install roles/model_fetch/tasks/hub_client.yml roles/model_fetch/defaults tools/testbed/vllm-image.yml \
      tools/testbed/vllm-image.sh molecule/vllm_install inventory/testbed/group_vars/all/testbed.yml -type f -print0 \
      | sort -z | xargs -0 sha256sum | cat - <("$testbed" base-key) | sha256sum | cut -c1-12)
image=vllm-cpu-$key
mkdir -p "$CACHE/images"
exec 9>"$CACHE/vllm-image.lock"
flock 9
proof=$CACHE/images/$image.proof
if [[ ${1:-} == --proof ]]; then
  # What molecule's vllm_install scenario proved when it ran beside the image build (issue 41): the image build is
  # that scenario on a bare machine, so `make test` shows its record instead of installing vLLM a second time.
  [[ -s $proof ]] || { echo "no proof of roles/vllm_install for $image ($proof): run tools/testbed/vllm-image.sh" >&2; exit 1; }
  cat "$proof"
  exit 0
fi
if ! "$testbed" has-image "$image"; then
  builder=img-build-$$
  trap '"$testbed" down "$builder" >/dev/null 2>&1 || true' EXIT
  "$testbed" up "$builder" "$port" >&2
  printf 'all:\n  hosts:\n    %s:\n      ansible_port: %s\n' "$builder" "$port" >"$CACHE/$builder.inventory.yml"
  play() {
    (cd "$repo" && ANSIBLE_CONFIG=$repo/ansible.cfg "$repo/.venv/bin/ansible-playbook" \
      -i "$CACHE/$builder.inventory.yml" -e @inventory/testbed/group_vars/all/testbed.yml "$@") | tee -a "$proof.tmp" >&2
  }
  : >"$proof.tmp"
  # molecule's vllm_install scenario, once, on this bare machine: converge, a second converge that changes nothing
  # (its idempotence), then the scenario's own verify.
  play tools/testbed/vllm-image.yml
  play tools/testbed/vllm-image.yml
  recap=$(grep -E "^$builder +: " "$proof.tmp" | tail -1)
  [[ $recap == *" changed=0 "* && $recap == *" failed=0 "* ]] \
    || { echo "[testbed] the second converge of the vLLM image changed or failed something: $recap" >&2; exit 1; }
  play molecule/vllm_install/verify.yml
  rm -f "$CACHE/$builder.inventory.yml"
  "$testbed" save "$builder" "$image" >&2
  { echo "roles/vllm_install on a bare machine, for image $image, $(date -u '+%F %T UTC'):"
    grep -E "^(PLAY \[|PLAY RECAP|$builder +: )" "$proof.tmp"; } >"$proof"
  rm -f "$proof.tmp"
  trap - EXIT
fi
echo "$image"
