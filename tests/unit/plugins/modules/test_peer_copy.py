"""llmfleet.vllm.peer_copy's core with the real rsync and rrsync (Debian's rsync package) between local directories.

The one stand-in is ssh itself (rrsync_over_fake_ssh.py, a TEST DOUBLE: no sshd in a unit test); the real ssh, sshd
and per-rollout keys are tested on the systemd test hosts by tests/integration/test_rollout.py.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils.model_manifest import MANIFEST_FILENAME, load_manifest
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_verify import EXTRA_RELDIR as EXTRA, QUARANTINE_RELDIR as QUARANTINE
from ansible_collections.llmfleet.vllm.plugins.modules.peer_copy import copy_from_peers, lock_dir
from model_builders import build_safetensors_model, flip_last_byte, shard_name

FAKE_SSH_CODE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rrsync_over_fake_ssh.py")


@pytest.fixture(autouse=True, scope="module")
def rsync_installed():
    if not shutil.which("rrsync") and os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "install", "-y", "-qq", "rsync"], check=True, env=env, capture_output=True)
    if not shutil.which("rrsync"):
        pytest.fail("rsync with rrsync is needed: apt-get install rsync")


@pytest.fixture(name="fake_ssh", scope="module")
def fixture_fake_ssh(tmp_path_factory):
    """An executable that runs rrsync_over_fake_ssh.py (kept without a shebang in the repository)."""
    path = tmp_path_factory.mktemp("bin") / "ssh"
    path.write_text("#!%s\nimport runpy\nrunpy.run_path(%r, run_name='__main__')\n" % (sys.executable, FAKE_SSH_CODE))
    path.chmod(0o755)
    return str(path)


@pytest.fixture(name="peers")
def fixture_peers(tmp_path, monkeypatch, fake_ssh):
    """Two sources holding the same model, and the manifest of a hub download of it."""
    first = build_safetensors_model(str(tmp_path / "src-a" / "model"), shards=3)
    second = str(tmp_path / "src-b" / "model")
    shutil.copytree(first, second, copy_function=shutil.copy2)
    manifest = load_manifest(os.path.join(first, MANIFEST_FILENAME))
    monkeypatch.setenv("FAKE_SSH_SOURCES", json.dumps({"10.0.0.1": first, "10.0.0.2": second}))
    return {"first": first, "second": second, "manifest": manifest, "dest": str(tmp_path / "dest" / "model"),
            "ssh": fake_ssh}


def params(peers, *addresses):
    return {"dest": peers["dest"], "manifest": peers["manifest"],
            "sources": [{"name": "gpu-%s" % a.rsplit(".", 1)[1], "address": a, "port": 22} for a in addresses],
            "user": "llmfleet-seed", "identity_file": "/nonexistent/id", "known_hosts_file": "/nonexistent/kh",
            "bwlimit_kbps": 0, "io_timeout_s": 30, "connect_timeout_s": 5, "hash_workers": 2,
            "rsync_path": "rsync", "ssh_path": peers["ssh"]}


def test_a_copy_from_one_source_is_verified_and_hashed_as_it_lands(peers):
    result = copy_from_peers(params(peers, "10.0.0.1"))
    assert result["verified"] and result["source"] == "gpu-1", result["msg"]
    total = sum(entry["size"] for entry in peers["manifest"]["files"])
    assert result["bytes_by_source"] == {"gpu-1": total}
    assert result["attempts"][0]["result"] == "verified"
    assert shard_name(2, 3) in result["attempts"][0]["files"]
    assert result["verify"]["bytes_hashed"] + result["verify"]["bytes_hashed_while_downloading"] == total
    # The manifest is the caller's, not the source's: the source's own file is not copied.
    assert load_manifest(os.path.join(peers["dest"], MANIFEST_FILENAME)) == peers["manifest"]
    again = copy_from_peers(params(peers, "10.0.0.1"))
    assert again["verified"] and not again["changed"] and again["bytes_by_source"] == {"gpu-1": 0}
    assert result["set_aside"] == again["set_aside"] == []
    # A file the manifest does not list, left in the directory (issue 43 item 1): set aside, not copied, not deleted.
    with open(os.path.join(peers["dest"], "chat_template.jinja"), "w", encoding="utf-8") as handle:
        handle.write("{{ 'left here' }}")
    third = copy_from_peers(params(peers, "10.0.0.1"))
    assert third["verified"] and third["changed"] and third["set_aside"] == ["chat_template.jinja"], third
    assert not os.path.exists(os.path.join(peers["dest"], "chat_template.jinja"))
    assert os.path.isfile(os.path.join(peers["dest"], EXTRA, "chat_template.jinja"))


def test_an_unreachable_source_is_followed_by_the_next(peers):
    result = copy_from_peers(params(peers, "10.0.0.9", "10.0.0.2"))
    assert result["verified"] and result["source"] == "gpu-2"
    assert [a["result"] for a in result["attempts"]] == ["failed", "verified"]
    assert "Connection refused" in result["attempts"][0]["error"]


def test_a_flipped_byte_is_not_kept_its_source_is_named_and_the_next_source_sends_the_file(peers):
    flip_last_byte(os.path.join(peers["first"], shard_name(2, 3)))
    result = copy_from_peers(params(peers, "10.0.0.1", "10.0.0.2"))
    assert result["verified"], result["msg"]
    assert result["bad_sources"] == {"gpu-1": [shard_name(2, 3)]}
    assert [a["result"] for a in result["attempts"]] == ["bad", "verified"]
    assert result["attempts"][1]["files"] == [shard_name(2, 3)]
    assert os.path.isfile(os.path.join(peers["dest"], QUARANTINE, shard_name(2, 3)))


def test_no_good_source_ends_not_verified_without_failing(peers):
    flip_last_byte(os.path.join(peers["first"], shard_name(1, 3)))
    result = copy_from_peers(params(peers, "10.0.0.1", "10.0.0.9"))
    assert not result["verified"] and result["source"] is None
    assert [a["result"] for a in result["attempts"]] == ["bad", "failed"]
    assert not os.path.exists(os.path.join(peers["dest"], shard_name(1, 3)))


def test_without_sources_the_copy_there_is_checked_and_its_bad_files_moved_aside(peers):
    params_check = dict(params(peers), dest=peers["first"], sources=[])
    assert copy_from_peers(params_check)["verified"]
    flip_last_byte(os.path.join(peers["first"], shard_name(3, 3)))
    result = copy_from_peers(params_check)
    assert not result["verified"] and result["quarantined"] == [shard_name(3, 3)] and result["changed"]
    assert not os.path.exists(os.path.join(peers["first"], shard_name(3, 3)))


def test_only_the_commits_files_are_copied_and_a_patched_file_arrives_as_the_hub_original(peers):
    """A source's extra files, symlinks and patch records stay there; a file it patched comes as its kept original."""
    first = peers["first"]
    original = open(os.path.join(first, "config.json"), "rb").read()
    os.makedirs(os.path.join(first, ".cache", "llmfleet", "originals"))
    shutil.copy2(os.path.join(first, "config.json"), os.path.join(first, ".cache", "llmfleet", "originals", "config.json"))
    with open(os.path.join(first, "config.json"), "w", encoding="utf-8") as handle:
        handle.write('{"patched": true}')
    with open(os.path.join(first, ".cache", "llmfleet", "patches.json"), "w", encoding="utf-8") as handle:
        handle.write("{}")
    with open(os.path.join(first, "chat_template.jinja"), "w", encoding="utf-8") as handle:
        handle.write("{{ not in the commit }}")
    os.symlink("/etc/passwd", os.path.join(first, "passwd"))
    result = copy_from_peers(params(peers, "10.0.0.1"))
    assert result["verified"], result["msg"]
    assert open(os.path.join(peers["dest"], "config.json"), "rb").read() == original
    for absent in ("chat_template.jinja", "passwd", ".cache/llmfleet/patches.json", ".cache/llmfleet/originals/config.json"):
        assert not os.path.lexists(os.path.join(peers["dest"], absent)), absent


def test_the_manifest_is_the_directorys_only_once_verified_and_one_copy_runs_at_a_time(peers):
    flip_last_byte(os.path.join(peers["first"], shard_name(1, 3)))
    assert not copy_from_peers(params(peers, "10.0.0.1"))["verified"]
    assert not os.path.exists(os.path.join(peers["dest"], MANIFEST_FILENAME))
    held = lock_dir(peers["dest"])
    try:
        busy = copy_from_peers(params(peers, "10.0.0.2"))
    finally:
        held.close()
    assert not busy["verified"] and "still running" in busy["attempts"][0]["error"] and not busy["changed"]
    assert copy_from_peers(params(peers, "10.0.0.2"))["verified"]
    assert os.path.exists(os.path.join(peers["dest"], MANIFEST_FILENAME))
