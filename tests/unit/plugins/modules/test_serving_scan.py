"""serving_scan's recognisers on real processes and sockets of this machine (the module runs through ansible in
tests/integration/test_pivot_faults.py, against a real hand-made unit on a systemd test host)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from ansible_collections.llmfleet.vllm.plugins.modules import serving_scan


def test_vllm_server_command_lines():
    assert serving_scan.is_vllm_server(["/opt/vllm/bin/python3", "/opt/vllm/bin/vllm", "serve", "/srv/models/x"])
    assert serving_scan.is_vllm_server(["vllm", "serve", "moonshotai/Kimi-K2.5", "--tensor-parallel-size", "8"])
    assert serving_scan.is_vllm_server(["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "x"])
    assert serving_scan.is_vllm_server(["python", "-m", "vllm.entrypoints.cli.main", "serve", "x"])
    # Behind the fast start launcher (vLLM runs in the launcher's own process).
    assert serving_scan.is_vllm_server(["/opt/vllm/bin/python3", "/usr/local/libexec/llmfleet/vllm-launch.py", "--run-dir",
                                        "/run/llmfleet-launch/vllm-x", "--wait-s", "900", "--", "/opt/vllm/bin/vllm",
                                        "serve", "/var/lib/llmfleet-serve/x", "--port", "8000"])
    assert not serving_scan.is_vllm_server(["python3", "vllm-launch.py", "--run-dir", "/r", "--", "vllm", "bench", "serve"])
    # Not servers: a bench client, an import of vLLM's modules, an editor on a file named vllm.
    assert not serving_scan.is_vllm_server(["vllm", "bench", "serve", "--base-url", "http://x"])
    assert not serving_scan.is_vllm_server(["python", "probe.py", "vllm.entrypoints.openai.api_server"])
    assert not serving_scan.is_vllm_server(["vim", "vllm"])


def test_listener_owner_found_through_proc():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        inodes = serving_scan.listening_inodes({port})
        assert list(inodes.values()) == [port]
        assert serving_scan.socket_owners(inodes) == {next(iter(inodes)): os.getpid()}
    assert serving_scan.listening_inodes({port}) == {}


def test_argv_of_a_real_process():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "serve"])
    try:
        for _attempt in range(100):  # between fork and exec /proc shows the parent's command line
            argv = serving_scan.argv_of(child.pid)
            if argv and argv[-1] == "serve":
                break
            time.sleep(0.05)
        assert argv[-1] == "serve" and argv[1] == "-c"
        assert not serving_scan.is_vllm_server(argv)
    finally:
        child.kill()
        child.wait()
