# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the test-bed benchmarks (bench/pivot.py, bench/fleet.py) share: machines, hub, playbook runs."""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTBED = os.path.join(REPO, "tools", "testbed", "testbed.sh")
HUB = os.path.join(REPO, "tools", "localhub", "tiny-hub.sh")
ANSIBLE_PLAYBOOK = os.path.join(REPO, ".venv", "bin", "ansible-playbook")
MODELS = ("tiny-llama-a", "tiny-llama-b")
# The working tree as ansible_collections.llmfleet.vllm (`make venv`'s link): the benches read what its owners say.
sys.path.insert(0, os.path.join(REPO, ".ansible", "collections"))
# pylint: disable-next=wrong-import-position,unused-import  # re-exported: the benches read records through tb
from ansible_collections.llmfleet.vllm.plugins.module_utils.results_paths import read_pivot_record  # noqa: E402,F401


def vllm_image() -> str:
    """Name of the cached vLLM CPU test-bed image (built on first use, ~5-11 min)."""
    return subprocess.run([os.path.join(REPO, "tools", "testbed", "vllm-image.sh")], check=True,
                          capture_output=True, text=True).stdout.strip()


def machine_up(name: str, ssh_port: int | str, image: str) -> None:
    subprocess.run([TESTBED, "up", name, str(ssh_port), image], check=True, capture_output=True)


def machine_down(name: str) -> None:
    subprocess.run([TESTBED, "down", name], check=False, capture_output=True)


def hub(action: str, port: int | str) -> None:
    subprocess.run([HUB, action, str(port)], check=action == "start")


def ssh(name: str, *cmd: str) -> str:
    return subprocess.run([TESTBED, "ssh", name, *cmd], capture_output=True, text=True, check=False).stdout.strip()


def serving(name: str) -> str:
    """The model the slot `default` of a test host serves according to its state ('' when none)."""
    raw = ssh(name, "cat", "/var/lib/llmfleet/slots.json")
    return json.loads(raw)["slots"].get("default", {}).get("model", "") if raw else ""


def other_model(model: str) -> str:
    return MODELS[1] if model == MODELS[0] else MODELS[0]


def write_inventory(inv_dir: str, hosts: dict[str, dict]) -> None:
    """hosts.yml with the given host vars; group_vars come from inventory/testbed."""
    lines = ["all:", "  hosts:"]
    for host, host_vars in hosts.items():
        lines.append(f"    {host}:")
        lines += [f"      {key}: {json.dumps(value)}" for key, value in host_vars.items()]
    with open(os.path.join(inv_dir, "hosts.yml"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    link = os.path.join(inv_dir, "group_vars")
    if not os.path.islink(link):
        os.symlink(os.path.join(REPO, "inventory", "testbed", "group_vars"), link)


def run_playbook(inventory: str, playbook: str, *args: str, forks: int | None = None,
                 log: str | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Run a playbook; exit with its output tail when it fails. Returns (result, wall seconds)."""
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    if forks:
        env["ANSIBLE_FORKS"] = str(forks)
    start = time.monotonic()
    result = subprocess.run([ANSIBLE_PLAYBOOK, "-i", inventory, playbook, *args], capture_output=True, text=True,
                            env=env, cwd=REPO, check=False)
    wall = time.monotonic() - start
    if log:
        with open(log, "w", encoding="utf-8") as fh:
            fh.write(result.stdout + result.stderr)
    if result.returncode != 0:
        sys.exit(f"{playbook} {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-2000:]}")
    return result, wall


def changed_count(output: str) -> int:
    return sum(int(n) for n in re.findall(r"changed=(\d+)", output.split("PLAY RECAP")[-1]))


def spread(values: list[float], digits: int = 1) -> str:
    """median (min-max)"""
    if not values:
        return "-"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def load_average() -> str:
    with open("/proc/loadavg", encoding="utf-8") as fh:
        return " ".join(fh.read().split()[:3])
