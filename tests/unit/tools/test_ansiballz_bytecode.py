"""tools/ci/callback_plugins/ansiballz_bytecode.py: the test bed's AnsiballZ payloads carry checked hash-based
bytecode beside their sources, which zipimport runs only while it matches the source beside it."""
from __future__ import annotations

import base64
import importlib.util
import io
import os
import subprocess
import sys
import zipfile
import zipimport

from ansible.executor import module_common

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(REPO, "tools", "ci", "callback_plugins"))
import ansiballz_bytecode as bytecode  # noqa: E402  pylint: disable=wrong-import-position


def _archive(path, files):
    with bytecode.BytecodeZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, text in files.items():
            archive.writestr(name, text)


def _load(archive_path, name):
    spec = zipimport.zipimporter(str(archive_path)).find_spec(name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_zipimport_runs_the_bytecode_only_while_it_matches_its_source(tmp_path):
    path = tmp_path / "payload.zip"
    _archive(path, {"answer.py": "def value():\n    return 42\n", "data.txt": "not python\n"})
    with zipfile.ZipFile(path) as archive:
        assert sorted(archive.namelist()) == ["answer.py", "answer.pyc", "data.txt"]
        pyc = archive.read("answer.pyc")
    # Code compiled from the zip's source names the archive; the callback's bytecode names the file alone.
    module = _load(path, "answer")
    assert module.value() == 42 and module.value.__code__.co_filename == "answer.py"
    # The same bytecode beside another source: its checked hash no longer matches, so the source is what runs.
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("answer.py", "def value():\n    return 7\n")
        archive.writestr("answer.pyc", pyc)
    module = _load(other, "answer")
    assert module.value() == 7 and module.value.__code__.co_filename == os.path.join(str(other), "answer.py")


def test_a_source_that_does_not_compile_is_left_to_zipimport(tmp_path):
    path = tmp_path / "payload.zip"
    _archive(path, {"broken.py": "def (:\n"})
    with zipfile.ZipFile(path) as archive:
        assert archive.namelist() == ["broken.py"]


def test_a_run_with_the_callback_sends_bytecode_and_its_modules_still_answer(tmp_path):
    shared = tmp_path / "shared"
    playbook = tmp_path / "play.yml"
    playbook.write_text("- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                        "    - ansible.builtin.command: echo payload-ran\n      register: out\n      changed_when: false\n"
                        "    - ansible.builtin.assert:\n        that: out.stdout == 'payload-ran'\n")
    env = dict(os.environ, ANSIBLE_CALLBACK_PLUGINS=os.path.dirname(bytecode.__file__), LLMFLEET_ANSIBALLZ_CACHE=str(shared),
               LLMFLEET_ANSIBALLZ_BYTECODE="1", ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_LOCALHOST_WARNING="0")
    result = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", "localhost,", "-c", "local",
                             str(playbook), "-e", "ansible_python_interpreter=" + sys.executable],
                            env=env, capture_output=True, text=True, check=False, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    (key,) = os.listdir(shared)
    cached = module_common._CachedModule.load(str(shared / key / "ansible.modules.command-ZIP_DEFLATED-none"))  # pylint: disable=protected-access
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(cached.zip_data))) as archive:
        names = set(archive.namelist())
        sources = {n for n in names if n.endswith(".py")}
        assert "ansible/module_utils/basic.py" in sources and {n + "c" for n in sources} <= names
        # Each one this Python's, checked against its source's hash (PEP 552: magic, flags, source hash, code).
        for name in ("ansible/module_utils/basic.py", "ansible/modules/command.py"):
            pyc, source = archive.read(name + "c"), archive.read(name)
            assert pyc[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(pyc[4:8], "little") == 0b11, name
            assert pyc[8:16] == importlib.util.source_hash(source), name
