#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_patch
short_description: Apply a catalog entry's model-file patches to a downloaded model, keeping the originals
version_added: "0.1.0"
description:
  - Applies the O(patches) items with C(applies_to=model) and C(delete_keys) (dotted JSON keys) to the files they
    target in O(path), for example removing C(quantization_config.kv_cache_quant_algo) from C(config.json).
  - Nothing is lost. Before a file is first changed, its hub original is copied to
    C(.cache/llmfleet/originals/<file>); the record C(.cache/llmfleet/patches.json) keeps, per file, the patches,
    the deleted keys, and the sha256 and size of the original and of the patched file.
  - Patches are always computed from the original, so a re-run changes nothing, and a patch removed from the
    catalog puts the original back. A target file that does not exist, or that already lacks the keys, is left as
    it is and reported with C(changed=false).
  - M(llmfleet.vllm.shard_verify) and M(llmfleet.vllm.hf_snapshot) read the record. The original is checked against
    the hub's manifest and the live file against the record, so a patched file is neither reported corrupt nor
    downloaded again.
  - Patches with C(applies_to=vllm) are not handled here; the vllm_install role applies engine patches
    (C(vllm_install_patches)).
author:
  - llmfleet maintainers (@llmfleet)
options:
  path:
    description: Model directory.
    type: path
    required: true
  patches:
    description: The catalog entry's C(patches) list; items that do not apply to model files are ignored.
    type: list
    elements: dict
    required: true
attributes:
  check_mode:
    description: Reports which files would change, writes nothing.
  diff_mode:
    description: Shows the deleted keys of each file that changes.
extends_documentation_fragment:
  - llmfleet.vllm.attributes.diff
"""

EXAMPLES = r"""
- name: Drop the FP8 KV cache setting that fails on SM120
  llmfleet.vllm.model_patch:
    path: /srv/models/kimi-k25-nvfp4
    patches:
      - name: drop-fp8-kv-cache
        applies_to: model
        target: config.json
        delete_keys: [quantization_config.kv_cache_quant_algo]
        description: FP8 KV cache breaks on SM120
"""

RETURN = r"""
files:
  description: One item per targeted file.
  returned: always
  type: list
  elements: dict
  sample: [{path: config.json, patches: [drop-fp8-kv-cache], deleted_keys: [quantization_config.kv_cache_quant_algo],
            changed: true, present: true}]
record:
  description: Path of the patch record in the model directory.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmfleet.vllm.plugins.module_utils.model_patches import RECORD_RELPATH, PatchError, apply


def main():
    module = AnsibleModule(
        argument_spec=dict(path=dict(type="path", required=True), patches=dict(type="list", elements="dict", required=True)),
        supports_check_mode=True,
    )
    path = module.params["path"]
    if not os.path.isdir(path):
        module.fail_json(msg="model directory %s does not exist" % path)
    for i, patch in enumerate(module.params["patches"]):
        if patch.get("applies_to") == "model" and not isinstance(patch.get("target"), str):
            module.fail_json(msg="patches[%d] (%s) has no target file" % (i, patch.get("name", "?")))
    try:
        result = apply(path, module.params["patches"], check_mode=module.check_mode)
    except (PatchError, OSError) as exc:
        module.fail_json(msg="patching %s failed: %s" % (path, exc))
    changed_files = [f for f in result["files"] if f["changed"]]
    diff = [{"before_header": f["path"], "after_header": f["path"] + " (patched)",
             "before": "".join("%s\n" % k for k in f["deleted_keys"]), "after": ""} for f in changed_files]
    module.exit_json(changed=result["changed"], files=result["files"], record=os.path.join(path, RECORD_RELPATH),
                     diff=diff)


if __name__ == "__main__":
    main()
