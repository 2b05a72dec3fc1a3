"""Shared fixtures for integration tests: real systemd test hosts and a real vLLM CPU server.

The `vllm_server` fixture boots an nspawn systemd machine from the cached image that
roles/vllm_install produced (tools/testbed/vllm-image.sh), copies a tiny model made by
tools/tinymodels into it and runs `vllm serve` there as a transient systemd unit. The
machine shares the host's network, so tests reach the server on 127.0.0.1.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTBED = os.path.join(REPO, "tools", "testbed", "testbed.sh")
STATE = os.environ.get("TESTBED_STATE", "/var/lib/llmfleet-testbed")
VLLM_READY_TIMEOUT_S = 420
VLLM_SERVER_SSH_PORT = "2231"


@dataclass
class VllmServer:
    base_url: str
    model: str
    machine: str

    def machine_exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([TESTBED, "ssh", self.machine, *argv], check=check, capture_output=True, text=True)


def _run(*argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


def _wait_healthy(base_url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(base_url + "/v1/models", timeout=5) as resp:
                if resp.status == 200 and json.load(resp)["data"]:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise TimeoutError(f"vLLM at {base_url} not ready after {timeout_s}s")


class TokenStreamServer:
    """tests/fixtures/token_stream_server.py (a TEST FIXTURE endpoint) in its own process."""

    def __init__(self, *args):
        script = os.path.join(REPO, "tests", "fixtures", "token_stream_server.py")
        self.proc = subprocess.Popen([sys.executable, script, "--port", "0"] + [str(a) for a in args],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.proc.kill()
            raise RuntimeError("fixture server did not start: %r" % line)
        self.port = int(line.split()[1])
        self.base_url = "http://127.0.0.1:%d" % self.port
        self.model = "fixture-model"

    def metric(self, name):
        text = urllib.request.urlopen(self.base_url + "/metrics", timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith(name):
                return float(line.rsplit(" ", 1)[1])
        return None

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def stream_server():
    """Start fast local token-stream endpoints (stream_server(*args)); all are stopped afterwards."""
    servers = []

    def start(*args):
        servers.append(TokenStreamServer(*args))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def pivot_playbook():
    """A function of an inventory directory that runs playbooks/pivot.yml with it, as users do (the CLI, -e)."""
    def runner(inventory):
        def run(*extra: str, at_task=None) -> subprocess.CompletedProcess:
            """at_task: (part of a task's name, a function): called once, as the first task so named starts (a load that
            only needs to be there from that step on costs the box's CPU only from then)."""
            env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                       PYTHONUNBUFFERED="1")
            argv = [os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", str(inventory),
                    os.path.join(REPO, "playbooks", "pivot.yml"), *extra]
            if at_task is None:
                result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, check=False)
            else:
                name, act = at_task
                lines = []
                with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                      cwd=REPO) as proc:
                    for line in proc.stdout:
                        lines.append(line)
                        if name and line.startswith("TASK [") and name in line:
                            act()
                            name = None
                result = subprocess.CompletedProcess(argv, proc.returncode, "".join(lines), "")
            if os.environ.get("PIVOT_LOG_DIR"):  # every run's whole output, for a failure whose cause scrolled away
                os.makedirs(os.environ["PIVOT_LOG_DIR"], exist_ok=True)
                name = "%s-%03d.log" % (os.path.basename(str(inventory)), len(os.listdir(os.environ["PIVOT_LOG_DIR"])))
                with open(os.path.join(os.environ["PIVOT_LOG_DIR"], name), "w", encoding="utf-8") as handle:
                    handle.write(" ".join(extra) + "\n" + result.stdout + result.stderr)
            return result
        return run
    return runner


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> str:
    """Directory holding the tiny test models (tiny-llama-a, tiny-llama-b), generated locally."""
    out = tmp_path_factory.mktemp("tiny-models")
    _run(sys.executable, os.path.join(REPO, "tools", "tinymodels", "make_tiny_models.py"), str(out))
    return str(out)


@pytest.fixture(scope="session")
def vllm_image() -> str:
    """Name of the cached test-bed image with vLLM's CPU engine installed by roles/vllm_install."""
    return _run(os.path.join(REPO, "tools", "testbed", "vllm-image.sh")).stdout.strip()


@pytest.fixture(scope="session")
def vllm_server(vllm_image: str, tiny_models: str):
    """A real vLLM CPU server serving tiny-llama-a inside a systemd test host."""
    machine, ssh_port, http_port, model = "itest-vllm", VLLM_SERVER_SSH_PORT, 8301, "tiny-llama-a"
    _run(TESTBED, "up", machine, ssh_port, vllm_image)
    try:
        dest = os.path.join(STATE, machine, "rootfs", "srv", "models", model)
        shutil.copytree(os.path.join(tiny_models, model), dest)
        _run(TESTBED, "ssh", machine,
             f"chown -R vllm:vllm /srv/models && systemd-run --unit=itest-vllm --uid=vllm "
             f"--setenv=HOME=/var/lib/vllm --setenv=VLLM_ENABLE_V1_MULTIPROCESSING=0 "
             f"/opt/vllm/bin/vllm serve /srv/models/{model} --served-model-name {model} "
             f"--host 127.0.0.1 --port {http_port} --max-model-len 256 --enforce-eager --kv-cache-memory-bytes 64M --distributed-executor-backend uni")
        server = VllmServer(f"http://127.0.0.1:{http_port}", model, machine)
        try:
            _wait_healthy(server.base_url, VLLM_READY_TIMEOUT_S)
        except TimeoutError:
            log = server.machine_exec("journalctl", "-u", "itest-vllm", "-n", "60", "--no-pager", check=False).stdout
            raise TimeoutError(f"vLLM did not become ready; journal tail:\n{log}") from None
        yield server
    finally:
        subprocess.run([TESTBED, "down", machine], check=False, capture_output=True)


@pytest.fixture(scope="session")
def machine_inventory(vllm_server, tmp_path_factory) -> str:
    """Inventory file (JSON) that reaches the vllm_server machine over SSH, as root."""
    key = _run(TESTBED, "key").stdout.strip()
    inv = tmp_path_factory.mktemp("inv") / "hosts.yml"
    inv.write_text(json.dumps({"all": {"hosts": {vllm_server.machine: {
        "ansible_host": "127.0.0.1", "ansible_port": int(VLLM_SERVER_SSH_PORT), "ansible_user": "root",
        "ansible_ssh_private_key_file": key,
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"}}}}))
    return str(inv)
