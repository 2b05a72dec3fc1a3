"""llmfleet.vllm.hf_snapshot run by real ansible (connection local) against the local hub fixture.

Fast cases that need no test host: the module runs under this repo's .venv python, which has the
same pinned huggingface_hub the role installs on targets.
"""
from __future__ import annotations

import json
import os
import shutil
import random
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools", "localhub"))
# pylint: disable=wrong-import-position
from server import LocalHub  # noqa: E402

PLAYBOOK_BIN = os.path.join(REPO, ".venv", "bin", "ansible-playbook")
PYTHON = os.path.join(REPO, ".venv", "bin", "python")
REPO_A = "llmfleet-test/tiny-llama-a"
SHARD1 = "model-00001-of-00004.safetensors"
BIG_SIZE = 24 * 1024 * 1024
HF_CHUNK = 10 * 1024 * 1024  # huggingface_hub constants.DOWNLOAD_CHUNK_SIZE


@pytest.fixture(scope="module")
def hub(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    shutil.copytree(os.path.join(tiny_models, "tiny-llama-a"), root / "llmfleet-test" / "tiny-llama-a")
    big = root / "llmfleet-test" / "big-blob"
    big.mkdir()
    (big / "config.json").write_text("{}\n")
    (big / "weights.bin").write_bytes(random.Random(7).randbytes(BIG_SIZE))
    with LocalHub(str(root)) as server:
        yield server


@pytest.fixture(autouse=True)
def reset(hub):
    hub.set_faults({})
    hub.clear_requests()


PLAYBOOK = """
- name: Run hf_snapshot
  hosts: localhost
  connection: local
  gather_facts: false
  vars:
    ansible_python_interpreter: %s
  tasks:
    - name: Snapshot
      llmfleet.vllm.hf_snapshot: "{{ module_args }}"
      check_mode: "{{ check }}"
      register: res
      ignore_errors: true
    - name: Hand the result back
      ansible.builtin.copy:
        content: "{{ res | to_json }}"
        dest: "{{ out }}"
        mode: "0600"
""" % PYTHON


def snapshot(hub, check=False, **args):
    """Run the module through ansible-playbook; return its registered result."""
    args.setdefault("repo_id", REPO_A)
    args.setdefault("endpoint", hub.url)
    work = os.path.join(os.environ.get("TMPDIR", "/tmp"), "hf-snapshot-test-%d" % os.getpid())
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "play.yml"), "w", encoding="utf-8") as handle:
        handle.write(PLAYBOOK)
    out = os.path.join(work, "result.json")
    if os.path.exists(out):
        os.unlink(out)
    with open(os.path.join(work, "vars.json"), "w", encoding="utf-8") as handle:
        json.dump({"module_args": args, "check": check, "out": out}, handle)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([PLAYBOOK_BIN, "-i", "localhost,", os.path.join(work, "play.yml"), "-e", "@" + os.path.join(work, "vars.json")],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=300, check=False)
    assert os.path.exists(out), proc.stdout + proc.stderr
    with open(out, encoding="utf-8") as handle:
        return json.load(handle)


def gets(hub):
    return [e["file"] for e in hub.requests() if e["method"] == "GET" and "/resolve/" in e["path"]]


def test_check_mode_plans_from_metadata_without_fetching(hub, tmp_path):
    res = snapshot(hub, check=True, local_dir=str(tmp_path / "m"), allow_patterns=["*.safetensors"])
    assert res["changed"] is True and not res.get("failed")
    assert len(res["to_download"]) == 4 and res["bytes_to_download"] == res["bytes_total"]
    assert res["bytes_to_download"] == sum(os.path.getsize(os.path.join(hub.server.store.root, REPO_A, f["path"]))
                                           for f in res["to_download"])
    assert gets(hub) == [] and not (tmp_path / "m").exists()


def test_truncated_file_is_refetched_whole_then_nothing(hub, tmp_path):
    target = tmp_path / "m"
    first = snapshot(hub, local_dir=str(target))
    assert first["changed"] and first["bytes_downloaded"] == first["bytes_total"]
    manifest = json.loads((target / ".llmfleet-manifest.json").read_text())
    assert manifest["revision"] == first["revision"] and len(manifest["files"]) == len(first["files"])
    with open(target / SHARD1, "r+b") as handle:
        handle.truncate(1000)
    hub.clear_requests()
    second = snapshot(hub, local_dir=str(target))
    assert second["changed"] and second["files_downloaded"] == [SHARD1], second
    assert gets(hub) == [SHARD1]
    assert os.path.getsize(target / SHARD1) == [f for f in manifest["files"] if f["path"] == SHARD1][0]["size"]
    hub.clear_requests()
    third = snapshot(hub, local_dir=str(target))
    assert third["changed"] is False and third["bytes_downloaded"] == 0 and gets(hub) == []


def test_hub_error_fails_cleanly_without_creating_anything(hub, tmp_path):
    hub.set_faults({"repos": {REPO_A: {"api_status": 500}}})
    res = snapshot(hub, local_dir=str(tmp_path / "m"))
    assert res["failed"] and "reading metadata of %s" % REPO_A in res["msg"] and "500" in res["msg"]
    assert not (tmp_path / "m").exists()


def test_no_matching_file_names_the_patterns(hub, tmp_path):
    res = snapshot(hub, local_dir=str(tmp_path / "m"), allow_patterns=["*.gguf"])
    assert res["failed"] and "*.gguf" in res["msg"]


def test_offline_needs_a_manifest_and_reports_missing(hub, tmp_path):
    target = tmp_path / "m"
    res = snapshot(hub, local_dir=str(target), offline=True)
    assert res["failed"] and "no valid manifest" in res["msg"]
    assert snapshot(hub, local_dir=str(target))["changed"]
    (target / SHARD1).unlink()
    hub.clear_requests()
    res = snapshot(hub, local_dir=str(target), offline=True, endpoint="http://127.0.0.1:9")
    assert not res.get("failed") and res["changed"] is False and res["missing"] == [SHARD1]
    assert hub.requests() == []


def test_margin_larger_than_free_space(hub, tmp_path):
    res = snapshot(hub, local_dir=str(tmp_path / "m"), space_margin_bytes=10 ** 18)
    assert res["failed"] and "GB missing" in res["msg"] and res["space"]["missing_bytes"] > 10 ** 17
    assert gets(hub) == [] and not (tmp_path / "m").exists()


def test_dropped_connection_is_resumed_in_run_with_range(hub, tmp_path):
    """huggingface_hub writes 10 MiB chunks; a drop after 12 MB resumes with Range from the first chunk's end."""
    hub.set_faults({"repos": {"llmfleet-test/big-blob": {"files": {"weights.bin": {"drop_at": 12_000_000, "drop_times": 1}}}}})
    res = snapshot(hub, repo_id="llmfleet-test/big-blob", local_dir=str(tmp_path / "m"))
    assert res["changed"] and not res.get("failed"), res
    blob_gets = [e for e in hub.requests() if e["method"] == "GET" and e.get("file") == "weights.bin"]
    assert [e["range"] for e in blob_gets] == [None, "bytes=%d-" % HF_CHUNK], blob_gets
    assert blob_gets[0]["bytes_sent"] == 12_000_000 and blob_gets[1]["bytes_sent"] == BIG_SIZE - HF_CHUNK
    assert os.path.getsize(tmp_path / "m" / "weights.bin") == BIG_SIZE


VERIFY_PLAYBOOK = PLAYBOOK.replace("llmfleet.vllm.hf_snapshot", "llmfleet.vllm.shard_verify").replace("Run hf_snapshot", "Run shard_verify")


def shard_verify(local_dir, **args):
    """shard_verify full mode through ansible-playbook; its registered result."""
    work = os.path.join(os.environ.get("TMPDIR", "/tmp"), "shard-verify-test-%d" % os.getpid())
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "play.yml"), "w", encoding="utf-8") as handle:
        handle.write(VERIFY_PLAYBOOK)
    out = os.path.join(work, "result.json")
    with open(os.path.join(work, "vars.json"), "w", encoding="utf-8") as handle:
        json.dump({"module_args": dict(path=local_dir, mode="full", **args), "check": False, "out": out}, handle)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    subprocess.run([PLAYBOOK_BIN, "-i", "localhost,", os.path.join(work, "play.yml"), "-e", "@" + os.path.join(work, "vars.json")],
                   capture_output=True, text=True, cwd=REPO, env=env, timeout=300, check=True)
    with open(out, encoding="utf-8") as handle:
        return json.load(handle)


def test_files_are_hashed_while_the_others_download(hub, tmp_path):
    """The last shard streams slowly: every other file is hashed before it lands, so the full verification afterwards
    reads at most that shard; a file changed after it was hashed is read again and caught."""
    last = "model-00004-of-00004.safetensors"
    hub.set_faults({"repos": {REPO_A: {"files": {last: {"rate": 200_000}}}}})
    target = tmp_path / "m"
    res = snapshot(hub, local_dir=str(target), progress_interval=0.2)
    assert res["changed"] and not res.get("failed"), res
    during = res["hashed_while_downloading"]
    assert during["files_to_hash"] == len(res["files"]) and during["files_hashed"] >= len(res["files"]) - 1, during
    assert during["hash_mismatches"] == [] and res["progress"]["files_hashed"] == during["files_hashed"]
    last_size = os.path.getsize(target / last)
    verify = shard_verify(str(target), use_download_hashes=True)
    assert not verify.get("failed") and verify["files_hashed_while_downloading"] == during["files_hashed"], verify
    assert verify["bytes_hashed"] <= last_size and verify["bytes_hashed"] + verify["bytes_hashed_while_downloading"] == sum(
        f["size"] for f in json.loads((target / ".llmfleet-manifest.json").read_text())["files"])
    assert shard_verify(str(target))["bytes_hashed"] == verify["total_bytes"]  # by default full mode reads it all
    with open(target / SHARD1, "r+b") as handle:  # same size, other tensor bytes, after it was hashed
        handle.seek(-2, os.SEEK_END)
        handle.write(b"\xff\xfe")
    verify = shard_verify(str(target), use_download_hashes=True)
    assert verify.get("failed") and verify["bad"] == [SHARD1] and "hash_mismatch" in verify["msg"], verify


def test_killed_download_resumed_hashes_again_what_changed_since(hub, tmp_path):
    """A download killed while weights.bin streams leaves config.json hashed; config.json is then changed in place
    (same size) and the download resumed: the change is hashed and caught, never taken for the digest before it."""
    import signal  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel
    hub.set_faults({"repos": {"llmfleet-test/big-blob": {"files": {"weights.bin": {"rate": 2_000_000}}}}})
    target = tmp_path / "m"
    work = tmp_path / "killed"
    work.mkdir()
    (work / "play.yml").write_text(PLAYBOOK)
    (work / "vars.json").write_text(json.dumps({"module_args": {"repo_id": "llmfleet-test/big-blob", "endpoint": hub.url,
                                                                "local_dir": str(target)},
                                                "check": False, "out": str(work / "result.json")}))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.Popen([PLAYBOOK_BIN, "-i", "localhost,", str(work / "play.yml"), "-e", "@%s" % (work / "vars.json")],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ledger = target / ".cache" / "llmfleet" / "hashed.json"
    deadline = time.time() + 60
    while time.time() < deadline and not (ledger.exists() and "config.json" in ledger.read_text()):
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert "config.json" in ledger.read_text() and not (target / "weights.bin").exists()
    (target / "config.json").write_text("[]\n")  # same size as the hub's "{}\n"
    hub.set_faults({})
    res = snapshot(hub, repo_id="llmfleet-test/big-blob", local_dir=str(target))
    assert res["changed"] and not res.get("failed") and res["files_downloaded"] == ["weights.bin"], res
    assert res["hashed_while_downloading"]["hash_mismatches"] == ["config.json"], res["hashed_while_downloading"]
    verify = shard_verify(str(target), use_download_hashes=True, required_files=[])
    assert verify.get("failed") and verify["bad"] == ["config.json"], verify
