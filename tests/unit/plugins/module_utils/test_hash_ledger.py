# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Digests taken during a download count only while the file is unchanged: real files, changed under the hasher."""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import hash_ledger
from ansible_collections.llmfleet.vllm.plugins.module_utils.file_hashing import SHA256
from ansible_collections.llmfleet.vllm.plugins.module_utils.hash_ledger import Ledger
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_verify import verify_model_dir
from ansible_collections.llmfleet.vllm.plugins.module_utils.pipelined_hashing import PipelinedHasher


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def settle():
    time.sleep(hash_ledger.SETTLED_S + 0.02)


def test_a_recorded_digest_counts_until_the_file_changes(tmp_path):
    write(tmp_path / "a.bin", b"x" * 1000)
    settle()
    ledger = Ledger(str(tmp_path))
    digest, recorded = ledger.hash_and_record("a.bin", SHA256)
    assert recorded and ledger.digest("a.bin", SHA256) == digest == hashlib.sha256(b"x" * 1000).hexdigest()
    ledger.save()
    assert Ledger(str(tmp_path)).digest("a.bin", SHA256) == digest  # read back from .cache/llmfleet/hashed.json
    with open(tmp_path / "a.bin", "r+b") as handle:  # same size, one byte changed
        handle.seek(500)
        handle.write(b"y")
    assert ledger.digest("a.bin", SHA256) is None
    assert ledger.digest("a.bin", "git_sha1") is None


def test_a_replaced_file_is_not_the_hashed_one(tmp_path):
    write(tmp_path / "a.bin", b"x" * 1000)
    settle()
    ledger = Ledger(str(tmp_path))
    ledger.hash_and_record("a.bin", SHA256)
    write(tmp_path / "new.bin", b"x" * 1000)
    os.replace(tmp_path / "new.bin", tmp_path / "a.bin")  # same content, another inode (a re-fetch)
    assert ledger.digest("a.bin", SHA256) is None


def test_a_file_written_while_it_is_hashed_is_not_recorded(tmp_path, monkeypatch):
    write(tmp_path / "a.bin", b"x" * 4096)
    settle()
    real_hash_file = hash_ledger.hash_file

    def hash_then_write(path, algorithm, buffer=None):
        result = real_hash_file(path, algorithm, buffer)
        time.sleep(0.01)  # a write after the hasher read the region
        with open(path, "r+b") as handle:
            handle.write(b"z")
        return result

    monkeypatch.setattr(hash_ledger, "hash_file", hash_then_write)
    ledger = Ledger(str(tmp_path))
    _digest, recorded = ledger.hash_and_record("a.bin", SHA256)
    assert not recorded and ledger.digest("a.bin", SHA256) is None


def test_a_file_just_written_is_not_recorded(tmp_path):
    write(tmp_path / "a.bin", b"x" * 10)
    _digest, recorded = Ledger(str(tmp_path)).hash_and_record("a.bin", SHA256)
    assert not recorded  # its ctime is younger than the kernel's timestamp tick could tell apart


def test_a_file_written_just_before_a_long_hash_is_not_recorded(tmp_path, monkeypatch):
    """Settled means settled when the hash began: a write in the same tick during a long read would go unseen."""
    write(tmp_path / "a.bin", b"x" * 10)
    real_hash_file = hash_ledger.hash_file

    def slow_hash_file(path, algorithm, buffer=None):
        time.sleep(hash_ledger.SETTLED_S * 3)  # by its end the ctime is old, but it was not at the start
        return real_hash_file(path, algorithm, buffer)

    monkeypatch.setattr(hash_ledger, "hash_file", slow_hash_file)
    _digest, recorded = Ledger(str(tmp_path)).hash_and_record("a.bin", SHA256)
    assert not recorded


def test_whole_second_timestamps_need_a_longer_margin():
    class Stat:  # a filesystem with 1 s timestamp resolution: ctime has no fraction
        st_ctime_ns = 1_000_000_000 * 1_800_000_000
    assert not hash_ledger.settled(Stat, 1_800_000_000.5) and hash_ledger.settled(Stat, 1_800_000_002.5)
    Stat.st_ctime_ns += 123_456_789
    assert hash_ledger.settled(Stat, 1_800_000_000.2)


def test_a_new_download_run_starts_an_empty_ledger(tmp_path):
    write(tmp_path / "a.bin", b"x" * 1000)
    settle()
    ledger = Ledger(str(tmp_path))
    ledger.hash_and_record("a.bin", SHA256)
    ledger.save()
    assert Ledger(str(tmp_path), fresh=True).entries == {} and Ledger(str(tmp_path)).digest("a.bin", SHA256) is None


def test_pipelined_hasher_hashes_each_file_once_it_is_complete(tmp_path):
    done = {"a.bin": b"a" * 3000, "b.bin": b"b" * 5000, "c.json": b'{"c": 1}\n'}
    entries = [{"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in done.items()]
    entries[2]["sha256"] = "0" * 64  # the hub says otherwise: a mismatch is reported, never a match
    ledger = Ledger(str(tmp_path))
    hasher = PipelinedHasher(ledger, entries, workers=2, interval=0.02).start()
    write(tmp_path / "a.bin", done["a.bin"])
    write(tmp_path / "b.bin", done["b.bin"][:2000])  # still downloading
    write(tmp_path / "c.json", done["c.json"])
    deadline = time.time() + 5
    while hasher.progress()["files_hashed"] < 2 and time.time() < deadline:
        time.sleep(0.02)
    assert hasher.progress()["files_hashed"] == 2 and ledger.digest("b.bin", SHA256) is None
    write(tmp_path / "b.bin", done["b.bin"])
    deadline = time.time() + 5
    while hasher.progress()["files_hashed"] < 3 and time.time() < deadline:
        time.sleep(0.02)
    progress = hasher.stop()
    assert progress["files_hashed"] == 3 and progress["bytes_hashed"] == 8000 + len(done["c.json"])
    assert progress["hash_mismatches"] == ["c.json"]
    assert Ledger(str(tmp_path)).digest("b.bin", SHA256) == entries[1]["sha256"]


def test_pipelined_hasher_gives_each_file_its_owner_before_hashing(tmp_path):
    uid, gid = (65534, 65534) if os.getuid() == 0 else (os.getuid(), os.getgid())
    data = b"w" * 2048
    entry = {"path": "w.bin", "size": len(data), "sha256": write(tmp_path / "w.bin", data)}
    hasher = PipelinedHasher(Ledger(str(tmp_path)), [entry], workers=1, interval=0.02, owner=(uid, gid)).start()
    deadline = time.time() + 5
    while hasher.progress()["files_hashed"] < 1 and time.time() < deadline:
        time.sleep(0.02)
    hasher.stop()
    st = os.stat(tmp_path / "w.bin")
    assert (st.st_uid, st.st_gid) == (uid, gid)
    assert Ledger(str(tmp_path)).digest("w.bin", SHA256) == entry["sha256"]  # the chown came before the digest


@pytest.fixture
def model_dir(tmp_path):
    """A model directory with a manifest: a config, a tokenizer and 1 MiB of weights."""
    files = {"config.json": b'{"model_type": "llama"}\n', "weights.bin": os.urandom(1 << 20)}
    manifest = {"format": 1, "repo_id": "t/m", "revision": "0" * 40, "files": []}
    for name, data in files.items():
        manifest["files"].append({"path": name, "size": len(data), "sha256": write(tmp_path / name, data)})
    (tmp_path / "tokenizer.json").write_text("{}")
    manifest["files"].append({"path": "tokenizer.json", "size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()})
    (tmp_path / ".llmfleet-manifest.json").write_text(json.dumps(manifest))
    settle()
    return tmp_path


def test_full_verification_reads_only_what_was_not_hashed_or_changed_since(model_dir):
    ledger = Ledger(str(model_dir))
    ledger.hash_and_record("weights.bin", SHA256)
    ledger.save()
    result = verify_model_dir(str(model_dir), mode="full", ledger=Ledger(str(model_dir)))
    assert not result["failed"], result["msg"]
    assert result["files_hashed_while_downloading"] == 1 and result["bytes_hashed_while_downloading"] == 1 << 20
    assert result["bytes_hashed"] == result["total_bytes"] - (1 << 20)
    assert all(f["hash_checked"] for f in result["files"])
    with open(model_dir / "weights.bin", "r+b") as handle:  # changed after it was hashed: read again, caught
        handle.seek(1000)
        handle.write(b"\x00\x01\x02")
    result = verify_model_dir(str(model_dir), mode="full", ledger=Ledger(str(model_dir)))
    assert result["failed"] and result["bad"] == ["weights.bin"] and result["files_hashed_while_downloading"] == 0
    assert "hash_mismatch" in result["msg"]


def test_a_digest_that_differed_from_the_hub_fails_without_a_reread(model_dir):
    ledger = Ledger(str(model_dir))
    ledger.hash_and_record("weights.bin", SHA256)
    ledger.entries["weights.bin"]["digest"] = "f" * 64  # as if the download had landed other bytes
    ledger.save()
    result = verify_model_dir(str(model_dir), mode="full", ledger=Ledger(str(model_dir)))
    assert result["failed"] and "(hashed while downloading)" in result["msg"]


def test_without_the_ledger_full_mode_reads_every_byte(model_dir):
    ledger = Ledger(str(model_dir))
    ledger.hash_and_record("weights.bin", SHA256)
    ledger.save()
    result = verify_model_dir(str(model_dir), mode="full")
    assert result["bytes_hashed"] == result["total_bytes"] and result["files_hashed_while_downloading"] == 0


def test_concurrent_records_and_saves(tmp_path):
    for i in range(20):
        write(tmp_path / ("f%d" % i), b"%d" % i * 100)
    settle()
    ledger = Ledger(str(tmp_path))
    threads = [threading.Thread(target=lambda i=i: (ledger.hash_and_record("f%d" % i, SHA256), ledger.save())) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(Ledger(str(tmp_path)).entries) == 20


def test_two_writers_of_one_ledger_never_trip_over_each_others_temporary_file(tmp_path):
    """A killed run's module may still be saving the ledger while the next run's saves it (CI, 2026-12-06: the second
    rename of a shared hashed.json.tmp found it gone). Each save writes a temporary file of its own."""
    ledgers = [Ledger(str(tmp_path)) for _writer in range(2)]
    errors = []

    def save_often(ledger):
        try:
            for _save in range(200):
                ledger.save()
        except OSError as exc:
            errors.append(exc)
    threads = [threading.Thread(target=save_often, args=(ledger,)) for ledger in ledgers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [p.name for p in (tmp_path / ".cache" / "llmfleet").iterdir()] == ["hashed.json"]
