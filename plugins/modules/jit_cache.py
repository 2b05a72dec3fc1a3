#!/usr/bin/python
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: jit_cache
short_description: Record, verify, archive, seed and set aside the JIT caches a vLLM unit keeps (compile cache, Triton kernels)
description:
  - A vLLM unit of M(llmfleet.vllm.service_deploy) keeps what a start compiles in its cache directory
    (C(/var/cache/<service_deploy_cache_dir_name>)), vLLM's compile cache C(vllm/), Triton's kernels C(.triton/) and
    Inductor's directory C(torchinductor/). A later start that finds them skips the compile and Triton's warm-up.
  - These files are code the server loads. O(state=recorded) writes their manifest (the sha256 and size of every file,
    and the key they were built under) beside them, C(llmfleet-jit-manifest.json); O(state=verified) compares the files
    with a manifest, the one beside them or one given (the fleet's, from the revision lock) and, when they differ or the
    manifest given is not of this unit's key, moves the caches and their manifest whole into C(jit-set-aside/<time>/) with the
    reason, so that the next start builds its own. Nothing is deleted.
  - Files the host's own manifest does not list are kernels a later start added; they are not a fault. A copy from
    elsewhere (O(manifest) given) must hold exactly the files of its manifest.
  - The cache directory belongs to the service user. Symbolic links, FIFOs and devices in it are refused, and setting
    aside works on directory handles without following links, in a C(jit-set-aside) directory of the module's own
    user, by renames only. The manifest beside the caches is writable by the service user as well, so it detects
    corruption, not tampering; a copy from another host is checked against the manifest the controller keeps.
  - The key - vLLM's and torch's versions, the device, the model's C(config.json) and the serving flags - is what
    the compiled files depend on. A manifest given (a copy from another host) must be of this key. The host's own
    manifest may be of another start (another profile, an older vLLM); vLLM and Triton key their own files, so the
    files are still verified and kept, and RV(key_matches) says so.
version_added: 0.9.0
author:
  - llmfleet maintainers (@llmfleet)
options:
  cache_dir:
    description: The unit's cache directory (its C(CacheDirectory=)), which holds the JIT directories.
    type: path
    required: true
  state:
    description:
      - C(recorded) writes the manifest of the caches as they are, with their key (RV(key)). A cache directory that does
        not exist (a unit that never started) is nothing to record or verify.
      - C(verified) compares them with O(manifest) (default the one beside them) and sets them aside when they differ.
      - C(archived) writes the files of the manifest beside the caches (this host's own) as a tar to O(dest), each file
        hashed as it is read (the copy a rollout's canary gives the fleet).
      - C(seeded) lays such a copy (O(source)) into the caches when O(manifest) (the fleet's, from the revision lock) is
        of this unit's key and the copy holds exactly its files, each hashed as it is unpacked beside the caches; then
        the manifest is written beside them. A copy that differs is set aside (C(jit-set-aside/<time>-jit-seed-staging/))
        and nothing of it enters the caches; a manifest of another key seeds nothing (RV(key_matches) false). Neither
        fails the task (the next start builds its own caches).
    type: str
    choices: [recorded, verified, archived, seeded]
    required: true
  venv:
    description: The vLLM installation's venv; the key takes its vLLM and torch versions (read from their dist-info).
    type: path
    required: true
  device:
    description: The GPU the unit runs on, its name and compute capability (e.g. C(NVIDIA H100 80GB HBM3 sm_90)), or C(cpu).
    type: str
    required: true
  model_config:
    description: The model's C(config.json); the key takes its sha256 (a new commit with the same config keeps the key).
    type: path
    required: true
  serve_args:
    description:
      - What else the compiled files depend on - the path vLLM serves, the serving flags (as the unit renders them,
        without host, port and served names) and the engine's environment (roles/service_deploy builds the list).
    type: list
    elements: str
    required: true
  manifest:
    description:
      - The manifest to verify against (O(state=verified)), e.g. the fleet's from the revision lock. Default - the
        manifest beside the caches; without one, there is nothing to verify and nothing is set aside.
    type: dict
  dest:
    description:
      - Where O(state=archived) writes the tar (written beside, then renamed); with O(state=recorded), the tar of what
        was just recorded.
    type: path
  source:
    description: The tar O(state=seeded) lays in (one O(state=archived) wrote on another host).
    type: path
  remove_source:
    description: Remove O(source) once it was read (O(state=seeded)), seeded or not.
    type: bool
    default: false
attributes:
  check_mode:
    description: Reports what it would write or set aside, and changes nothing.
    support: full
  diff_mode:
    support: none
extends_documentation_fragment:
  - llmfleet.vllm.attributes
notes:
  - Module code is stdlib-only (hashes in parallel threads, as M(llmfleet.vllm.shard_verify) does).
  - Run it as the user who owns O(cache_dir) (roles/service_deploy's entry point C(jit_cache) uses C(become_user)); as root
    in a directory another user owns it refuses.
"""

EXAMPLES = r"""
- name: Look up the model's catalog entry
  ansible.builtin.set_fact:
    entry: "{{ 'kimi-k25-int4' | llmfleet.vllm.catalog_entry }}"

- name: Record the JIT caches a start built (after the new model passed its gate)
  llmfleet.vllm.jit_cache:
    cache_dir: /var/cache/llmfleet-vllm
    state: recorded
    venv: /opt/vllm
    device: NVIDIA H100 80GB HBM3 sm_90
    model_config: /srv/models/kimi-k25-int4/config.json
    serve_args: "{{ entry.serving | llmfleet.vllm.vllm_serve_args }}"

- name: Verify them before the next start (set aside when they differ)
  llmfleet.vllm.jit_cache:
    cache_dir: /var/cache/llmfleet-vllm
    state: verified
    venv: /opt/vllm
    device: NVIDIA H100 80GB HBM3 sm_90
    model_config: /srv/models/kimi-k25-int4/config.json
    serve_args: "{{ entry.serving | llmfleet.vllm.vllm_serve_args }}"
  register: jit_verified

- name: The canary's caches, as a copy for the fleet
  llmfleet.vllm.jit_cache:
    cache_dir: /var/cache/llmfleet-vllm
    state: archived
    dest: /var/cache/llmfleet-vllm/jit-seed.tar
    venv: /opt/vllm
    device: NVIDIA H100 80GB HBM3 sm_90
    model_config: /srv/models/kimi-k25-int4/config.json
    serve_args: "{{ entry.serving | llmfleet.vllm.vllm_serve_args }}"

- name: Seed another host with that copy, checked against the manifest of the revision lock
  llmfleet.vllm.jit_cache:
    cache_dir: /var/cache/llmfleet-vllm
    state: seeded
    source: /var/cache/llmfleet-vllm/jit-seed.tar
    remove_source: true
    manifest: "{{ revision_lock.jit_cache }}"
    venv: /opt/vllm
    device: NVIDIA H100 80GB HBM3 sm_90
    model_config: /srv/models/kimi-k25-int4/config.json
    serve_args: "{{ entry.serving | llmfleet.vllm.vllm_serve_args }}"
"""

RETURN = r"""
key:
  description:
    - The key the caches are recorded or verified under (vllm_version, torch_version, device, model_config_sha256,
      serve_args_sha256); null when it could not be built.
  returned: always
  type: dict
key_id:
  description: The sha256 of RV(key), null when the key could not be built (RV(key_error)).
  returned: always
  type: str
key_error:
  description: Why the key could not be built (e.g. no C(config.json) yet), else null. O(state=verified) still compares the files.
  returned: always
  type: str
key_matches:
  description: Whether the manifest verified against was built under RV(key); null when there was none.
  returned: always
  type: bool
manifest:
  description: The manifest written (O(state=recorded)) or verified against; null when there was none.
  returned: always
  type: dict
problems:
  description: How the caches differed from the manifest (O(state=verified)); empty when they matched.
  returned: always
  type: list
  elements: str
set_aside:
  description: Where the caches (O(state=verified)) or the copy (O(state=seeded)) were moved when they differed, else null.
  returned: always
  type: str
seeded:
  description: Whether O(state=seeded) laid the copy in.
  returned: always
  type: bool
archive:
  description: The tar O(state=archived) wrote, else null.
  returned: always
  type: str
files:
  description: Files the manifest lists.
  returned: always
  type: int
bytes:
  description: Their bytes.
  returned: always
  type: int
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.llmfleet.vllm.plugins.module_utils import jit_cache
from ansible_collections.llmfleet.vllm.plugins.module_utils.atomic_write import atomic_write


def _read_manifest(path):
    """The manifest beside the caches: None when there is none; a problem (str) when it cannot be read as one."""
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return "%s cannot be read: %s" % (jit_cache.MANIFEST_NAME, exc)
    return manifest if isinstance(manifest, dict) else "%s is not a JSON object" % jit_cache.MANIFEST_NAME


def _write_manifest(path, manifest):
    atomic_write(path, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode(), mode=0o644)


def _key(p):
    """(key, key_id, None), or (None, None, why it cannot be built: a model not downloaded yet, a GGUF file, no device)."""
    try:
        key = jit_cache.make_key(p["venv"], p["device"], p["model_config"], p["serve_args"])
        return key, jit_cache.key_id(key), None
    except (OSError, ValueError) as exc:
        return None, None, "the key of the JIT caches: %s" % exc


def _record(module, p, cache_dir, path, key, result):
    manifest = jit_cache.build(cache_dir, key)
    old = _read_manifest(path)
    old = old if isinstance(old, dict) else {}
    result["changed"] = {k: v for k, v in old.items() if k != "built_at"} != {k: v for k, v in manifest.items() if k != "built_at"}
    if p["dest"]:
        result["changed"] = True
    if not module.check_mode:
        # The copy first: a file that changed since it was hashed stops both, and no manifest lists it.
        if p["dest"]:
            result["archive"] = jit_cache.archive(cache_dir, manifest, p["dest"])
        if result["changed"]:
            _write_manifest(path, manifest)
    return manifest


def _verify(module, p, cache_dir, path, key_id, result):
    """Problems are said and the caches set aside: a cache never fails a start."""
    given = p["manifest"] is not None
    manifest = p["manifest"] if given else _read_manifest(path)
    if manifest is None:
        return None
    try:
        problems = [manifest] if isinstance(manifest, str) else jit_cache.verify(cache_dir, manifest, exact=given)
    except (OSError, ValueError) as exc:  # a link, FIFO or device among the caches, a file that cannot be read
        problems = [str(exc)]
    result["key_matches"] = None if key_id is None else isinstance(manifest, dict) and manifest.get("key_id") == key_id
    # A copy from elsewhere is only this unit's cache when built under its key. The host's own manifest may be another
    # start's (a profile, a vLLM upgrade): vLLM and Triton key their own files, so those are kept beside the new ones.
    if given and not problems and not result["key_matches"]:
        problems = ["the manifest was built under another key (vLLM, torch, device, model config or flags)"]
    result["problems"] = problems
    if problems:
        if module.check_mode:
            result["changed"] = any(os.path.lexists(os.path.join(cache_dir, name))
                                    for name in jit_cache.JIT_DIRS + (jit_cache.MANIFEST_NAME,))
        else:
            try:
                result["set_aside"] = jit_cache.set_aside(cache_dir, "\n".join(problems))
            except (OSError, ValueError) as exc:
                result["problems"] = problems + ["could not be set aside: %s" % exc]
            result["changed"] = result["set_aside"] is not None
    return manifest


def _seed(module, p, cache_dir, path, key_id, result):
    manifest = p["manifest"]
    shape = jit_cache.validate(manifest)
    result["key_matches"] = not shape and key_id is not None and manifest.get("key_id") == key_id
    if shape:
        result["problems"] = shape
    elif not result["key_matches"]:
        result["problems"] = ["the fleet's caches were built under another key (vLLM, torch, device, model config or"
                              " flags): this host builds its own"]
    elif module.check_mode:
        result["changed"] = True
    else:
        result["problems"], result["set_aside"] = jit_cache.seed(cache_dir, manifest, p["source"])
        result["seeded"] = not result["problems"]
        if result["seeded"]:
            _write_manifest(path, manifest)
        result["changed"] = result["seeded"] or result["set_aside"] is not None
    if p["remove_source"] and not module.check_mode and os.path.lexists(p["source"]):
        os.unlink(p["source"])
        result["changed"] = True
    return manifest


def main():
    module = AnsibleModule(argument_spec=dict(
        cache_dir=dict(type="path", required=True),
        state=dict(type="str", required=True, choices=["recorded", "verified", "archived", "seeded"]),
        venv=dict(type="path", required=True),
        device=dict(type="str", required=True),
        model_config=dict(type="path", required=True),
        serve_args=dict(type="list", elements="str", required=True),
        manifest=dict(type="dict"),
        dest=dict(type="path"),
        source=dict(type="path"),
        remove_source=dict(type="bool", default=False),
    ), required_if=[("state", "archived", ["dest"]), ("state", "seeded", ["source", "manifest"])], supports_check_mode=True)
    p = module.params
    cache_dir, path = p["cache_dir"], os.path.join(p["cache_dir"], jit_cache.MANIFEST_NAME)
    key, key_id, key_error = _key(p)
    result = dict(changed=False, key=key, key_id=key_id, key_error=key_error, key_matches=None, manifest=None, problems=[],
                  set_aside=None, seeded=False, archive=None, files=0, bytes=0)
    # Root in a directory the service user owns would follow the user's links: the module runs as that user.
    if os.geteuid() == 0 and os.path.isdir(cache_dir) and os.stat(cache_dir).st_uid != 0:
        module.fail_json(msg="%s belongs to uid %d: run jit_cache as that user (become_user), not as root"
                         % (cache_dir, os.stat(cache_dir).st_uid), **result)
    if p["state"] in ("recorded", "archived") and key_error:
        module.fail_json(msg=key_error, **result)
    manifest = None
    try:
        if p["state"] == "seeded":
            manifest = _seed(module, p, cache_dir, path, key_id, result)
        elif p["state"] == "archived":
            manifest = _read_manifest(path)
            if not isinstance(manifest, dict):
                module.fail_json(msg="%s: no manifest to archive by (%s)" % (cache_dir, manifest or "none beside the caches"),
                                 **result)
            if manifest.get("key_id") != key_id:
                module.fail_json(msg="%s: the manifest beside the caches is of another key than this unit's" % cache_dir,
                                 **result)
            result["changed"] = True
            if not module.check_mode:
                result["archive"] = jit_cache.archive(cache_dir, manifest, p["dest"])
        elif not os.path.isdir(cache_dir):
            pass  # a unit that never started: nothing to verify or record
        elif p["state"] == "recorded":
            manifest = _record(module, p, cache_dir, path, key, result)
        else:
            manifest = _verify(module, p, cache_dir, path, key_id, result)
    except (OSError, ValueError) as exc:
        module.fail_json(msg="%s: %s" % (cache_dir, exc), **result)
    if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict):
        result.update(manifest=manifest, files=len(manifest["files"]), bytes=manifest.get("bytes", 0))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
