# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Test bed only: one line per ansible-playbook run of `make test` in LLMFLEET_PLAYBOOK_TALLY (tab-separated), so that
what a test costs in Ansible is seen, not guessed (issue 41): the pytest test (or molecule scenario) that ran it, the
playbook, how many task results were ok, changed, skipped and failed, its wall seconds and the controller's CPU
seconds (the run and the forks it waited for). tools/ci/playbook_tally.py sums the file per test module.
Enabled by tools/run-tests.sh through ANSIBLE_CALLBACK_PLUGINS, never by anything in roles/ or playbooks/."""
from __future__ import annotations

DOCUMENTATION = r"""
name: playbook_tally
type: aggregate
short_description: one tab-separated line per playbook run, its tasks and CPU seconds (test bed only)
description:
  - Appends the calling test (PYTEST_CURRENT_TEST or MOLECULE_SCENARIO_NAME), the playbook, the counts of ok, changed,
    skipped and failed task results, the wall and the controller CPU seconds to the file LLMFLEET_PLAYBOOK_TALLY.
  - Does nothing when LLMFLEET_PLAYBOOK_TALLY is unset.
"""

import fcntl
import os
import resource
import time

from ansible.plugins.callback import CallbackBase


def _cpu_seconds():
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "playbook_tally"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._began, self._playbook = time.monotonic(), "?"
        self._counts = {"ok": 0, "changed": 0, "skipped": 0, "failed": 0}

    def v2_playbook_on_start(self, playbook):
        self._playbook = os.path.basename(getattr(playbook, "_file_name", "") or "?")

    def v2_runner_on_ok(self, result):
        self._counts["ok"] += 1
        self._counts["changed"] += bool(result._result.get("changed"))

    def v2_runner_on_skipped(self, result):
        self._counts["skipped"] += 1

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._counts["failed"] += 1

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("LLMFLEET_PLAYBOOK_TALLY")
        if not path:
            return
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
        if not test and os.environ.get("MOLECULE_SCENARIO_NAME"):
            test = "molecule/" + os.environ["MOLECULE_SCENARIO_NAME"]
        line = "\t".join([test or "-", self._playbook] + [str(self._counts[k]) for k in ("ok", "changed", "skipped", "failed")]
                         + ["%.1f" % (time.monotonic() - self._began), "%.1f" % _cpu_seconds()]) + "\n"
        with open(path, "a", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.write(line)
