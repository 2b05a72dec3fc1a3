# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where `make test`'s CPU went, from BSD process accounting (Debian's `acct`; every process that ended is counted).

    apt-get install -y acct && accton /var/log/pacct     # before the run (root)
    CI=true bash .ci/run; accton off
    python3 tools/ci/process_cpu.py [/var/log/pacct]

Groups the processes by what they are on this test bed (a module run on a test host is root's `python3` that ends
within 5 s; the vLLM servers run as the `vllm` user; the controller is `ansible-playbook` and the task forks it makes)
and prints CPU seconds, processes and CPU per process, largest first (docs/testbed.md, "Where the CPU goes").
"""
from __future__ import annotations

import collections
import subprocess
import sys

VLLM_UID = "999"  # the vllm user of the test-bed image


def group(comm: str, uid: str, elapsed: float) -> str:
    if uid == VLLM_UID:
        return "vLLM servers (the vllm user: API servers, engine cores, compilers)"
    if comm == "ansible-playboo":
        return "Ansible controller (ansible-playbook and its task forks)"
    if comm == "python3" and uid == "0" and elapsed < 5:
        return "modules on the test hosts (root's python3, < 5 s)"
    if comm in ("python", "pytest"):
        return "the tests' own Python (pytest, the clients)"
    if comm.startswith(("pip", "apt", "dpkg")):
        return "package installs (pip, apt)"
    if comm in ("ssh", "sshd"):
        return "ssh"
    return "other: " + comm


def main(path: str) -> int:
    dump = subprocess.run(["dump-acct", path], capture_output=True, text=True, check=True).stdout
    cpu = collections.Counter()
    count = collections.Counter()
    for line in dump.splitlines():
        field = [part.strip() for part in line.split("|")]
        comm, seconds, elapsed, uid = field[0], (float(field[2]) + float(field[3])) / 100, float(field[4]) / 100, field[5]
        name = group(comm, uid, elapsed)
        cpu[name] += seconds
        count[name] += 1
    total = sum(cpu.values())
    print("%d processes, %.0f CPU s" % (sum(count.values()), total))
    for name, seconds in cpu.most_common(15):
        print("%7.0f s %5.1f %%  %7d processes  %6.3f s each  %s"
              % (seconds, 100 * seconds / total, count[name], seconds / count[name], name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "/var/log/pacct"))
