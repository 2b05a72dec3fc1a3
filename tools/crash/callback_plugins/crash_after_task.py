# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kill the controller (SIGKILL, the whole ansible-playbook process group) at a task boundary of the switch phase:
a TEST FIXTURE of the crash harness (tools/crash/harness.py), never used by the collection.

The switch phase begins with the first task that changes the host: the pivot's intent (llmfleet.vllm.host_slots
with action intend). Boundary N is "after N tasks of the phase": the kill comes as task N+1 starts. Tasks are
counted as the strategy starts them (a task that a condition skips counts too), so a boundary is a task counter,
not a name. LLMFLEET_CRASH_AFTER=N arms it; LLMFLEET_CRASH_LOG=FILE gets one line per task of the phase
(index, action, name) and one per result (index, status: changed, ok, skipped or failed), which a run without
LLMFLEET_CRASH_AFTER uses to count the boundaries and to tell those after which the host changed.
LLMFLEET_CRASH_BEFORE_TASK_NAMED=TEXT arms it at the boundary before the first task of the phase whose name holds
TEXT (the few chosen boundaries of make test, which stay put when tasks are added elsewhere).
"""
from __future__ import annotations

import os
import signal

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = r"""
name: crash_after_task
type: aggregate
short_description: kill the controller after the Nth task of the pivot's switch phase (crash harness fixture)
description:
  - Test fixture of tools/crash/harness.py. Enabled with ANSIBLE_CALLBACKS_ENABLED; armed with LLMFLEET_CRASH_AFTER.
requirements:
  - ansible-playbook run in a process group of its own (the harness starts it in a new session)
"""

PHASE_START_ACTIONS = ('llmfleet.vllm.host_slots', 'host_slots')


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = 'aggregate'
    CALLBACK_NAME = 'crash_after_task'
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        after = os.environ.get('LLMFLEET_CRASH_AFTER', '')
        self._after = int(after) if after.strip() else None
        self._log = os.environ.get('LLMFLEET_CRASH_LOG')
        self._before_named = os.environ.get('LLMFLEET_CRASH_BEFORE_TASK_NAMED') or None
        self._done = None  # tasks of the switch phase started so far; None before the phase

    def _note(self, line):
        if self._log:
            with open(self._log, 'a') as handle:
                handle.write(line + '\n')
                handle.flush()
                os.fsync(handle.fileno())

    def v2_playbook_on_task_start(self, task, is_conditional):
        if self._done is None:
            if task.action not in PHASE_START_ACTIONS or task.args.get('action') != 'intend':
                return
            self._done = 0
        if self._after is None and self._before_named and self._before_named in task.get_name():
            self._after = self._done
        if self._after is not None and self._done == self._after:
            self._note('KILL\t%d\t%s\t%s' % (self._done, task.action, task.get_name()))
            if os.getpgid(0) == os.getpid():
                os.killpg(os.getpid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        self._done += 1
        self._note('TASK\t%d\t%s\t%s' % (self._done, task.action, task.get_name()))

    def _result(self, status):
        if self._done is not None:
            self._note('RESULT\t%d\t%s' % (self._done, status))

    def v2_runner_on_ok(self, result):
        self._result('changed' if result.is_changed() else 'ok')

    def v2_runner_on_skipped(self, result):
        self._result('skipped')

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._result('failed')

    def v2_runner_item_on_ok(self, result):
        if result.is_changed():
            self._result('changed')
