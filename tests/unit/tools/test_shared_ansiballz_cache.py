"""tools/ci/callback_plugins/shared_ansiballz_cache.py: the test bed's runs share one AnsiballZ cache, whose key
changes with any module or module_utils file of the collection under test, so that no run gets an older payload."""
from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(REPO, "tools", "ci", "callback_plugins"))
import shared_ansiballz_cache as cache  # noqa: E402  pylint: disable=wrong-import-position


def _collection(tmp_path, module_utils_text):
    root = tmp_path / "collections" / "ansible_collections" / "acme" / "tools"
    (root / "plugins" / "module_utils").mkdir(parents=True, exist_ok=True)
    (root / "plugins" / "modules").mkdir(exist_ok=True)
    (root / "plugins" / "modules" / "thing.py").write_text("from ..module_utils import helper\n")
    (root / "plugins" / "module_utils" / "helper.py").write_text(module_utils_text)
    return tmp_path / "collections"


def test_the_key_follows_the_bytes_of_the_collections_plugins(tmp_path, monkeypatch):
    paths = [str(_collection(tmp_path, "X = 1\n"))]
    monkeypatch.setattr(cache.C, "COLLECTIONS_PATHS", paths)
    first = cache.content_key()
    assert cache.content_key() == first
    _collection(tmp_path, "X = 2\n")
    assert cache.content_key() != first
    _collection(tmp_path, "X = 1\n")
    assert cache.content_key() == first


def test_a_run_writes_its_payloads_into_the_shared_cache(tmp_path):
    shared = tmp_path / "shared"
    playbook = tmp_path / "play.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                        "    - ansible.builtin.command: 'true'\n      changed_when: false\n")
    env = dict(os.environ, ANSIBLE_CALLBACK_PLUGINS=os.path.dirname(cache.__file__), LLMFLEET_ANSIBALLZ_CACHE=str(shared),
               ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_LOCALHOST_WARNING="0")
    for _run in range(2):
        result = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", "localhost,", "-c", "local",
                                 str(playbook), "-e", "ansible_python_interpreter=" + sys.executable],
                                env=env, capture_output=True, text=True, check=False, cwd=REPO)
        assert result.returncode == 0, result.stdout + result.stderr
    (key,) = os.listdir(shared)
    assert "ansible.modules.command-ZIP_DEFLATED-none" in os.listdir(shared / key)
