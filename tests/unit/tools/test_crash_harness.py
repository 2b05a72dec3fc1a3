# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The crash harness's kill (tools/crash/callback_plugins/crash_after_task.py) on a real ansible-playbook run on this
host (connection local): boundaries count from the pivot's intent (host_slots action=intend), a skipped task counts,
the kill takes the whole controller at the boundary asked for, and a run without it logs every task of the phase."""
from __future__ import annotations

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))), "tools", "crash"))
import harness  # noqa: E402  pylint: disable=wrong-import-position

PLAY = """
- hosts: all
  gather_facts: false
  tasks:
    - name: Before the phase (not counted)
      ansible.builtin.debug: {msg: before}
    - name: The intent
      llmfleet.vllm.host_slots:
        action: intend
        state_dir: %(state)s
        model: tiny-llama-b
        model_dir: /srv/models/tiny-llama-b
        port: 8502
        strategy: stop_start
    - name: Second task
      ansible.builtin.file: {path: %(marks)s/2, state: touch, mode: "0644"}
    - name: Third task, skipped
      ansible.builtin.file: {path: %(marks)s/3, state: touch, mode: "0644"}
      when: false
    - name: Fourth task
      ansible.builtin.file: {path: %(marks)s/4, state: touch, mode: "0644"}
"""


def _play(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    localhost:\n      ansible_connection: local\n"
                                        "      ansible_python_interpreter: %s\n" % sys.executable)
    (tmp_path / "play.yml").write_text(PLAY % {"state": tmp_path / "state", "marks": marks})
    return marks


def _run(tmp_path, **kw):
    log = tmp_path / ("log-%s.tsv" % kw.get("crash_after", kw.get("crash_before_task_named", "none")))
    # harness.run_pivot runs playbooks/pivot.yml; the same environment on a small play of our own.
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(harness.REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACK_PLUGINS=harness.CALLBACKS, ANSIBLE_CALLBACKS_ENABLED="crash_after_task",
               LLMFLEET_CRASH_LOG=str(log))
    if "crash_after" in kw:
        env["LLMFLEET_CRASH_AFTER"] = str(kw["crash_after"])
    if "crash_before_task_named" in kw:
        env["LLMFLEET_CRASH_BEFORE_TASK_NAMED"] = kw["crash_before_task_named"]
    proc = subprocess.run([os.path.join(harness.REPO, ".venv", "bin", "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
                           str(tmp_path / "play.yml")], capture_output=True, text=True, env=env, cwd=harness.REPO, start_new_session=True,
                          check=False, timeout=300)
    return proc, log


def test_a_run_logs_the_phase_from_the_intent_skipped_tasks_included(tmp_path):
    marks = _play(tmp_path)
    proc, log = _run(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert [(i, name) for i, _action, name in harness.phase_tasks(log)] == [
        (1, "The intent"), (2, "Second task"), (3, "Third task, skipped"), (4, "Fourth task")]
    assert sorted(os.listdir(marks)) == ["2", "4"]
    # The boundaries after which the host changed: the skipped task's is the same host as the second task's.
    assert harness.changed_tasks(log) == [1, 2, 4]


def test_the_kill_comes_at_the_boundary_and_takes_the_controller(tmp_path):
    marks = _play(tmp_path)
    proc, log = _run(tmp_path, crash_after=2)
    assert proc.returncode == -9 and "PLAY RECAP" not in proc.stdout
    assert os.listdir(marks) == ["2"]  # after two tasks of the phase: the intent and the second
    assert log.read_text().splitlines()[-1].startswith("KILL\t2\t")
    state = json.loads((tmp_path / "state" / "slots.json").read_text())
    assert state["slots"]["default"]["pivot"]["phase"] == "switching"


def test_a_named_boundary_is_before_that_task(tmp_path):
    marks = _play(tmp_path)
    proc, _log = _run(tmp_path, crash_before_task_named="Fourth")
    assert proc.returncode == -9 and os.listdir(marks) == ["2"]
