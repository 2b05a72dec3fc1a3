"""llmfleet.vllm.shard_verify run by real ansible-playbook (connection: local) on real model directories.

One playbook run verifies every case (a good model and one copy per injected fault) in a
loop, once normally and once with --check; a third run shows a bad model fails the play.
The module runs under the host's system python, which has neither safetensors nor numpy:
this also proves the module is stdlib-only.
"""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from model_builders import (
    add_unknown_shard, build_gguf_model, build_safetensors_model, corrupt_header_json, flip_last_byte,
    header_length_past_eof, index_names_missing_file, shard_name, truncate, write_hub_manifest)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANSIBLE_PLAYBOOK = os.path.join(REPO_ROOT, ".venv", "bin", "ansible-playbook")
# The target's own python, as on a Debian host; discovery here would find pyenv shims.
TARGET_PYTHON = "/usr/bin/python3"
SHARD2 = shard_name(2, 3)
GGUF_PART3 = "tiny-Q8_0-00003-of-00003.gguf"

LOOP_PLAYBOOK = """
- name: Verify model directories
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Verify shards
      llmfleet.vllm.shard_verify:
        path: "{{ item.path }}"
        mode: "{{ item.mode }}"
        fail_on_extra: "{{ item.fail_on_extra }}"
      loop: "{{ cases }}"
      loop_control:
        label: "{{ item.name }}"
      register: verify
      ignore_errors: true

    - name: Save the module results for the test
      ansible.builtin.copy:
        content: "{{ verify.results | to_json }}"
        dest: "{{ result_file }}"
        mode: "0644"
      check_mode: false
      changed_when: false  # so the recap's changed= counts shard_verify alone
"""

PLAIN_PLAYBOOK = """
- name: Verify a model directory
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Verify shards
      llmfleet.vllm.shard_verify:
        path: "{{ model_dir }}"
"""


def _break(model, fault):
    {
        "truncated": lambda: truncate(os.path.join(model, SHARD2)),
        "flipped_byte": lambda: flip_last_byte(os.path.join(model, SHARD2)),
        "missing_shard": lambda: os.unlink(os.path.join(model, SHARD2)),
        "header_json": lambda: corrupt_header_json(os.path.join(model, SHARD2)),
        "header_past_eof": lambda: header_length_past_eof(os.path.join(model, SHARD2)),
        "missing_config": lambda: os.unlink(os.path.join(model, "config.json")),
        "index_names_missing": lambda: (index_names_missing_file(model), write_hub_manifest(model)),
        "extra_shard": lambda: add_unknown_shard(model),
        "good": lambda: None,
    }[fault]()


# name: (fault, mode, fail_on_extra, expected bad path or None, expected status)
CASES = {
    "good_fast": ("good", "fast", False, None, None),
    "good_full": ("good", "full", False, None, None),
    "truncated": ("truncated", "fast", False, SHARD2, "truncated"),
    "flipped_byte_full": ("flipped_byte", "full", False, SHARD2, "hash_mismatch"),
    "flipped_byte_fast": ("flipped_byte", "fast", False, None, None),
    "missing_shard": ("missing_shard", "fast", False, SHARD2, "missing"),
    "header_json": ("header_json", "fast", False, SHARD2, "header_invalid"),
    "header_past_eof": ("header_past_eof", "fast", False, SHARD2, "header_invalid"),
    "missing_config": ("missing_config", "fast", False, "config.json", "missing"),
    "index_names_missing": ("index_names_missing", "fast", False, "model-00009-of-00009.safetensors", "missing"),
    "extra_shard_reported": ("extra_shard", "fast", False, None, None),
    "extra_shard_fails": ("extra_shard", "fast", True, "model-extra.safetensors", "extra"),
    "gguf_good": ("gguf", "full", False, None, None),
    "gguf_part_missing": ("gguf_part_missing", "full", False, GGUF_PART3, "missing"),
}


def _build_case(base, name):
    fault, mode, fail_on_extra, _path, _status = CASES[name]
    model = os.path.join(base, name)
    if fault.startswith("gguf"):
        build_gguf_model(model)
        if fault == "gguf_part_missing":
            os.unlink(os.path.join(model, GGUF_PART3))
    else:
        build_safetensors_model(model)
        _break(model, fault)
    return {"name": name, "path": model, "mode": mode, "fail_on_extra": fail_on_extra}


def ansible_playbook(tmp_path, playbook_text, extra_vars, check=False):
    playbook = tmp_path / "verify.yml"
    playbook.write_text(playbook_text)
    command = [ANSIBLE_PLAYBOOK, "-i", "localhost,", str(playbook),
               "-e", json.dumps(dict(extra_vars, ansible_python_interpreter=TARGET_PYTHON))]
    if check:
        command.append("--check")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO_ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    process = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    return process.returncode, process.stdout + process.stderr


@pytest.fixture(name="runs", scope="module")
def fixture_runs(tmp_path_factory):
    """{check: (rc, output, {case name: module result})} of one looped playbook run per check flag."""
    base = tmp_path_factory.mktemp("models")
    cases = [_build_case(str(base), name) for name in CASES]
    runs = {}
    for check in (False, True):
        work = tmp_path_factory.mktemp("run")
        result_file = work / "results.json"
        rc, output = ansible_playbook(work, LOOP_PLAYBOOK, {"cases": cases, "result_file": str(result_file)}, check)
        results = {item["item"]["name"]: item for item in json.loads(result_file.read_text())}
        runs[check] = (rc, output, results)
    return runs


def test_module_runs_on_a_python_without_safetensors():
    probe = subprocess.run([TARGET_PYTHON, "-c", "import safetensors"], capture_output=True, check=False)
    assert probe.returncode != 0


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_never_changed(runs, check):
    rc, output, results = runs[check]
    assert rc == 0, output  # every failure was ignored in the loop
    assert "changed=0" in output
    assert all(result["changed"] is False for result in results.values())


@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_case(runs, case, check):
    _rc, output, results = runs[check]
    result = results[case]
    _fault, mode, _fail_on_extra, path, status = CASES[case]
    assert result["mode"] == mode
    if path is None:
        assert not result.get("failed"), result["msg"]
        assert result["bad"] == []
        assert result["bytes_hashed"] == (result["total_bytes"] if mode == "full" else 0)
        return
    assert result["failed"] is True
    assert "%s: %s" % (path, status) in result["msg"]
    assert path in output  # the printed failure names the file
    if status == "extra":
        assert result["extra"] == [path]
    else:
        assert path in result["bad"]


def test_extra_shard_reported_without_failing(runs):
    assert runs[False][2]["extra_shard_reported"]["extra"] == ["model-extra.safetensors"]


def test_bad_model_fails_the_play(tmp_path):
    model = build_safetensors_model(str(tmp_path / "model"))
    truncate(os.path.join(model, SHARD2))
    rc, output = ansible_playbook(tmp_path, PLAIN_PLAYBOOK, {"model_dir": model})
    assert rc == 2 and "failed=1" in output
    assert SHARD2 in output and "1 short" in output
