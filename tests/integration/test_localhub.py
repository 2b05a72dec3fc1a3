"""The local hub fixture, driven by the real huggingface_hub client over HTTP (no mocks).

Every client call passes endpoint= explicitly: huggingface_hub reads HF_ENDPOINT once at import,
which may already have happened in this pytest process. The HF_ENDPOINT route itself is
exercised in a subprocess (test_cli_server_with_hf_endpoint_in_a_fresh_process).
"""
import hashlib
import http.client
import importlib.util
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SERVER_PY = os.path.join(REPO_ROOT, "tools", "localhub", "server.py")
GENERATOR_DIR = os.path.join(REPO_ROOT, "tools", "tinymodels")
REPO = "llmfleet/tiny-llama-a"
SHARD_1, SHARD_2, SHARD_3 = (f"model-0000{i}-of-00004.safetensors" for i in (1, 2, 3))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


localhub = _load("llmfleet_localhub_server", SERVER_PY)
tinymodels = _load("llmfleet_make_tiny_models", os.path.join(GENERATOR_DIR, "make_tiny_models.py"))


@pytest.fixture(scope="module")
def hub_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hubroot")
    for name in ("tiny-llama-a", "tiny-llama-b"):
        tinymodels.make_model(name, str(root / "llmfleet"))
    return root


@pytest.fixture
def hub(hub_root):
    with localhub.LocalHub(str(hub_root)) as running:
        yield running


@pytest.fixture(autouse=True)
def isolated_hf_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)


def file_sha256(path):
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def git_blob_id(path):
    with open(path, "rb") as handle:
        data = handle.read()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree_digest(root):
    return {os.path.relpath(os.path.join(d, n), root): file_sha256(os.path.join(d, n))
            for d, dirs, files in os.walk(root) if ".cache" not in d.split(os.sep) for n in files}


def settled_requests(hub, timeout=5.0):
    """The request log once every handler thread has finished its request."""
    deadline = time.monotonic() + timeout
    while True:
        entries = hub.requests()
        if all(e["done"] for e in entries) or time.monotonic() > deadline:
            return entries
        time.sleep(0.02)


def file_gets(entries, name):
    return [e for e in entries if e["method"] == "GET" and e.get("file") == name]


def download(hub, target, **kwargs):
    kwargs.setdefault("token", False)
    return snapshot_download(REPO, endpoint=hub.url, local_dir=str(target), **kwargs)


def raw_request(hub, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection(hub.server.server_address[0], hub.server.server_address[1], timeout=10)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response, data


# -- metadata -------------------------------------------------------------------------------------

def test_model_info_reports_size_blob_id_and_lfs_sha256_of_every_file(hub, hub_root):
    repo_dir = hub_root / REPO
    info = HfApi(endpoint=hub.url).model_info(REPO, files_metadata=True, token=False)
    assert {s.rfilename for s in info.siblings} == set(os.listdir(repo_dir))
    for sib in info.siblings:
        path = repo_dir / sib.rfilename
        assert sib.size == os.path.getsize(path)
        if sib.rfilename.endswith(".safetensors"):
            assert sib.lfs is not None and sib.lfs.sha256 == file_sha256(path) and sib.lfs.size == sib.size
        else:
            assert sib.lfs is None and sib.blob_id == git_blob_id(path)
    assert len(info.sha) == 40 and int(info.sha, 16) >= 0
    assert info.config["architectures"] == ["LlamaForCausalLM"]


def test_commit_sha_is_stable_and_follows_content(hub_root, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(hub_root / REPO, root / REPO)
    with localhub.LocalHub(str(root)) as hub:
        api = HfApi(endpoint=hub.url)
        first = api.model_info(REPO, token=False).sha
        assert api.model_info(REPO, token=False).sha == first
        assert api.model_info(REPO, revision=first, token=False).sha == first
        (root / REPO / "generation_config.json").write_text('{"do_sample": true}\n')
        assert api.model_info(REPO, token=False).sha != first
        with pytest.raises(RevisionNotFoundError):
            api.model_info(REPO, revision=first, token=False)


def test_tree_lists_files_and_folders_like_the_hub(hub_root, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(hub_root / REPO, root / REPO)
    (root / REPO / "extra" / "deep").mkdir(parents=True)
    (root / REPO / "extra" / "deep" / "notes.txt").write_text("nested\n")
    with localhub.LocalHub(str(root)) as hub:
        api = HfApi(endpoint=hub.url)
        top = {e.path: type(e).__name__ for e in api.list_repo_tree(REPO, token=False)}
        assert top["extra"] == "RepoFolder" and top["config.json"] == "RepoFile"
        assert "extra/deep/notes.txt" not in top
        deep = {e.path for e in api.list_repo_tree(REPO, recursive=True, token=False)}
        assert {"extra/deep", "extra/deep/notes.txt"} <= deep
        local = snapshot_download(REPO, endpoint=hub.url, local_dir=str(tmp_path / "dl"), token=False)
        assert open(os.path.join(local, "extra", "deep", "notes.txt")).read() == "nested\n"


def test_missing_repo_revision_and_file_raise_the_client_errors(hub):
    with pytest.raises(RepositoryNotFoundError):
        HfApi(endpoint=hub.url).model_info("llmfleet/no-such-model", token=False)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="v9", endpoint=hub.url, token=False)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "no-such-file.json", endpoint=hub.url, token=False)


# -- downloads ------------------------------------------------------------------------------------

def test_snapshot_download_gets_byte_identical_files_into_cache_and_local_dir(hub, hub_root, tmp_path):
    cached = snapshot_download(REPO, endpoint=hub.url, cache_dir=str(tmp_path / "cache"), token=False)
    assert tree_digest(cached) == tree_digest(hub_root / REPO)
    local = download(hub, tmp_path / "local")
    assert tree_digest(local) == tree_digest(hub_root / REPO)
    report = HfApi(endpoint=hub.url).verify_repo_checksums(REPO, local_dir=local, token=False)
    assert report.mismatches == [] and report.missing_paths == []


def test_hf_hub_download_by_commit_sha_and_range_requests(hub, hub_root, tmp_path):
    sha = HfApi(endpoint=hub.url).model_info(REPO, token=False).sha
    path = hf_hub_download(REPO, SHARD_2, revision=sha, endpoint=hub.url, cache_dir=str(tmp_path), token=False)
    original = (hub_root / REPO / SHARD_2).read_bytes()
    assert open(path, "rb").read() == original
    resolve = f"/{REPO}/resolve/main/{SHARD_2}"
    response, body = raw_request(hub, "GET", resolve, headers={"Range": "bytes=10-19"})
    assert response.status == 206 and body == original[10:20]
    assert response.getheader("Content-Range") == f"bytes 10-19/{len(original)}"
    response, body = raw_request(hub, "GET", resolve, headers={"Range": "bytes=-5"})
    assert response.status == 206 and body == original[-5:]
    response = raw_request(hub, "GET", resolve, headers={"Range": f"bytes={len(original)}-"})[0]
    assert response.status == 416
    response, body = raw_request(hub, "HEAD", resolve)
    assert response.getheader("X-Linked-Size") == str(len(original)) and body == b""
    assert response.getheader("X-Linked-Etag") == f'"{hashlib.sha256(original).hexdigest()}"'


def test_connection_dropped_once_mid_file_is_resumed_with_a_range_request(tmp_path):
    # The client only keeps whole DOWNLOAD_CHUNK_SIZE (10 MiB) chunks of a broken transfer,
    # so resuming needs a file larger than that; the tiny models are not.
    chunk = hf_constants.DOWNLOAD_CHUNK_SIZE
    blob = random.Random(7).randbytes(2 * chunk + 12345)
    repo_dir = tmp_path / "root" / "llmfleet" / "big-blob"
    repo_dir.mkdir(parents=True)
    (repo_dir / "weights.bin").write_bytes(blob)
    cut = chunk + chunk // 2
    with localhub.LocalHub(str(tmp_path / "root")) as hub:
        hub.set_faults({"repos": {"llmfleet/big-blob": {"files": {"weights.bin": {"drop_at": cut, "drop_times": 1}}}}})
        path = hf_hub_download("llmfleet/big-blob", "weights.bin", endpoint=hub.url,
                               cache_dir=str(tmp_path / "cache"), token=False)
        assert open(path, "rb").read() == blob
        first, second = file_gets(settled_requests(hub), "weights.bin")
    assert first["range"] is None and first["bytes_sent"] == cut and "drop" in first["faults"]
    assert second["range"] == f"bytes={chunk}-" and second["status"] == 206
    assert second["bytes_sent"] == len(blob) - chunk


def test_tiny_file_dropped_once_is_fetched_again_and_arrives_intact(hub, hub_root, tmp_path):
    hub.set_faults({"repos": {REPO: {"files": {SHARD_2: {"drop_at": 700_000, "drop_times": 1}}}}})
    local = download(hub, tmp_path / "dl")
    assert tree_digest(local) == tree_digest(hub_root / REPO)
    first, second = file_gets(settled_requests(hub), SHARD_2)
    assert first["bytes_sent"] == 700_000 and second["status"] in (200, 206)


def test_killed_download_rerun_fetches_only_files_not_completed(hub, hub_root, tmp_path):
    # Dropped at the same offset on every attempt: the client's own retries cannot get past it.
    hub.set_faults({"repos": {REPO: {"files": {SHARD_3: {"drop_at": 300_000}}}}})
    with pytest.raises(Exception, match="(?i)peer closed|incomplete|consistency|remoteprotocol"):
        download(hub, tmp_path / "dl", max_workers=1)
    first_run = settled_requests(hub)
    sizes = {n: os.path.getsize(hub_root / REPO / n) for n in os.listdir(hub_root / REPO)}
    completed = {e["file"] for e in first_run if e["method"] == "GET" and e.get("file")
                 and e["status"] in (200, 206) and e["bytes_sent"] == sizes[e["file"]]}
    assert SHARD_3 not in completed and completed, "the first run should have finished some files"
    assert len(file_gets(first_run, SHARD_3)) > 1  # the client retried before giving up

    hub.set_faults({})
    hub.clear_requests()
    local = download(hub, tmp_path / "dl", max_workers=1)
    assert tree_digest(local) == tree_digest(hub_root / REPO)
    refetched = {e["file"] for e in settled_requests(hub) if e["method"] == "GET" and e.get("file")}
    assert SHARD_3 in refetched
    assert not refetched & completed


def test_download_process_killed_mid_file_then_rerun(hub, hub_root, tmp_path):
    hub.set_faults({"repos": {REPO: {"files": {SHARD_3: {"rate": 200_000}}}}})
    client = ("import sys; from huggingface_hub import snapshot_download; "
              "snapshot_download(sys.argv[1], local_dir=sys.argv[2], max_workers=1)")
    env = dict(os.environ, HF_ENDPOINT=hub.url, HF_HUB_DISABLE_PROGRESS_BARS="1")
    target = tmp_path / "dl"
    proc = subprocess.Popen([sys.executable, "-c", client, REPO, str(target)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not any(e["bytes_sent"] > 100_000 for e in file_gets(hub.requests(), SHARD_3)):
            assert proc.poll() is None and time.monotonic() < deadline, "download never reached the slow shard"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    first_run = settled_requests(hub)
    sizes = {n: os.path.getsize(hub_root / REPO / n) for n in os.listdir(hub_root / REPO)}
    completed = {e["file"] for e in first_run if e["method"] == "GET" and e.get("file")
                 and e["bytes_sent"] == sizes[e["file"]]}
    assert completed and SHARD_3 not in completed

    hub.set_faults({})
    hub.clear_requests()
    assert tree_digest(download(hub, target)) == tree_digest(hub_root / REPO)
    rerun_gets = [e for e in settled_requests(hub) if e["method"] == "GET" and e.get("file")]
    assert {e["file"] for e in rerun_gets} == set(sizes) - completed
    # huggingface_hub 2.4.0 deletes partial files, so the killed file starts again from byte 0
    # (docs/localhub.md). A client that resumes would send a Range here.
    assert [e["range"] for e in rerun_gets if e["file"] == SHARD_3] == [None]


def test_corrupted_file_keeps_original_metadata_so_a_verifier_can_catch_it(hub, hub_root, tmp_path):
    hub.set_faults({"repos": {REPO: {"files": {SHARD_1: {"corrupt": True}}}}})
    info = HfApi(endpoint=hub.url).model_info(REPO, files_metadata=True, token=False)
    local = download(hub, tmp_path / "dl")
    original = (hub_root / REPO / SHARD_1).read_bytes()
    served = open(os.path.join(local, SHARD_1), "rb").read()
    assert len(served) == len(original)
    assert [i for i in range(len(original)) if served[i] != original[i]] == [len(original) // 2]
    expected_sha = next(s.lfs.sha256 for s in info.siblings if s.rfilename == SHARD_1)
    assert expected_sha == hashlib.sha256(original).hexdigest() != hashlib.sha256(served).hexdigest()
    report = HfApi(endpoint=hub.url).verify_repo_checksums(REPO, local_dir=local, token=False)
    assert [m["path"] for m in report.mismatches] == [SHARD_1]


def test_gated_repo_needs_the_bearer_token(hub, tmp_path):
    hub.set_faults({"repos": {REPO: {"token": "hf_fixture_token"}}})
    with pytest.raises(GatedRepoError) as missing:
        hf_hub_download(REPO, "config.json", endpoint=hub.url, cache_dir=str(tmp_path), token=False)
    assert missing.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as wrong:
        hf_hub_download(REPO, "config.json", endpoint=hub.url, cache_dir=str(tmp_path), token="hf_wrong")
    assert wrong.value.response.status_code == 403
    with pytest.raises(GatedRepoError):
        download(hub, tmp_path / "denied")
    local = download(hub, tmp_path / "allowed", token="hf_fixture_token")
    assert os.path.exists(os.path.join(local, SHARD_1))
    assert HfApi(endpoint=hub.url).model_info(REPO, token=False).gated == "manual"


def test_http_500_on_resolve_raises(hub, tmp_path):
    hub.set_faults({"repos": {REPO: {"files": {"config.json": {"status": 500}}}}})
    with pytest.raises(HfHubHTTPError) as error:
        get_hf_file_metadata(hf_hub_url(REPO, "config.json", endpoint=hub.url), token=False)
    assert error.value.response.status_code == 500
    # hf_hub_download retries a 5xx HEAD with backoff (about 25 s) before it gives up.
    with pytest.raises(LocalEntryNotFoundError) as error:
        hf_hub_download(REPO, "config.json", endpoint=hub.url, cache_dir=str(tmp_path), token=False)
    assert error.value.__cause__.response.status_code == 500


def test_http_500_a_limited_number_of_times_is_retried_by_the_client(hub, tmp_path):
    hub.set_faults({"repos": {REPO: {"files": {"config.json": {"status": 500, "status_times": 1}}}}})
    assert hf_hub_download(REPO, "config.json", endpoint=hub.url, cache_dir=str(tmp_path), token=False)
    statuses = [e["status"] for e in settled_requests(hub) if e.get("file") == "config.json"]
    assert statuses[:2] == [500, 200]


def test_http_500_on_the_api(hub):
    hub.set_faults({"repos": {REPO: {"api_status": 500}}})
    with pytest.raises(HfHubHTTPError) as error:
        HfApi(endpoint=hub.url).model_info(REPO, token=False)
    assert error.value.response.status_code == 500


def test_rate_cap_slows_serving(hub, tmp_path):
    size = os.path.getsize(os.path.join(hub.server.store.root, REPO, "tokenizer.json"))
    started = time.monotonic()
    hf_hub_download(REPO, "tokenizer.json", endpoint=hub.url, local_dir=str(tmp_path / "fast"), token=False)
    fast = time.monotonic() - started
    rate = size // 2  # the file should take two seconds
    hub.set_faults({"repos": {REPO: {"files": {"tokenizer.json": {"rate": rate}}}}})
    started = time.monotonic()
    hf_hub_download(REPO, "tokenizer.json", endpoint=hub.url, local_dir=str(tmp_path / "slow"), token=False)
    slow = time.monotonic() - started
    assert slow >= 1.9 and fast < 1.0


def test_uplink_rate_is_shared_by_every_download(hub, tmp_path):
    """The site's link to the hub: two clients at once take twice as long as one alone at the same uplink rate."""
    size = os.path.getsize(os.path.join(hub.server.store.root, REPO, "tokenizer.json"))
    hub.set_faults({"uplink_rate": size})  # one download alone: about one second

    def download(target):
        hf_hub_download(REPO, "tokenizer.json", endpoint=hub.url, local_dir=str(tmp_path / target), token=False)

    started = time.monotonic()
    download("alone")
    alone = time.monotonic() - started
    started = time.monotonic()
    both = [threading.Thread(target=download, args=(name,)) for name in ("first", "second")]
    for thread in both:
        thread.start()
    for thread in both:
        thread.join()
    together = time.monotonic() - started
    assert 0.9 <= alone < 1.6 and together >= 1.9, (alone, together)
    with pytest.raises(ValueError, match="uplink_rate"):
        hub.set_faults({"uplink_rate": 0})


# -- fault control --------------------------------------------------------------------------------

def test_admin_endpoint_changes_faults_while_serving(hub, tmp_path):
    plan = {"repos": {REPO: {"files": {"*.json": {"status": 503}}}}}
    request = urllib.request.Request(f"{hub.url}/_fixture/faults", data=json.dumps(plan).encode(), method="POST")
    with urllib.request.urlopen(request) as response:
        assert json.load(response) == plan
    with pytest.raises(HfHubHTTPError, match="503"):
        get_hf_file_metadata(hf_hub_url(REPO, "config.json", endpoint=hub.url), token=False)
    bad = urllib.request.Request(f"{hub.url}/_fixture/faults", data=b'{"repos": {"x/y": {"typo": 1}}}',
                                 method="POST")
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(bad)
    assert error.value.code == 400
    with urllib.request.urlopen(f"{hub.url}/_fixture/faults") as response:
        assert json.load(response) == plan  # a rejected plan leaves the old one in force
    urllib.request.urlopen(urllib.request.Request(f"{hub.url}/_fixture/faults", data=b"{}", method="POST"))
    assert hf_hub_download(REPO, "config.json", endpoint=hub.url, cache_dir=str(tmp_path), token=False)
    with urllib.request.urlopen(f"{hub.url}/_fixture/requests") as response:
        statuses = [e["status"] for e in json.load(response) if e.get("file") == "config.json"]
    assert 503 in statuses and statuses[-1] == 200


def test_faults_file_is_reread_when_it_changes(hub_root, tmp_path):
    faults_file = tmp_path / "faults.json"
    with localhub.LocalHub(str(hub_root), faults_file=str(faults_file)) as hub:
        assert hf_hub_download(REPO, "config.json", endpoint=hub.url, cache_dir=str(tmp_path / "c1"), token=False)
        faults_file.write_text(json.dumps({"repos": {REPO: {"files": {"config.json": {"status": 500}}}}}))
        with pytest.raises(HfHubHTTPError, match="500"):
            get_hf_file_metadata(hf_hub_url(REPO, "config.json", endpoint=hub.url), token=False)
        faults_file.unlink()
        assert hf_hub_download(REPO, "config.json", endpoint=hub.url, cache_dir=str(tmp_path / "c3"), token=False)


def test_cli_server_with_hf_endpoint_in_a_fresh_process(hub_root, tmp_path):
    server = subprocess.Popen([sys.executable, SERVER_PY, "--root", str(hub_root), "--port", "0", "--quiet"],
                              stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:")
        client = ("import sys; from huggingface_hub import snapshot_download; "
                  "print(snapshot_download('llmfleet/tiny-llama-b', local_dir=sys.argv[1]))")
        env = dict(os.environ, HF_ENDPOINT=url, HF_HOME=str(tmp_path / "hf_home"), HF_HUB_DISABLE_PROGRESS_BARS="1")
        result = subprocess.run([sys.executable, "-c", client, str(tmp_path / "b")], env=env, check=False,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert tree_digest(tmp_path / "b") == tree_digest(hub_root / "llmfleet" / "tiny-llama-b")
    finally:
        server.terminate()
        server.wait(timeout=10)
