#!/usr/bin/python
# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nccl_shm_cleanup
short_description: Remove stale NCCL, PyTorch and vLLM shared-memory segments before a launch
version_added: "0.1.0"
description:
  - Removes leftover shared-memory files of NCCL (C(nccl-*)), Python multiprocessing
    (C(psm_*) segments and C(sem.mp-*) semaphores) and PyTorch (C(torch_*)) from O(path),
    typically V(/dev/shm), that a crashed or killed vLLM / PyTorch process left behind.
  - Never removes a segment that a live process has open (a C(/proc/PID/fd) link to it) or
    mapped (a C(/proc/PID/maps) line naming it, matched by device and inode), including
    segments that are only mapped after their file descriptor was closed.
  - Independently of /proc, each candidate is probed with a kernel write lease
    (C(fcntl F_SETLEASE F_WRLCK)), which is refused while any other process has the file open or
    mapped, also processes in other PID namespaces (containers sharing the host's C(/dev/shm)).
    A refused lease keeps the file (reason C(in_use), C(detected_by=lease)).
  - Processes that exit during the scan are skipped. When a process cannot be inspected
    (permission denied, for example when not running as root or without CAP_SYS_PTRACE) and the
    lease probe cannot decide either, files owned by that process's user are kept with reason
    C(holder_unverifiable).
  - /proc is scanned twice, once to plan and once right before unlinking, to narrow the
    window in which a process starting meanwhile could lose a segment it has just opened.
author:
  - llmfleet maintainers (@llmfleet)
options:
  path:
    description:
      - Directory holding the shared-memory files. Only its direct entries are considered.
    type: path
    default: /dev/shm
  patterns:
    description:
      - Extra shell-style glob patterns (matched case-sensitively against the file name).
    type: list
    elements: str
    default: []
  use_default_patterns:
    description:
      - Also match the default patterns C(nccl-*), C(psm_*), C(sem.mp-*) and C(torch_*).
    type: bool
    default: true
  min_age:
    description:
      - Keep matching files whose modification time is less than this many seconds ago
        (reason C(too_young)). V(0) disables the age check.
    type: int
    default: 0
  lease_probe:
    description:
      - Also probe each candidate with a kernel write lease (see description). Needs root
        (CAP_LEASE) for files of other users.
    type: bool
    default: true
  report_not_matching:
    description:
      - List entries of O(path) that match no pattern in RV(kept) with reason C(not_matching).
    type: bool
    default: true
attributes:
  check_mode:
    description: Lists what would be removed, removes nothing.
  diff_mode:
    description: Shows the directory listing before and after.
extends_documentation_fragment:
  - llmfleet.vllm.attributes.diff
notes:
  - Run as root to inspect every process; as another user, segments of users whose
    processes cannot be inspected are kept.
  - Only the current mount and PID namespace is visible; a container with its own
    C(/dev/shm) must be cleaned from inside it.
seealso:
  - module: llmfleet.vllm.gpu_facts
"""

EXAMPLES = r"""
- name: Clear stale NCCL / torch shared memory before starting vLLM
  llmfleet.vllm.nccl_shm_cleanup:
  become: true

- name: Only remove leftovers older than 10 minutes, plus vLLM's own message-queue segments
  llmfleet.vllm.nccl_shm_cleanup:
    min_age: 600
    patterns:
      - "vllm_*"
  register: shm

- name: Show what would go, without removing anything
  llmfleet.vllm.nccl_shm_cleanup:
  check_mode: true
  diff: true
"""

RETURN = r"""
removed:
  description: Files removed (in check mode, files that would be removed).
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Full path of the file.
      type: str
    name:
      description: File name.
      type: str
    size:
      description: Apparent size in bytes.
      type: int
    allocated:
      description: Bytes of memory the file held (st_blocks * 512).
      type: int
    age:
      description: Seconds since the file was last modified.
      type: float
    pattern:
      description: The pattern it matched.
      type: str
  sample:
    - {path: /dev/shm/nccl-abc123, name: nccl-abc123, size: 9637888, allocated: 4096, age: 812.4, pattern: "nccl-*"}
kept:
  description: Entries left in place and why.
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: Full path.
      type: str
    reason:
      description: >-
        C(in_use) (see C(holders)), C(too_young), C(not_matching), C(not_a_file),
        C(holder_unverifiable) (a process of the owner could not be inspected) or C(error)
        (see C(error)).
      type: str
    holders:
      description: For C(in_use), the processes holding it, each with C(pid), C(comm) and C(via) (C(fd) or C(maps)).
      type: list
      elements: dict
    detected_by:
      description: For C(in_use), C(proc) (a /proc fd or maps entry) or C(lease) (the kernel refused a write lease).
      type: str
  sample:
    - {path: /dev/shm/psm_live, name: psm_live, reason: in_use, holders: [{pid: 4242, comm: python3, via: fd}]}
bytes_freed:
  description: Sum of the apparent sizes of the removed files (would be freed, in check mode).
  returned: always
  type: int
  sample: 9637888
allocated_bytes_freed:
  description: Sum of the memory actually held by the removed files.
  returned: always
  type: int
  sample: 4096
directory:
  description: The directory that was cleaned (symlinks resolved).
  returned: always
  type: str
  sample: /dev/shm
patterns:
  description: The patterns that were applied.
  returned: always
  type: list
  elements: str
  sample: ["nccl-*", "psm_*", "sem.mp-*", "torch_*"]
processes_scanned:
  description: Number of processes inspected.
  returned: always
  type: int
unreadable_pids:
  description: Processes whose fd table or memory maps could not be read.
  returned: always
  type: list
  elements: int
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.llmfleet.vllm.plugins.module_utils.shm_segments import (
    DEFAULT_PATTERNS,
    clean,
    lease_probe,
)


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/dev/shm"),
            patterns=dict(type="list", elements="str", default=[]),
            use_default_patterns=dict(type="bool", default=True),
            min_age=dict(type="int", default=0),
            lease_probe=dict(type="bool", default=True),
            report_not_matching=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    directory = os.path.realpath(params["path"])
    if not os.path.isdir(directory):
        module.fail_json(msg="path %s is not a directory" % params["path"])
    if params["min_age"] < 0:
        module.fail_json(msg="min_age must be >= 0")

    patterns = list(DEFAULT_PATTERNS) if params["use_default_patterns"] else []
    for pattern in params["patterns"]:
        if pattern not in patterns:
            patterns.append(pattern)
    if not patterns:
        module.fail_json(msg="no patterns: set patterns or use_default_patterns")

    try:
        probe = lease_probe if params["lease_probe"] else None
        removed, keep, before, scan = clean(directory, patterns, min_age=params["min_age"], probe=probe,
                                            check_mode=module.check_mode)
    except OSError as exc:
        module.fail_json(msg="cannot scan %s: %s" % (directory, exc))

    if not params["report_not_matching"]:
        keep = [k for k in keep if k["reason"] != "not_matching"]
    keep.sort(key=lambda k: k["path"])

    removed_names = set(e["name"] for e in removed)
    result = dict(
        changed=bool(removed),
        directory=directory,
        patterns=patterns,
        removed=removed,
        kept=keep,
        bytes_freed=sum(e["size"] for e in removed),
        allocated_bytes_freed=sum(e.get("allocated", 0) for e in removed),
        processes_scanned=scan.scanned,
        unreadable_pids=sorted(scan.unreadable),
    )
    if module._diff:
        after = [n for n in before if n not in removed_names]
        result["diff"] = dict(
            before_header="%s (before)" % directory,
            after_header="%s (after)" % directory,
            before="".join(n + "\n" for n in before),
            after="".join(n + "\n" for n in after),
        )
    module.exit_json(**result)


def main():
    run_module()


if __name__ == "__main__":
    main()
