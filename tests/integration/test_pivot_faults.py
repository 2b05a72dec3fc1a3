"""Pivot fault cases on a real systemd test host with vLLM's CPU engine.

One machine serves tiny-llama-a (pivoted to for real in the fixture); each test then tries a
pivot that must fail, and asserts nothing was lost: tiny-llama-a keeps serving (same main PID
where nothing should have been restarted), no weights were deleted.
"""
from __future__ import annotations

import json
import os
import subprocess
import urllib.request

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTBED = os.path.join(REPO, "tools", "testbed", "testbed.sh")
MACHINE, SSH_PORT, HUB_PORT = "itest-pivot", "2232", "18092"
HUB = os.path.join(REPO, "tools", "localhub", "tiny-hub.sh")
# Ports of their own: test hosts share the host's network, and the molecule scenarios (run beside
# this suite by `make test`) serve the tiny models on their catalog ports.
PORTS = {"tiny-llama-a": {"port": 8401}, "tiny-llama-b": {"port": 8402}}
A_URL = "http://127.0.0.1:8401"


def _ssh(*cmd: str) -> str:
    return subprocess.run([TESTBED, "ssh", MACHINE, *cmd], capture_output=True, text=True, check=False).stdout.strip()


def _main_pid(model: str) -> str:
    return _ssh("systemctl", "show", "-P", "MainPID", f"vllm-{model}.service")


def _is_active(model: str) -> str:
    return _ssh("systemctl", "is-active", f"vllm-{model}.service")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


def _set_hub_faults(plan: dict) -> None:
    req = urllib.request.Request(f"http://127.0.0.1:{HUB_PORT}/_fixture/faults", data=json.dumps(plan).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200


@pytest.fixture(scope="module")
def pivot(tmp_path_factory, vllm_image):
    inv = tmp_path_factory.mktemp("pivot-inventory")
    (inv / "hosts.yml").write_text(
        f"all:\n  hosts:\n    {MACHINE}:\n      ansible_port: {SSH_PORT}\n"
        f"      model_fetch_hf_endpoint: http://127.0.0.1:{HUB_PORT}\n      pivot_benchmark: false\n"
        f"      llmfleet_models_extra: {json.dumps(PORTS)}\n")
    os.symlink(os.path.join(REPO, "inventory", "testbed", "group_vars"), inv / "group_vars")

    def run(*extra: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        return subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", str(inv),
                               os.path.join(REPO, "playbooks", "pivot.yml"), *extra],
                              capture_output=True, text=True, env=env, cwd=REPO, check=False)

    subprocess.run([HUB, "start", HUB_PORT], check=True)
    subprocess.run([TESTBED, "up", MACHINE, SSH_PORT, vllm_image], check=True, capture_output=True)
    try:
        first = run("-e", "model=tiny-llama-a")
        assert first.returncode == 0, first.stdout[-4000:]
        assert _healthy(A_URL)
        yield run
    finally:
        subprocess.run([TESTBED, "down", MACHINE], check=False, capture_output=True)
        subprocess.run([HUB, "stop", HUB_PORT], check=False)


def _assert_a_untouched(pid_before: str) -> None:
    assert _is_active("tiny-llama-a") == "active"
    assert _main_pid("tiny-llama-a") == pid_before, "tiny-llama-a was restarted"
    assert _healthy(A_URL)
    assert _ssh("ls", "/srv/models/tiny-llama-a/config.json") == "/srv/models/tiny-llama-a/config.json"


def test_rerun_same_model_changes_nothing(pivot):
    pid = _main_pid("tiny-llama-a")
    result = pivot("-e", "model=tiny-llama-a")
    assert result.returncode == 0, result.stdout[-4000:]
    assert "changed=0" in result.stdout.split("PLAY RECAP")[-1]
    _assert_a_untouched(pid)


def test_check_mode_pivot_reports_and_changes_nothing(pivot):
    pid = _main_pid("tiny-llama-a")
    result = pivot("-e", "model=tiny-llama-b", "--check", "--diff")
    assert result.returncode == 0, result.stdout[-4000:]
    assert "would start and enable vllm-tiny-llama-b.service" in result.stdout
    _assert_a_untouched(pid)
    assert _ssh("ls", "/etc/systemd/system/vllm-tiny-llama-b.service", "/srv/models/tiny-llama-b") == ""


def test_unknown_model_is_refused_with_the_known_names(pivot):
    pid = _main_pid("tiny-llama-a")
    result = pivot("-e", "model=no-such-model")
    assert result.returncode != 0
    assert "no-such-model" in result.stdout and "tiny-llama-b" in result.stdout
    _assert_a_untouched(pid)


def test_missing_model_variable_is_refused(pivot):
    result = pivot()
    assert result.returncode != 0
    assert "-e model=" in result.stdout


def test_model_needing_more_gpus_than_the_host_has_is_refused(pivot):
    """kimi-k25-int4 needs TP 8 on CUDA GPUs; the test host has none (no GPU here)."""
    pid = _main_pid("tiny-llama-a")
    result = pivot("-e", "model=kimi-k25-int4")
    assert result.returncode != 0
    assert "does not fit" in result.stdout
    _assert_a_untouched(pid)
    assert _ssh("test", "-e", "/srv/models/kimi-k25-int4", "&&", "echo", "exists") == ""


def test_disk_too_small_fails_before_any_change(pivot):
    pid = _main_pid("tiny-llama-a")
    result = pivot("-e", "model=tiny-llama-b", "-e", "model_fetch_space_margin_gb=1000000")
    assert result.returncode != 0
    assert "GB" in result.stdout
    _assert_a_untouched(pid)
    assert _ssh("ls", "/srv/models/tiny-llama-b/config.json") == ""


def test_corrupt_shard_on_the_hub_fails_verification_and_a_keeps_serving(pivot):
    pid = _main_pid("tiny-llama-a")
    _set_hub_faults({"repos": {"llmfleet-test/tiny-llama-b": {"files": {"model-00002-of-*.safetensors": {"corrupt": True}}}}})
    try:
        result = pivot("-e", "model=tiny-llama-b")
    finally:
        _set_hub_faults({"repos": {}})
    assert result.returncode != 0
    assert "model-00002-of-" in result.stdout
    _assert_a_untouched(pid)
    assert _is_active("tiny-llama-b") in ("inactive", "unknown")


def test_corrupt_shard_was_moved_aside_and_is_fetched_again(pivot):
    """The previous test left B's corrupt shard in quarantine, so a later download fetches it again."""
    quarantined = _ssh("ls", "/srv/models/tiny-llama-b/.cache/llmfleet/quarantine/")
    assert "model-00002-of-00003.safetensors" in quarantined
    assert _ssh("test", "-e", "/srv/models/tiny-llama-b/model-00002-of-00003.safetensors", "||", "echo", "gone") == "gone"


def test_unit_that_fails_to_start_is_rolled_back(pivot):
    bad_b = dict(PORTS["tiny-llama-b"], serving={"extra_args": ["--no-such-flag"]})
    extra = json.dumps({"llmfleet_models_extra": dict(PORTS, **{"tiny-llama-b": bad_b})})
    result = pivot("-e", "model=tiny-llama-b", "-e", extra)
    assert result.returncode != 0
    assert "Rolled back" in result.stdout, result.stdout[-4000:]
    assert _is_active("tiny-llama-a") == "active"
    assert _healthy(A_URL)
    assert _is_active("tiny-llama-b") != "active"
    # Nothing deleted: both models' weights are on disk.
    assert _ssh("ls", "/srv/models/tiny-llama-a/config.json", "/srv/models/tiny-llama-b/config.json").count("config.json") == 2
