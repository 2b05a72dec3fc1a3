# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test bed only: one AnsiballZ cache for every ansible-playbook run of a test session, keyed by content.

ansible-core builds each module's payload (the module and the module_utils it imports, found by parsing them) once
per run, in the run's own temporary directory: about 3 s of a pivot's 12 s of controller CPU, in every one of the
test suite's ~200 runs. This callback points the run's cache at a directory keyed by everything the payloads are
made of: ansible-core's and Python's versions and the bytes of every file under each collection's plugins/ that the
runs use. A changed module or module_utils file is a new key, so no run ever gets an older payload. ansible-core
locks each entry while it writes it (its forks already share the cache), so runs side by side share it safely.
Enabled by tools/run-tests.sh (`make test`, CI) through ANSIBLE_CALLBACK_PLUGINS, never by anything in roles/ or
playbooks/."""
from __future__ import annotations

DOCUMENTATION = r"""
name: shared_ansiballz_cache
type: aggregate
short_description: share the AnsiballZ cache between the test suite's runs, keyed by content (test bed only)
description:
  - Links the run's C(ansiballz_cache) to LLMFLEET_ANSIBALLZ_CACHE/KEY, KEY a sha256 of ansible-core's and Python's
    versions and of every file under the plugins/ directories of the collections in the collections path.
  - Does nothing when LLMFLEET_ANSIBALLZ_CACHE is unset.
"""

import hashlib
import os
import sys

from ansible import constants as C
from ansible.module_utils.ansible_release import __version__ as ansible_version
from ansible.plugins.callback import CallbackBase


def _collection_roots(paths):
    """Each collection's directory under the given collection paths."""
    roots = []
    for path in paths:
        base = path if os.path.basename(path) == "ansible_collections" else os.path.join(path, "ansible_collections")
        if not os.path.isdir(base):
            continue
        for namespace in sorted(os.listdir(base)):
            ns_dir = os.path.join(base, namespace)
            if os.path.isdir(ns_dir) and not namespace.startswith("__"):
                roots += [os.path.join(ns_dir, name) for name in sorted(os.listdir(ns_dir))
                          if os.path.isdir(os.path.join(ns_dir, name))]
    return roots


def _hash_tree(digest, root, plugins):
    for directory, dirs, files in os.walk(plugins, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".pyc"):
                continue
            path = os.path.join(directory, name)
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).digest())


def content_key():
    """sha256 of ansible-core's and Python's versions, every plugins/ file of the collections on the configured
    collections paths (the one under test), and the MANIFEST.json (its files' checksums) of each installed one."""
    # Payloads with bytecode are kept apart from those without, and from those an older ansiballz_bytecode.py wrote.
    bytecode = os.environ.get("LLMFLEET_ANSIBALLZ_BYTECODE") == "1"
    digest = hashlib.sha256(("%s\0%s\0bytecode=%s\0" % (ansible_version, sys.version, bytecode)).encode())
    if bytecode:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ansiballz_bytecode.py"), "rb") as handle:
            digest.update(hashlib.sha256(handle.read()).digest())
    configured = _collection_roots(C.COLLECTIONS_PATHS or [])
    installed = _collection_roots([p for p in sys.path if os.path.isdir(os.path.join(p, "ansible_collections"))])
    for root in configured + installed:
        digest.update(root.encode() + b"\0")
        manifest = os.path.join(root, "MANIFEST.json")
        if root in installed and os.path.isfile(manifest):
            with open(manifest, "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).digest())
        else:
            _hash_tree(digest, root, os.path.join(root, "plugins"))
    return digest.hexdigest()[:20]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "shared_ansiballz_cache"
    CALLBACK_NEEDS_ENABLED = False

    def v2_playbook_on_start(self, playbook):
        shared = os.environ.get("LLMFLEET_ANSIBALLZ_CACHE")
        if not shared:
            return
        target = os.path.join(shared, content_key())
        os.makedirs(target, exist_ok=True)
        link = os.path.join(C.DEFAULT_LOCAL_TMP, "ansiballz_cache")
        if not os.path.lexists(link):
            os.symlink(target, link)
