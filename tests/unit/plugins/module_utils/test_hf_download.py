"""Planning helpers of llmfleet.vllm.hf_snapshot (plugins/module_utils/hf_download.py) on real files."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import hf_download as hfd
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_manifest import manifest_from_siblings

SHA = "a" * 64


def manifest(files):
    return manifest_from_siblings("org/m", "c" * 40, [
        {"rfilename": path, "size": size, "blob_id": "b" * 40, "lfs": {"sha256": SHA, "size": size}} for path, size in files])


def write(path, size):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(b"x" * size)


def test_local_state_splits_complete_missing_and_wrong_size(tmp_path):
    write(tmp_path / "a.safetensors", 10)
    write(tmp_path / "b.safetensors", 7)  # truncated
    m = manifest([("a.safetensors", 10), ("b.safetensors", 9), ("sub/c.json", 3)])
    complete, todo = hfd.local_state(str(tmp_path), m)
    assert complete == ["a.safetensors"]
    assert todo == [{"path": "b.safetensors", "size": 9, "present": True, "local_size": 7},
                    {"path": "sub/c.json", "size": 3, "present": False, "local_size": None}]


def test_space_check_ok_and_short_lists_prune_candidates(tmp_path):
    root = tmp_path / "models"
    write(root / "old" / "w.bin", 5000)
    write(root / "older" / "w.bin", 9000)
    os.utime(root / "older", (1, 1))
    target = str(root / "new")
    ok = hfd.space_check(target, str(root), 1000, 0, free=10_000)
    assert ok["ok"] and ok["missing_bytes"] == 0 and "msg" not in ok

    short = hfd.space_check(target, str(root), 3 * hfd.GB, 2 * hfd.GB, free=1 * hfd.GB)
    assert not short["ok"] and short["missing_bytes"] == 4 * hfd.GB and short["missing_gb"] == 4.0
    assert [c["path"] for c in short["candidates"]] == [str(root / "older"), str(root / "old")]  # oldest first
    assert short["candidates"][0]["size_bytes"] >= 9000
    assert "4.000 GB missing" in short["msg"] and "Nothing was changed" in short["msg"]
    assert "%s (0.000 GB)" % (root / "older") in short["msg"]
    assert "would not be enough" in short["msg"]


def test_space_check_nothing_to_download_is_ok_on_a_full_disk(tmp_path):
    assert hfd.space_check(str(tmp_path / "m"), str(tmp_path), 0, 10 * hfd.GB, free=0)["ok"]


def test_space_check_never_lists_the_target(tmp_path):
    write(tmp_path / "m" / "half" / "x", 100)
    result = hfd.space_check(str(tmp_path / "m" / "half"), str(tmp_path / "m"), 10, 0, free=0)
    assert result["candidates"] == [] and "pruned (oldest first): none" in result["msg"]


def test_free_bytes_of_a_path_not_yet_created(tmp_path):
    assert hfd.free_bytes(str(tmp_path / "a" / "b" / "c")) > 0


def test_manifests_equal_ignores_order():
    a = manifest([("x", 1), ("y", 2)])
    b = manifest([("y", 2), ("x", 1)])
    assert hfd.manifests_equal(a, b)
    assert not hfd.manifests_equal(a, manifest([("x", 1), ("y", 3)]))
    assert not hfd.manifests_equal(a, None)


@pytest.mark.parametrize("mode, error", [(0o600, None), (0o400, None), (0o640, "mode 0640"), (0o604, "mode 0604")])
def test_token_file_mode(tmp_path, mode, error):
    path = tmp_path / "token"
    path.write_text("hf_abc\n")
    os.chmod(path, mode)
    if error:
        with pytest.raises(ValueError, match=error):
            hfd.read_token_file(str(path))
    else:
        assert hfd.read_token_file(str(path)) == "hf_abc"


def test_token_file_empty(tmp_path):
    path = tmp_path / "token"
    path.write_text("\n")
    os.chmod(path, 0o600)
    with pytest.raises(ValueError, match="empty"):
        hfd.read_token_file(str(path))


def test_progress_counts_complete_files_and_incomplete_bytes(tmp_path):
    planned = [{"path": "a", "size": 100, "present": False}, {"path": "b", "size": 300, "present": False}]
    writer = hfd.ProgressWriter(str(tmp_path / hfd.PROGRESS_RELPATH), str(tmp_path), planned, interval=0.05)
    write(tmp_path / "a", 100)
    write(tmp_path / ".cache" / "huggingface" / "download" / "xyz.etag.1234.incomplete", 120)
    data = writer.start().snapshot()
    assert (data["bytes_done"], data["bytes_total"], data["files_done"], data["files_total"]) == (220, 400, 1, 2)
    assert data["percent"] == 55.0
    final = writer.stop("done")
    assert json.load(open(tmp_path / hfd.PROGRESS_RELPATH)) == final and final["state"] == "done"


# --- an unreachable hub (issue #27 item 11) and a token over plain http (review L10) ------------------------------
# Real sockets, no mock: a port that was just bound and closed refuses connections; the module runs as Ansible runs it
# (a process with its arguments), with the repo's huggingface_hub.

COMMIT = "3" * 40
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def _closed_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_hf_snapshot(**args):
    import subprocess
    import sys
    payload = {"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=False)}
    proc = subprocess.run([sys.executable, "-m", "ansible_collections.llmfleet.vllm.plugins.modules.hf_snapshot",
                           json.dumps(payload)], capture_output=True, text=True, check=False, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.path.join(REPO, ".ansible", "collections"), HF_HUB_DISABLE_TELEMETRY="1"))
    return json.loads(proc.stdout)


def _hold(root, name, commit):
    os.makedirs(os.path.join(root, name))
    with open(os.path.join(root, name, ".llmfleet-manifest.json"), "w") as handle:
        json.dump({"repo_id": "org/m", "revision": commit, "files": []}, handle)


def test_hub_unreachable_names_a_refused_connection_and_not_an_answer_of_the_hub():
    from huggingface_hub import HfApi
    port = _closed_port()
    with pytest.raises(Exception) as refused:
        HfApi(endpoint="http://127.0.0.1:%d" % port, token=False).model_info("org/m", revision="main", timeout=5)
    detail = hfd.hub_unreachable(refused.value)
    assert detail is not None and "ConnectError" in detail and "Connection refused" in detail, detail
    assert hfd.hub_unreachable(ValueError("revision main not found")) is None


def test_hub_that_answers_404_is_not_unreachable():
    import http.server
    import threading
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # 501 to every request
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        from huggingface_hub import HfApi
        with pytest.raises(Exception) as answered:
            HfApi(endpoint="http://127.0.0.1:%d" % server.server_address[1], token=False).model_info("org/m", timeout=5)
        assert hfd.hub_unreachable(answered.value) is None, answered.value
    finally:
        server.shutdown()


def test_resolving_with_an_unreachable_hub_says_so_and_names_the_commit_held(tmp_path):
    """Today's message was '"main" is not a branch, tag or commit ... ConnectError: Connection refused'."""
    root = tmp_path / "models"
    _hold(str(root), "m", COMMIT)
    endpoint = "http://127.0.0.1:%d" % _closed_port()
    result = _run_hf_snapshot(repo_id="org/m", revision="main", local_dir=str(root / "m"), resolve_only=True,
                              endpoint=endpoint, etag_timeout=5)
    assert result.get("failed") and result["hub_unreachable"] is True and result["endpoint"] == endpoint, result
    msg = result["msg"]
    assert msg.startswith('the hub at %s could not be reached to resolve revision "main" of org/m (ConnectError: ' % endpoint), msg
    assert "Connection refused" in msg and "is not a branch" not in msg
    assert "holds commit %s in %s" % (COMMIT, root / "m") in msg and "-e revision=%s" % COMMIT in msg, msg
    # Nothing held: said as plainly.
    empty = _run_hf_snapshot(repo_id="org/other", revision="main", local_dir=str(root / "other"), resolve_only=True,
                             endpoint=endpoint, etag_timeout=5)
    assert empty["failed"] and "No copy of it is on this host" in empty["msg"], empty


def test_a_commit_the_host_holds_resolves_without_the_hub(tmp_path):
    root = tmp_path / "models"
    _hold(str(root), "m--" + COMMIT[:12], COMMIT)
    _hold(str(root), "m", "4" * 40)
    endpoint = "http://127.0.0.1:%d" % _closed_port()
    result = _run_hf_snapshot(repo_id="org/m", revision=COMMIT, local_dir=str(root / "m"), resolve_only=True,
                              endpoint=endpoint, etag_timeout=5)
    assert not result.get("failed") and result["revision"] == COMMIT and result["offline"] is True, result
    assert result["held"] == [{"path": str(root / "m"), "revision": "4" * 40},
                              {"path": str(root / ("m--" + COMMIT[:12])), "revision": COMMIT}]
    assert "going on without the hub" in json.dumps(result.get("warnings", [])), result


@pytest.mark.parametrize("endpoint, refused", [
    ("http://mirror.invalid:8080", True),      # a mirror on the network, plain http: the token would travel in clear
    ("http://mirror.example.org", True),
    ("https://mirror.example.org", False),
    ("http://127.0.0.1:9", False),            # this host's loopback
    ("http://localhost:9", False),
    ("http://[::1]:9", False),
])
def test_a_token_never_goes_to_a_plain_http_endpoint_off_this_host(endpoint, refused):
    error = hfd.endpoint_error(endpoint, token_set=True)
    if refused:
        assert error.startswith("model_fetch_hf_endpoint %s is plain http and a hub token is set" % endpoint), error
    else:
        assert error is None
    assert hfd.endpoint_error(endpoint, token_set=False) is None
    assert hfd.endpoint_error("ftp://mirror", token_set=False).startswith("model_fetch_hf_endpoint must be an http(s) URL")


def test_module_refuses_the_token_over_plain_http_before_sending_anything(tmp_path):
    import time
    started = time.monotonic()
    result = _run_hf_snapshot(repo_id="org/m", revision="main", local_dir=str(tmp_path / "m"), resolve_only=True,
                              endpoint="http://mirror.invalid:8080", token="hf_secret_4711", etag_timeout=30)
    assert result["failed"] and "is plain http and a hub token is set" in result["msg"], result
    assert "hf_secret_4711" not in json.dumps(result)
    assert time.monotonic() - started < 20  # refused before any connection attempt (.invalid never resolves; no address off this host is ever tried)
