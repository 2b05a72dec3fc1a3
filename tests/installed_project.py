"""A user's project with the collection installed from its tarball (tests/unit/test_installed_collection.py, and the
first pivot of tests/integration/test_pivot_faults.py)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from dataclasses import dataclass

REPO = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent


@dataclass
class Project:
    path: pathlib.Path        # the user's project: ansible.cfg, inventory/, results/ once something ran
    collection: pathlib.Path  # where llmfleet.vllm is installed (inside the project's collections/)
    env: dict                 # the environment to run ansible-* there with (its own ansible.cfg)


def make_project(path: pathlib.Path, inventory: str = "all:\n  hosts: {}\n") -> Project:
    """`ansible-galaxy collection build` of this tree, installed into path/collections; path/ansible.cfg as a user
    writes it; path/inventory/hosts.yml."""
    dist = path / "dist"
    subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path", str(dist), str(REPO)],
                   check=True, capture_output=True, text=True)
    tarball = next(dist.glob("llmfleet-vllm-*.tar.gz"))
    # --no-deps: community.general comes with the `ansible` package here (no Galaxy on CI); the test checks that the
    # tarball declares it.
    subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "--no-deps", "--force", "-p",
                    str(path / "collections"), str(tarball)], check=True, capture_output=True, text=True)
    (path / "ansible.cfg").write_text("[defaults]\ncollections_path = ./collections\ninventory = ./inventory\n"
                                      "host_key_checking = False\ninterpreter_python = auto_silent\n"
                                      "[ssh_connection]\npipelining = True\n")
    (path / "inventory").mkdir(exist_ok=True)
    (path / "inventory" / "hosts.yml").write_text(inventory)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(path / "ansible.cfg"), ANSIBLE_NOCOLOR="1", PATH="%s:%s" % (BIN, env.get("PATH", "")))
    return Project(path, path / "collections" / "ansible_collections" / "llmfleet" / "vllm", env)
