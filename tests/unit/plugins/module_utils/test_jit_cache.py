"""plugins/module_utils/jit_cache.py (issue 45 item 2): a JIT cache's manifest, built, validated, verified against
the files, and a cache that does not match it set aside whole."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import jit_cache

KEY = {"vllm_version": "0.26.0", "torch_version": "2.11.0+cu130", "device": "cuda sm_90 NVIDIA H100 80GB HBM3",
       "model_config_sha256": "a" * 64, "serve_args_sha256": "b" * 64}


def _cache(tmp_path):
    """A cache directory shaped like a unit's after a CUDA start: vLLM's compile cache and Triton's kernels."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    files = {"vllm/torch_compile_cache/1f2e/rank_0_0/backbone/artifact_compile_range_1_8192_subgraph_0": b"\x7fELF" * 300,
             "vllm/torch_compile_cache/1f2e/rank_0_0/backbone/cache_key_factors.json": b'{"env": {}}',
             ".triton/cache/ZX3/triton_poi_fused_0.cubin": os.urandom(4096),
             ".triton/cache/ZX3/__grp__triton_poi_fused_0.json": b"{}"}
    for rel, data in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (tmp_path / "huggingface").mkdir(exist_ok=True)  # not a JIT cache: never listed
    (tmp_path / "huggingface" / "token").write_text("x")
    return tmp_path, files


def test_the_manifest_lists_every_jit_file_with_its_sha256_under_its_key(tmp_path):
    cache, files = _cache(tmp_path)
    manifest = jit_cache.build(str(cache), KEY, now=1000.0)
    assert sorted(manifest["files"]) == sorted(files) and manifest["bytes"] == sum(map(len, files.values()))
    assert manifest["key"] == KEY and manifest["key_id"] == jit_cache.key_id(dict(reversed(list(KEY.items()))))
    assert manifest["built_at"] == 1000.0 and jit_cache.validate(json.loads(json.dumps(manifest))) == []
    assert jit_cache.verify(str(cache), manifest) == []


def test_a_key_names_what_it_lacks_and_what_it_does_not_know():
    with pytest.raises(ValueError, match="needs device"):
        jit_cache.key_id(dict(KEY, device=""))
    with pytest.raises(ValueError, match="has no field model_path"):
        jit_cache.key_id(dict(KEY, model_path="/srv/models/x"))
    # Any field changes the id: a cache built under another vLLM, GPU or config is another program.
    ids = {jit_cache.key_id(dict(KEY, **{field: "other"})) for field in jit_cache.KEY_FIELDS}
    assert len(ids) == len(jit_cache.KEY_FIELDS) and jit_cache.key_id(KEY) not in ids


def test_a_flipped_byte_a_missing_file_and_a_short_one_are_each_named(tmp_path):
    cache, files = _cache(tmp_path)
    manifest = jit_cache.build(str(cache), KEY)
    kernel, group = ".triton/cache/ZX3/triton_poi_fused_0.cubin", ".triton/cache/ZX3/__grp__triton_poi_fused_0.json"
    artifact = "vllm/torch_compile_cache/1f2e/rank_0_0/backbone/artifact_compile_range_1_8192_subgraph_0"
    factors = "vllm/torch_compile_cache/1f2e/rank_0_0/backbone/cache_key_factors.json"
    assert {kernel, group, artifact, factors} == set(files)
    data = bytearray((cache / kernel).read_bytes())
    data[100] ^= 1
    (cache / kernel).write_bytes(bytes(data))
    (cache / artifact).unlink()
    (cache / factors).write_bytes(b"{}")
    (cache / "vllm" / "new-kernel-of-a-later-start").write_bytes(b"x")  # not listed: not a fault
    problems = jit_cache.verify(str(cache), manifest)
    assert problems == ["%s is missing" % artifact, "%s has 2 bytes, the manifest 11" % factors,
                        "%s differs from the manifest (sha256)" % kernel], problems
    assert group not in " ".join(problems)


def test_a_manifest_read_back_from_elsewhere_is_checked_before_it_is_trusted():
    good = {"format": 1, "key": KEY, "key_id": jit_cache.key_id(KEY),
            "files": {"vllm/a": {"sha256": "0" * 64, "size": 1}}}
    assert jit_cache.validate(good) == []
    assert jit_cache.validate(dict(good, key_id="0" * 64)) == ["key_id is not the sha256 of its key"]
    assert jit_cache.validate({"format": 2}) == ["not a JIT cache manifest of format 1"]
    for rel in ("/etc/passwd", "vllm/../../etc/cron.d/x", "elsewhere/a", "vllm/x\n* * * * * root id", "vllm", "vllm/a/",
                "vllm/./a", ".nv/ComputeCache/index"):
        assert jit_cache.validate(dict(good, files={rel: {"sha256": "0" * 64, "size": 1}})) == [
            "%r is not a path of a file inside vllm, .triton, torchinductor" % rel]
    for entry in ({"sha256": "0" * 64, "size": -1}, {"sha256": "0" * 64, "size": True}, {"sha256": "Z" * 64, "size": 1}):
        assert jit_cache.validate(dict(good, files={"vllm/a": entry})) == [
            "vllm/a: an entry needs size (a whole number >= 0) and sha256 (64 lowercase hex digits)"], entry
    assert jit_cache.validate(dict(good, key=dict(KEY, device=7), key_id="0" * 64)) == ["the JIT cache key needs device"]
    assert jit_cache.validate(dict(good, files={"vllm/a": {"sha256": "short", "size": "1"}})) == [
        "vllm/a: an entry needs size (a whole number >= 0) and sha256 (64 lowercase hex digits)"]


def test_a_symbolic_link_a_fifo_and_a_linked_jit_directory_are_refused(tmp_path):
    cache, _files = _cache(tmp_path / "a")
    (cache / "vllm" / "elsewhere").symlink_to("/etc")
    with pytest.raises(ValueError, match="vllm/elsewhere is not a regular file"):
        jit_cache.build(str(cache), KEY)
    cache, _files = _cache(tmp_path / "b")
    os.mkfifo(cache / ".triton" / "pipe")  # opening it would block a reader for ever
    with pytest.raises(ValueError, match=r"\.triton/pipe is not a regular file"):
        jit_cache.build(str(cache), KEY)
    cache = tmp_path / "c"
    cache.mkdir()
    (cache / "vllm").symlink_to("/root")  # the service user owns the cache: it could point root's reader anywhere
    with pytest.raises(ValueError, match="vllm is not a directory"):
        jit_cache.build(str(cache), KEY)


def test_a_copy_from_elsewhere_holds_exactly_the_files_of_its_manifest(tmp_path):
    cache, _files = _cache(tmp_path)
    manifest = jit_cache.build(str(cache), KEY)
    (cache / ".triton" / "cache" / "ZX3" / "extra_kernel.cubin").write_bytes(b"code nobody recorded")
    assert jit_cache.verify(str(cache), manifest) == []  # the host's own: a later start's kernel
    assert jit_cache.verify(str(cache), manifest, exact=True) == [".triton/cache/ZX3/extra_kernel.cubin is not in the manifest"]


def test_set_aside_refuses_a_place_the_service_user_could_have_made(tmp_path):
    cache, _files = _cache(tmp_path / "a")
    (cache / "jit-set-aside").symlink_to(tmp_path)  # root would write where the link points
    with pytest.raises(OSError):
        jit_cache.set_aside(str(cache), "reason")
    assert (cache / "vllm").is_dir() and not (tmp_path / "19700101T000000Z").exists()
    cache, _files = _cache(tmp_path / "b")
    (cache / "jit-set-aside").mkdir()
    os.chown(cache / "jit-set-aside", 4242, 4242)  # made by someone else, who could swap what is inside
    with pytest.raises(ValueError, match="jit-set-aside is not this user's own directory"):
        jit_cache.set_aside(str(cache), "reason")
    assert (cache / "vllm").is_dir()


def test_set_aside_moves_the_caches_and_their_manifest_whole_and_says_why(tmp_path):
    cache, files = _cache(tmp_path)
    (cache / jit_cache.MANIFEST_NAME).write_text(json.dumps(jit_cache.build(str(cache), KEY)))
    dest = jit_cache.set_aside(str(cache), "vllm/x differs from the manifest (sha256)", now=0)
    assert dest == str(cache / "jit-set-aside" / "19700101T000000Z")
    assert not any((cache / top).exists() for top in jit_cache.JIT_DIRS) and (cache / "huggingface" / "token").exists()
    assert all((cache / "jit-set-aside" / "19700101T000000Z" / rel).exists() for rel in files)
    assert (cache / "jit-set-aside" / "19700101T000000Z" / "REASON").read_text() == "vllm/x differs from the manifest (sha256)\n"
    assert jit_cache.cache_files(str(cache)) == {} and jit_cache.set_aside(str(cache), "again", now=0) is None
    _cache(tmp_path)
    assert jit_cache.set_aside(str(cache), "a second time in one second", now=0).endswith("19700101T000000Z-1")


def _run_module(args, check=False):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    payload = {"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check)}
    env = dict(os.environ, PYTHONPATH=os.path.join(repo, ".ansible", "collections"))
    proc = subprocess.run([sys.executable, "-m", "ansible_collections.llmfleet.vllm.plugins.modules.jit_cache",
                           json.dumps(payload)], capture_output=True, text=True, check=False, env=env)
    return json.loads(proc.stdout)


def _venv(tmp_path, vllm="0.26.0"):
    """A venv's site-packages with the dist-info of vLLM and torch (what the key reads; nothing is imported)."""
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    for name, version in (("vllm", vllm), ("torch", "2.11.0+cu130")):
        info = site / ("%s-%s.dist-info" % (name, version))
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: %s\nVersion: %s\n\nA long description: x\n" % (name, version))
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    return str(tmp_path / "venv")


def test_the_key_reads_the_versions_from_the_venv_and_hashes_the_config_and_the_flags(tmp_path):
    key = jit_cache.make_key(_venv(tmp_path), "cpu", str(tmp_path / "config.json"), ["--dtype", "float32"])
    assert (key["vllm_version"], key["torch_version"], key["device"]) == ("0.26.0", "2.11.0+cu130", "cpu")
    assert jit_cache.key_id(key) != jit_cache.key_id(jit_cache.make_key(
        _venv(tmp_path), "cpu", str(tmp_path / "config.json"), ["--dtype", "bfloat16"]))
    with pytest.raises(ValueError, match="torch is not installed in /nowhere"):
        jit_cache.installed_version("/nowhere", "torch")


def test_the_module_records_once_verifies_and_sets_a_corrupt_cache_aside_after_check_mode_said_so(tmp_path):
    cache, files = _cache(tmp_path / "cache")
    args = {"cache_dir": str(cache), "venv": _venv(tmp_path), "device": "cpu", "model_config": str(tmp_path / "config.json"),
            "serve_args": ["--max-model-len", "256"]}
    recorded = _run_module(dict(args, state="recorded"))
    assert recorded["changed"] and recorded["files"] == len(files) and (cache / jit_cache.MANIFEST_NAME).exists()
    assert not _run_module(dict(args, state="recorded"))["changed"]  # the same files: the manifest stays
    verified = _run_module(dict(args, state="verified"))
    assert (verified["changed"], verified["problems"], verified["set_aside"]) == (False, [], None)
    assert verified["manifest"]["key_id"] == jit_cache.key_id(verified["key"]) and verified["files"] == len(files)
    # The host's own manifest of another key (a vLLM upgrade here): the files are verified and kept.
    upgraded = _run_module(dict(args, state="verified", venv=_venv(tmp_path / "other", vllm="0.27.0")))
    assert (upgraded["changed"], upgraded["key_matches"], upgraded["problems"]) == (False, False, [])
    # A copy from elsewhere (a manifest given) must be of this unit's key.
    given = _run_module(dict(args, state="verified", manifest=recorded["manifest"],
                             venv=_venv(tmp_path / "other", vllm="0.27.0")), check=True)
    assert given["changed"] and given["set_aside"] is None and "built under another key" in given["problems"][0]
    (cache / ".triton/cache/ZX3/triton_poi_fused_0.cubin").write_bytes(b"not the kernel")
    checked = _run_module(dict(args, state="verified"), check=True)
    assert checked["changed"] and checked["set_aside"] is None and (cache / ".triton").exists()  # check mode: said only
    done = _run_module(dict(args, state="verified"))
    assert done["problems"] == [".triton/cache/ZX3/triton_poi_fused_0.cubin has 14 bytes, the manifest 4096"]
    assert done["set_aside"].startswith(str(cache / "jit-set-aside")) and not (cache / ".triton").exists()
    # Nothing left to verify: the next start builds its own, and the one after records it.
    after = _run_module(dict(args, state="verified"))
    assert (after["changed"], after["problems"], after["set_aside"], after["files"]) == (False, [], None, 0)


def test_the_module_names_what_its_key_cannot_be_built_from(tmp_path):
    result = _run_module({"cache_dir": str(tmp_path), "venv": _venv(tmp_path), "device": "", "state": "recorded",
                          "model_config": str(tmp_path / "config.json"), "serve_args": []})
    assert result["failed"] and result["msg"] == "the key of the JIT caches: the JIT cache key needs device"
    result = _run_module({"cache_dir": str(tmp_path), "venv": str(tmp_path / "none"), "device": "cpu", "state": "recorded",
                          "model_config": str(tmp_path / "config.json"), "serve_args": []})
    assert result["failed"] and result["msg"] == "the key of the JIT caches: vllm is not installed in %s" % (tmp_path / "none")


def test_a_manifest_that_is_not_an_object_is_a_problem_and_an_empty_cache_is_no_change(tmp_path):
    cache, _files = _cache(tmp_path / "cache")
    args = {"cache_dir": str(cache), "venv": _venv(tmp_path), "device": "cpu", "model_config": str(tmp_path / "config.json"),
            "serve_args": [], "state": "verified"}
    (cache / jit_cache.MANIFEST_NAME).write_text("[]")
    broken = _run_module(args)
    assert broken["problems"] == ["llmfleet-jit-manifest.json is not a JSON object"] and broken["changed"], broken
    assert broken["set_aside"] and not (cache / jit_cache.MANIFEST_NAME).exists()
    # A copy's manifest against a cache with nothing left to move: said, and no change.
    given = {"format": 1, "key": KEY, "key_id": jit_cache.key_id(KEY), "files": {"vllm/a": {"sha256": "0" * 64, "size": 1}}}
    for check in (True, False):
        empty = _run_module(dict(args, manifest=given), check=check)
        assert (empty["changed"], empty["problems"], empty["set_aside"]) == (False, ["vllm/a is missing"], None), empty


def _tar_with(path, members):
    """A tar of (name, bytes or None for a symbolic link) members, as another host's archive could be."""
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(path)


def test_an_archive_of_the_canary_seeds_another_host_with_exactly_its_files(tmp_path):
    canary, files = _cache(tmp_path / "canary")
    manifest = jit_cache.build(str(canary), KEY)
    archive = jit_cache.archive(str(canary), manifest, str(tmp_path / "seed.tar"))
    assert not (tmp_path / "seed.tar.tmp").exists()
    host = tmp_path / "host"
    (host / "vllm" / "modelinfos").mkdir(parents=True)
    (host / "vllm" / "modelinfos" / "own.json").write_text("{}")  # the host's own files stay beside the copy's
    assert jit_cache.seed(str(host), manifest, archive) == ([], None)
    assert {rel: (host / rel).read_bytes() for rel in files} == files and (host / "vllm/modelinfos/own.json").exists()
    assert not (host / jit_cache.SEED_STAGING_DIR).exists() and jit_cache.verify(str(host), manifest) == []
    # A file changed on the canary after its manifest was written stops the archive: no copy holds it.
    (canary / ".triton/cache/ZX3/__grp__triton_poi_fused_0.json").write_bytes(b"[]")
    with pytest.raises(ValueError, match="__grp__triton_poi_fused_0.json differs from the manifest"):
        jit_cache.archive(str(canary), manifest, str(tmp_path / "again.tar"))
    assert not (tmp_path / "again.tar").exists() and not (tmp_path / "again.tar.tmp").exists()


def test_a_copy_that_is_not_its_manifest_is_set_aside_and_nothing_of_it_enters_the_caches(tmp_path):
    canary, files = _cache(tmp_path / "canary")
    manifest = jit_cache.build(str(canary), KEY)
    kernel = ".triton/cache/ZX3/triton_poi_fused_0.cubin"
    flipped = bytearray(files[kernel])
    flipped[100] ^= 1
    cases = {
        "flipped": ([(rel, bytes(flipped) if rel == kernel else data) for rel, data in files.items()],
                    ["%s differs from the manifest (sha256)" % kernel]),
        "extra": (list(files.items()) + [("vllm/evil.py", b"import os")], ["vllm/evil.py is not in the manifest"]),
        "link": ([(rel, None if rel == kernel else data) for rel, data in files.items()],
                 ["%s is not a regular file" % kernel, "%s is missing" % kernel]),
        "short": ([(rel, data) for rel, data in files.items() if rel != kernel], ["%s is missing" % kernel]),
    }
    for name, (members, expected) in cases.items():
        host = tmp_path / name
        host.mkdir()
        problems, aside = jit_cache.seed(str(host), manifest, _tar_with(tmp_path / (name + ".tar"), members), now=0)
        assert problems == expected, (name, problems)
        assert aside == str(host / "jit-set-aside" / "19700101T000000Z-jit-seed-staging"), name
        assert jit_cache.cache_files(str(host)) == {} and not (host / jit_cache.SEED_STAGING_DIR).exists(), name
        reason = host / "jit-set-aside" / "19700101T000000Z-jit-seed-staging" / "REASON"
        assert expected[0] in reason.read_text(), name
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (tmp_path / "garbage.tar").write_bytes(b"not a tar at all" * 64)
    problems, aside = jit_cache.seed(str(garbage), manifest, str(tmp_path / "garbage.tar"), now=0)
    assert problems[0].startswith("the copy cannot be read as a tar") and aside and jit_cache.cache_files(str(garbage)) == {}


def test_the_module_seeds_only_a_copy_of_its_own_key_and_removes_the_copy_it_read(tmp_path):
    canary, files = _cache(tmp_path / "canary")
    args = {"venv": _venv(tmp_path), "device": "cpu", "model_config": str(tmp_path / "config.json"), "serve_args": []}
    recorded = _run_module(dict(args, cache_dir=str(canary), state="recorded"))
    archived = _run_module(dict(args, cache_dir=str(canary), state="archived", dest=str(tmp_path / "seed.tar")))
    assert archived["changed"] and archived["archive"] == str(tmp_path / "seed.tar"), archived
    host = tmp_path / "host"
    host.mkdir()
    other = _run_module(dict(args, cache_dir=str(host), state="seeded", source=archived["archive"],
                             manifest=recorded["manifest"], device="NVIDIA H100 80GB HBM3 sm_90"))
    assert (other["seeded"], other["key_matches"], other["changed"]) == (False, False, False), other
    assert "built under another key" in other["problems"][0] and jit_cache.cache_files(str(host)) == {}
    checked = _run_module(dict(args, cache_dir=str(host), state="seeded", source=archived["archive"],
                               manifest=recorded["manifest"], remove_source=True), check=True)
    assert checked["changed"] and not checked["seeded"] and (tmp_path / "seed.tar").exists()
    seeded = _run_module(dict(args, cache_dir=str(host), state="seeded", source=archived["archive"],
                              manifest=recorded["manifest"], remove_source=True))
    assert (seeded["seeded"], seeded["problems"], seeded["files"]) == (True, [], len(files)), seeded
    assert not (tmp_path / "seed.tar").exists()
    assert json.loads((host / jit_cache.MANIFEST_NAME).read_text()) == recorded["manifest"]
    verified = _run_module(dict(args, cache_dir=str(host), state="verified"))
    assert (verified["problems"], verified["key_matches"]) == ([], True), verified
    nothing = _run_module(dict(args, cache_dir=str(tmp_path / "empty"), state="archived", dest=str(tmp_path / "x.tar")))
    assert nothing["failed"] and "no manifest to archive by" in nothing["msg"], nothing


def test_a_link_planted_among_the_caches_is_set_aside_not_a_failed_start(tmp_path):
    cache, _files = _cache(tmp_path / "cache")
    args = {"cache_dir": str(cache), "venv": _venv(tmp_path), "device": "cpu", "model_config": str(tmp_path / "config.json"),
            "serve_args": []}
    assert _run_module(dict(args, state="recorded"))["changed"]
    (cache / "vllm" / "torch_compile_cache" / "planted").symlink_to("/etc/shadow")
    verified = _run_module(dict(args, state="verified"))
    assert not verified.get("failed") and verified["set_aside"], verified
    assert verified["problems"] == ["vllm/torch_compile_cache/planted is not a regular file (a symbolic link, FIFO or device):"
                                    " a JIT cache holds files only"], verified
    assert jit_cache.cache_files(str(cache)) == {}


def test_files_a_writer_is_still_putting_in_place_are_not_part_of_the_cache(tmp_path):
    cache, files = _cache(tmp_path)
    (cache / ".triton" / "cache" / "tmp.pid_42_7").mkdir()
    (cache / ".triton" / "cache" / "tmp.pid_42_7" / "half.cubin").write_bytes(b"half")
    (cache / "vllm" / "tmp.x").write_bytes(b"half")
    (cache / ".nv" / "ComputeCache").mkdir(parents=True)
    (cache / ".nv" / "ComputeCache" / "index").write_bytes(b"rewritten by the driver")
    assert sorted(jit_cache.cache_files(str(cache))) == sorted(files)


def test_seeding_that_fails_midway_is_said_and_leaves_nothing_half_laid(tmp_path):
    canary, files = _cache(tmp_path / "canary")
    manifest = jit_cache.build(str(canary), KEY)
    host = tmp_path / "host"
    host.mkdir()
    problems, aside = jit_cache.seed(str(host), manifest, str(tmp_path / "gone.tar"), now=0)
    assert problems[0].startswith("seeding failed: ") and "gone.tar" in problems[0] and aside, problems
    assert jit_cache.cache_files(str(host)) == {} and not (host / jit_cache.SEED_STAGING_DIR).exists()
    # The host holds a directory where the copy has a file: said, not raised.
    archive = jit_cache.archive(str(canary), manifest, str(tmp_path / "seed.tar"))
    (host / ".triton" / "cache" / "ZX3" / "triton_poi_fused_0.cubin").mkdir(parents=True)
    problems, _aside = jit_cache.seed(str(host), manifest, archive, now=1)
    assert problems and problems[0].startswith("seeding failed: ") and len(files) == 4, problems


def test_the_summary_says_what_each_step_found():
    assert jit_cache.summary({}) == "JIT caches: not checked (nothing started)"
    line = jit_cache.summary({"seeded": {"seeded": True, "files": 25},
                              "verified": {"files": 25, "problems": [], "set_aside": None},
                              "recorded": {"files": 26, "bytes": 400000}})
    assert line == ("JIT caches: seeded from the fleet's copy (25 files); 25 files verified before the start; "
                    "26 files (0.4 MB) recorded after the gate")
    aside = jit_cache.summary({"verified": {"files": 3, "problems": ["vllm/a differs from the manifest (sha256)"],
                                            "set_aside": "/var/cache/x/jit-set-aside/T"}})
    assert aside == ("JIT caches: set aside before the start (vllm/a differs from the manifest (sha256)) to "
                     "/var/cache/x/jit-set-aside/T; this start built its own")
    assert "the fleet's copy not laid in: another key" in jit_cache.summary({"seeded": {"seeded": False, "problems": ["another key"]}})


def test_the_module_refuses_root_in_a_cache_directory_the_service_user_owns(tmp_path):
    cache, _files = _cache(tmp_path / "cache")
    os.chown(cache, 4242, 4242)
    result = _run_module({"cache_dir": str(cache), "venv": _venv(tmp_path), "device": "cpu", "state": "verified",
                          "model_config": str(tmp_path / "config.json"), "serve_args": []})
    assert result["failed"] and "belongs to uid 4242: run jit_cache as that user" in result["msg"], result


def test_a_model_not_downloaded_yet_is_nothing_to_verify_not_a_failed_check(tmp_path):
    cache, _files = _cache(tmp_path / "cache")
    args = {"cache_dir": str(cache), "venv": _venv(tmp_path), "device": "cpu", "serve_args": []}
    _run_module(dict(args, state="recorded", model_config=str(tmp_path / "config.json")))
    verified = _run_module(dict(args, state="verified", model_config=str(tmp_path / "absent" / "config.json")), check=True)
    assert not verified.get("failed") and verified["key_error"].startswith("the key of the JIT caches: ") and \
        (verified["problems"], verified["key_matches"]) == ([], None), verified


def test_the_record_keeps_each_step_that_ran_and_not_the_file_list():
    verified = {"files": 3, "bytes": 10, "manifest": {"key_id": "m", "files": {"vllm/a": {}}}, "key_id": "u",
                "key_error": None, "key_matches": False, "problems": [], "set_aside": None, "seeded": False, "changed": False}
    record = jit_cache.report(verified, {"skipped": True, "changed": False}, None, "Verify them: boom")
    assert record == {"verified": {"files": 3, "bytes": 10, "key_id": "m", "unit_key_id": "u", "key_error": None,
                                   "key_matches": False, "problems": [], "set_aside": None, "seeded": False,
                                   "changed": False},
                      "fault": "Verify them: boom"}
    assert jit_cache.report(None) == {} and "not checked (Verify them: boom)" in jit_cache.summary(record)


def test_a_step_that_failed_is_a_fault_in_the_record_not_zero_files():
    refused = {"failed": True, "msg": "/var/cache/llmfleet-vllm belongs to uid 996: run jit_cache as that user", "files": 0}
    record = jit_cache.report(None, None, refused)
    assert record == {"fault": "recorded: /var/cache/llmfleet-vllm belongs to uid 996: run jit_cache as that user"}, record
    assert "recorded after the gate" not in jit_cache.summary(record) and "not checked (recorded: " in jit_cache.summary(record)
