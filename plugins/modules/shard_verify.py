#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: shard_verify
short_description: Verify a model directory is complete and intact before loading it
description:
  - Checks a downloaded model directory (safetensors shards or GGUF split files) without loading it, so a
    short or damaged shard fails in seconds instead of after minutes of vLLM loading.
  - C(fast) mode reads only file sizes and headers. It checks that every shard named in each
    C(*.safetensors.index.json) weight_map exists and holds the tensors the index puts there, that every
    file of the manifest exists with its expected size, that numbered part sets
    (C(*-00001-of-00003.gguf), C(*-00001-of-00004.safetensors)) are complete, that each safetensors header
    parses and its tensors tile the data area exactly (dtype x shape bytes, no gap, no overlap, last tensor
    ending at the end of the file), that each GGUF header has the magic, a known version and tensor data
    that fits the file, and that the required side files exist.
  - C(full) mode adds a hash of every file against the manifest, in parallel over files, sha256 where the
    manifest has one (LFS files), otherwise the git blob sha1. It needs a manifest.
  - The manifest format (C(.llmfleet-manifest.json)) is documented in the C(model_manifest) module_utils.
  - Changes nothing unless O(set_aside_extra) is set and there are extra files; check mode runs the same checks and says
    what it would move.
version_added: 0.1.0
author:
  - llmfleet maintainers (@llmfleet)
options:
  path:
    description: Model directory to verify.
    type: path
    required: true
  mode:
    description:
      - C(fast) reads sizes and headers only; C(full) also hashes every file the manifest has a hash for.
    type: str
    choices: [fast, full]
    default: fast
  manifest:
    description:
      - Manifest to verify against.
      - Defaults to C(.llmfleet-manifest.json) inside O(path) when that file exists; without one, fast mode
        checks the indexes, part sets, headers and required files only.
    type: path
  required_files:
    description:
      - Files that must exist, relative to O(path). C(a|b) means any one of them.
      - Defaults to C(config.json) and one of C(tokenizer_config.json), C(tokenizer.json), C(tokenizer.model)
        for safetensors models, and to nothing for GGUF-only directories (GGUF embeds both).
    type: list
    elements: str
  workers:
    description: Files hashed at once in full mode. Defaults to the CPUs available to the module.
    type: int
  fail_on_extra:
    description:
      - Fail when the directory holds files the manifest does not list (or, without a manifest,
        safetensors files no index names). They are always reported in RV(extra).
    type: bool
    default: false
  set_aside_extra:
    description:
      - After a passed verification against a manifest, move the files the manifest does not list (RV(extra)) to
        C(.cache/llmfleet/extra/) in O(path) (a numbered name when one is there), so that the directory holds exactly
        the manifest's files; nothing is deleted. A loader may pick up a file such as C(chat_template.jinja) by its
        presence alone.
    type: bool
    default: false
  ignore_patterns:
    description: Glob patterns of paths (relative to O(path)) that are neither checked nor reported as extra.
    type: list
    elements: str
    default: ['.llmfleet-manifest.json', '.cache/*']
  use_download_hashes:
    description:
      - In full mode, do not read again a file M(llmfleet.vllm.hf_snapshot) hashed while it downloaded, as long as the
        file kept the identity it had then (device, inode, size, mtime and ctime, one of which any write or
        replacement changes); its recorded digest is compared with the manifest instead. Every other file is hashed.
      - V(false) (the default) reads every byte, which also catches corruption at rest that left the identity alone.
    type: bool
    default: false
attributes:
  check_mode:
    description: Runs the same read-only checks in check mode.
  diff_mode:
    description: Nothing is changed, so there is no diff.
extends_documentation_fragment:
  - llmfleet.vllm.attributes
notes:
  - Module code is stdlib-only; safetensors and GGUF headers are parsed without their libraries.
"""

EXAMPLES = r"""
- name: Check shards, headers and sizes before a swap (about a second even for big models)
  llmfleet.vllm.shard_verify:
    path: /srv/models/GLM-4.5-Air

- name: Hash every file against the download manifest
  llmfleet.vllm.shard_verify:
    path: /srv/models/GLM-4.5-Air
    mode: full
    fail_on_extra: true
  register: verify

- name: A GGUF split model with a manifest kept elsewhere
  llmfleet.vllm.shard_verify:
    path: /srv/models/GLM-5-GGUF/Q4_K_M
    manifest: /srv/manifests/GLM-5-GGUF-Q4_K_M.json
    mode: full
"""

RETURN = r"""
files:
  description: One result per checked file, sorted by path.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Path relative to the model directory.
      type: str
    size:
      description: Bytes on disk (null when missing).
      type: int
    expected_size:
      description: Bytes the manifest expects (null without a manifest entry).
      type: int
    status:
      description: C(ok), C(missing), C(truncated), C(oversize), C(corrupt), C(hash_mismatch) or C(header_invalid).
      type: str
    reason:
      description: Why the status is not C(ok).
      type: str
    seconds:
      description: Time spent on this file (header reads and hashing).
      type: float
    hash_algorithm:
      description: C(sha256) or C(git_sha1) when the manifest gives a hash (full mode only), else null.
      type: str
    hash_checked:
      description: Whether the hash was computed and matched.
      type: bool
  sample:
    - {path: model-00002-of-00004.safetensors, size: 4999802720, expected_size: 4999802721, status: truncated,
       reason: "4999802720 bytes, expected 4999802721 (1 short)", seconds: 0.0002, hash_algorithm: null,
       hash_checked: false}
bad:
  description: Paths whose status is not C(ok).
  returned: always
  type: list
  elements: str
missing:
  description: Expected paths that do not exist.
  returned: always
  type: list
  elements: str
extra:
  description: Paths present but not in the manifest (or, without one, safetensors files no index names).
  returned: always
  type: list
  elements: str
set_aside:
  description: The RV(extra) files moved aside (O(set_aside_extra)), or that check mode would move.
  returned: always
  type: list
  elements: str
model_dir:
  description: The verified directory (O(path)).
  returned: always
  type: str
mode:
  description: The mode that ran.
  returned: always
  type: str
manifest:
  description: Manifest used, or null.
  returned: always
  type: str
total_bytes:
  description: Bytes of all files in the directory (ignored paths excepted).
  returned: always
  type: int
bytes_hashed:
  description: Bytes read for hashing (0 in fast mode).
  returned: always
  type: int
bytes_hashed_while_downloading:
  description: Bytes whose digest M(llmfleet.vllm.hf_snapshot) took during the download and that were not read again.
  returned: always
  type: int
files_hashed_while_downloading:
  description: Files settled by a digest taken during the download.
  returned: always
  type: int
seconds:
  description: Wall time of the whole verification.
  returned: always
  type: float
hash_seconds:
  description: Wall time of the hashing phase.
  returned: always
  type: float
workers:
  description: Files hashed at once (0 in fast mode).
  returned: always
  type: int
throughput_mib_s:
  description: RV(bytes_hashed) in MiB divided by RV(seconds).
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmfleet.vllm.plugins.module_utils.hash_ledger import Ledger
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_manifest import DEFAULT_IGNORE_PATTERNS
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_verify import (
    EXTRA_RELDIR, VerifyError, extras_to_set_aside, move_aside, verify_model_dir)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            mode=dict(type="str", choices=["fast", "full"], default="fast"),
            manifest=dict(type="path"),
            required_files=dict(type="list", elements="str"),
            workers=dict(type="int"),
            fail_on_extra=dict(type="bool", default=False),
            ignore_patterns=dict(type="list", elements="str", default=list(DEFAULT_IGNORE_PATTERNS)),
            use_download_hashes=dict(type="bool", default=False),
            set_aside_extra=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["workers"] is not None and params["workers"] < 1:
        module.fail_json(msg="workers must be at least 1")
    try:
        result = verify_model_dir(
            params["path"], mode=params["mode"], manifest_path=params["manifest"],
            required_files=params["required_files"], workers=params["workers"],
            fail_on_extra=params["fail_on_extra"], ignore_patterns=tuple(params["ignore_patterns"]),
            ledger=Ledger(params["path"]) if params["use_download_hashes"] else None)
    except VerifyError as exc:
        module.fail_json(msg=str(exc), changed=False)
    failed = result.pop("failed")
    if failed:
        module.fail_json(changed=False, set_aside=[], **result)
    # Only against a manifest: without one, an extra file is only a safetensors shard no index names.
    extra = extras_to_set_aside(result["extra"]) if params["set_aside_extra"] and result["manifest"] else []
    if extra and not module.check_mode:
        try:
            move_aside(params["path"], extra, EXTRA_RELDIR)
        except OSError as exc:
            result["msg"] = "%s; moving the file(s) the manifest does not list to %s/ failed: %s" % (result["msg"], EXTRA_RELDIR, exc)
            module.fail_json(changed=False, set_aside=[], **result)
    if extra:
        result["msg"] += "; %s %d file(s) the manifest does not list to %s/: %s" % (
            "would move" if module.check_mode else "moved", len(extra), EXTRA_RELDIR, ", ".join(extra))
    module.exit_json(changed=bool(extra), set_aside=extra, **result)


if __name__ == "__main__":
    main()
