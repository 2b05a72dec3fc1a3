"""Test-bed machines booted side by side: each `tools/testbed/testbed.sh up` works in a directory and cgroup of its own
and mostly waits for systemd and sshd inside, so a fleet boots in about the time of its slowest machine."""
from __future__ import annotations

import os
import subprocess

TESTBED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "testbed", "testbed.sh")


def up_machines(machines: list[tuple[str, ...]]) -> None:
    """Boot every (name, ssh_port[, image]) at once; raise naming each machine that did not come up, with its output."""
    started = [(machine[0], subprocess.Popen([TESTBED, "up", *machine], stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True)) for machine in machines]
    failed = []
    for name, process in started:
        output = process.communicate()[0]
        if process.returncode != 0:
            failed.append(f"{name} (rc {process.returncode}):\n{output[-2000:]}")
    if failed:
        raise RuntimeError("test-bed machines did not come up:\n" + "\n".join(failed))
