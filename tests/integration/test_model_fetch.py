"""roles/model_fetch run by real ansible-playbook against a real systemd test host.

The hub is tools/localhub (in-process, on 127.0.0.1, which the nspawn host shares), serving the
generated tiny models; the download is done by the real huggingface_hub client inside the venv the
role installs on the test host. Faults (corrupt byte, dropped connection, gated repo) come from the
fixture's fault plan and are checked through its request log.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools", "localhub"))
# pylint: disable=wrong-import-position
from server import LocalHub  # noqa: E402

TESTBED = os.path.join(REPO, "tools", "testbed", "testbed.sh")
STATE = os.environ.get("TESTBED_STATE", "/var/lib/llmfleet-testbed")
ANSIBLE_PLAYBOOK = os.path.join(REPO, ".venv", "bin", "ansible-playbook")
MACHINE, SSH_PORT = "mf-itest", "2252"
REPO_A = "llmfleet-test/tiny-llama-a"
SHARD2, SHARD3 = "model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors"
TOKEN = "hf_llmfleetSECRET0123456789abcdef"

PLAYBOOK = """
- name: Fetch a model
  hosts: testhost
  gather_facts: false
  tasks:
    - name: Run the role
      ansible.builtin.include_role:
        name: llmfleet.vllm.model_fetch
    - name: Hand the result back to the test
      ansible.builtin.copy:
        content: "{{ model_fetch_result | to_json }}"
        dest: "{{ result_file }}"
        mode: "0600"
      delegate_to: localhost
      check_mode: false
      changed_when: false
"""


class Run:
    def __init__(self, proc, result_file):
        self.rc, self.out = proc.returncode, " ".join((proc.stdout + proc.stderr).split())
        self.result = json.load(open(result_file)) if os.path.exists(result_file) else None
        recap = re.search(r"testhost\s*:\s*ok=(\d+)\s+changed=(\d+)", self.out)
        self.changed = int(recap.group(2)) if recap else None

    def __repr__(self):
        return "rc=%s changed=%s\n%s" % (self.rc, self.changed, self.out[-6000:])


@pytest.fixture(scope="module")
def hub(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("hub")
    for name in ("tiny-llama-a", "tiny-llama-b"):
        shutil.copytree(os.path.join(tiny_models, name), root / "llmfleet-test" / name)
    with LocalHub(str(root)) as server:
        yield server


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    subprocess.run([TESTBED, "up", MACHINE, SSH_PORT], check=True, capture_output=True)
    try:
        yield MACHINE
    finally:
        subprocess.run([TESTBED, "down", MACHINE], check=False, capture_output=True)


def sh(cmd, check=True):
    return subprocess.run([TESTBED, "ssh", MACHINE, cmd], check=check, capture_output=True, text=True)


@pytest.fixture(scope="module")
def play(host, hub, tmp_path_factory):
    work = tmp_path_factory.mktemp("play")
    key = subprocess.run([TESTBED, "key"], check=True, capture_output=True, text=True).stdout.strip()
    (work / "inventory.yml").write_text(json.dumps({"all": {"hosts": {"testhost": {
        "ansible_host": "127.0.0.1", "ansible_port": int(SSH_PORT), "ansible_user": "root",
        "ansible_ssh_private_key_file": key, "ansible_python_interpreter": "/usr/bin/python3"}}}}))
    (work / "playbook.yml").write_text(PLAYBOOK)

    def run(extra, verbosity=0, check_mode=False, cli=()):
        result_file = str(work / ("result-%s.json" % uuid.uuid4().hex))
        variables = {"model_fetch_hf_endpoint": hub.url, "model_fetch_space_margin_gb": 0,
                     "model_fetch_poll_s": 1, "model_fetch_progress_interval_s": 2, "result_file": result_file}
        variables.update(extra)
        vars_file = work / ("vars-%s.json" % uuid.uuid4().hex)
        vars_file.write_text(json.dumps(variables))
        argv = [ANSIBLE_PLAYBOOK, "-i", str(work / "inventory.yml"), str(work / "playbook.yml"), "-e", "@%s" % vars_file]
        if verbosity:
            argv.append("-" + "v" * verbosity)
        if check_mode:
            argv.append("--check")
        for key_value in cli:  # -e key=value: Ansible passes every such value as a string
            argv += ["-e", key_value]
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
                   ANSIBLE_NOCOLOR="1")
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=900, check=False)
        return Run(proc, result_file)

    # Install the venv once, so that later runs show only what the download itself changes.
    warm = run({"model_fetch_name": "warm-up", "model_fetch_repo_id": "llmfleet-test/tiny-llama-b",
                "model_fetch_models_root": "/srv/warm"})
    assert warm.rc == 0, warm
    return run


def model_a(root, **extra):
    return dict({"model_fetch_name": "tiny-llama-a", "model_fetch_repo_id": REPO_A,
                 "model_fetch_allow_patterns": ["*.json", "*.safetensors"], "model_fetch_models_root": root}, **extra)


def resolve_gets(hub, path=None):
    return [e for e in hub.requests() if e["method"] == "GET" and "/resolve/" in e["path"]
            and (path is None or e.get("file") == path)]


@pytest.fixture(autouse=True)
def clean_hub(hub):
    hub.set_faults({})
    hub.clear_requests()
    yield
    hub.set_faults({})


def test_download_idempotent_and_progress(play, hub):
    # Slow every shard down so that the role has progress to report while it waits.
    hub.set_faults({"repos": {REPO_A: {"files": {"*.safetensors": {"rate": 300000}}}}})
    first = play(model_a("/srv/t-basic"))
    assert first.rc == 0, first
    assert first.result["bytes_downloaded"] == first.result["bytes_total"] > 6_000_000
    assert first.result["verified"] is True and first.result["verify_mode"] == "full"
    assert len(first.result["files_downloaded"]) == 10
    assert re.search(r"tiny-llama-a: [0-9.]+ of 0\.00\d GB \([0-9.]+%\), \d+/10 files", first.out), first
    hub.clear_requests()
    second = play(model_a("/srv/t-basic"))
    assert second.rc == 0 and second.changed == 0, second
    assert second.result["bytes_downloaded"] == 0 and second.result["verified"] is True
    assert resolve_gets(hub) == [] and second.result["set_aside"] == []
    # Issue 43 item 1: a file the commit does not have (a chat template a loader would take by its presence) is moved
    # to .cache/llmfleet/extra/ and said; the directory then holds exactly the manifest's files, and a re-run is quiet.
    sh("echo '{{ 1 }}' > /srv/t-basic/tiny-llama-a/chat_template.jinja")
    third = play(model_a("/srv/t-basic"))
    assert third.rc == 0 and third.result["set_aside"] == ["chat_template.jinja"], third
    assert sh("cat /srv/t-basic/tiny-llama-a/.cache/llmfleet/extra/chat_template.jinja; "
              "test -e /srv/t-basic/tiny-llama-a/chat_template.jinja || echo gone").stdout.split() == ["{{", "1", "}}", "gone"]
    fourth = play(model_a("/srv/t-basic"))
    assert fourth.rc == 0 and fourth.changed == 0 and fourth.result["set_aside"] == [], fourth
    # Issue #27 item 11: a hub that cannot be reached (a port nothing listens on) is said to be unreachable, naming the
    # endpoint, the error and the commit the host holds - not reported as an unknown revision.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = "http://127.0.0.1:%d" % sock.getsockname()[1]
    down = play(model_a("/srv/t-basic", model_fetch_hf_endpoint=closed))
    assert down.rc != 0 and down.changed == 0, down
    assert "the hub at %s could not be reached to resolve revision" % closed in down.out, down
    assert "main" in down.out and "of %s (ConnectError: " % REPO_A in down.out, down
    assert "Connection refused" in down.out and "is not a branch" not in down.out, down
    assert "holds commit %s in /srv/t-basic/tiny-llama-a" % first.result["revision"] in down.out, down


def test_check_mode_reports_without_downloading(play, hub):
    run = play(model_a("/srv/t-check"), check_mode=True)
    assert run.rc == 0, run
    assert run.result["bytes_to_download"] == run.result["bytes_total"] > 6_000_000
    assert SHARD2 in run.result["files_to_download"] and run.result["bytes_downloaded"] == 0
    assert resolve_gets(hub) == []
    assert sh("test -e /srv/t-check", check=False).returncode != 0


def test_corrupt_file_fails_verification_naming_shard(play, hub):
    hub.set_faults({"repos": {REPO_A: {"files": {SHARD2: {"corrupt": True}}}}})
    run = play(model_a("/srv/t-corrupt"))
    assert run.rc != 0, run
    failed = run.out[run.out.index("TASK [llmfleet.vllm.model_fetch : Run shard_verify]"):]
    assert "fatal:" in failed and SHARD2 in failed, run
    assert "hash" in failed.split("fatal:", 1)[1]
    # Fetched once more in the same run (the hub still serves it corrupt), then the run fails.
    assert len([e for e in hub.requests() if "corrupt" in e["faults"]]) == 2, hub.requests()
    assert "failed verification twice" in run.out, run
    # The bad shard is moved aside (not deleted) so that the next run fetches it again.
    assert "the next download fetches them again" in run.out, run
    assert SHARD2 in sh("ls /srv/t-corrupt/tiny-llama-a/.cache/llmfleet/quarantine/").stdout


def test_shard_corrupted_on_disk_heals_in_one_run(play, hub):
    first = play(model_a("/srv/t-heal"))
    assert first.rc == 0, first
    shard = "/srv/t-heal/tiny-llama-a/" + SHARD2
    good = sh("sha256sum " + shard).stdout.split()[0]
    sh("printf 'X' | dd of=%s bs=1 seek=1000 conv=notrunc status=none" % shard)
    hub.clear_requests()
    healed = play(model_a("/srv/t-heal"))
    assert healed.rc == 0, healed
    assert healed.result["healed"] == [SHARD2] and healed.result["verified"] is True
    assert {e["file"] for e in resolve_gets(hub)} == {SHARD2}, hub.requests()
    assert sh("sha256sum " + shard).stdout.split()[0] == good
    # The damaged copy is kept, not deleted.
    assert SHARD2 in sh("ls /srv/t-heal/tiny-llama-a/.cache/llmfleet/quarantine/").stdout


def test_catalog_patch_applied_original_kept_rerun_unchanged(play, hub):
    patches = [{"name": "drop-use-cache", "applies_to": "model", "target": "config.json", "delete_keys": ["use_cache"],
                "description": "test patch"},
               {"name": "absent-file", "applies_to": "model", "target": "hf_quant_config.json",
                "delete_keys": ["quantization.kv_cache_quant_algo"], "description": "file not in this repo"}]
    entry = {"name": "tiny-llama-a", "repo": REPO_A, "revision": "main", "patches": patches,
             "allow_patterns": ["*.json", "*.safetensors"]}
    first = play({"model_fetch_model": entry, "model_fetch_models_root": "/srv/t-patch"})
    assert first.rc == 0, first
    assert first.result["patched"] == ["config.json"], first.result
    config = json.loads(sh("cat /srv/t-patch/tiny-llama-a/config.json").stdout)
    original = json.loads(sh("cat /srv/t-patch/tiny-llama-a/.cache/llmfleet/originals/config.json").stdout)
    assert "use_cache" not in config and original["use_cache"] is True
    record = json.loads(sh("cat /srv/t-patch/tiny-llama-a/.cache/llmfleet/patches.json").stdout)["files"]
    assert record["config.json"]["patches"] == ["drop-use-cache"]
    hub.clear_requests()
    # Verification (full, hashing config.json against the hub) passes, nothing is fetched or patched again.
    again = play({"model_fetch_model": entry, "model_fetch_models_root": "/srv/t-patch"})
    assert again.rc == 0 and again.changed == 0, again
    assert again.result["verified"] is True and resolve_gets(hub) == []


@pytest.mark.parametrize("cli, effect", [
    (["model_fetch_offline=true"], "offline"),
    (["model_fetch_offline=false", "model_fetch_max_workers=1", "model_fetch_poll_s=1",
      "model_fetch_progress_interval_s=1", "model_fetch_timeout_s=600", "model_fetch_space_margin_gb=0.5"], "online"),
    (["model_fetch_space_margin_gb=10000000"], "refused"),
])
def test_cli_strings_behave_as_typed(play, hub, cli, effect):
    """-e key=value hands the role strings: "false" must be false, "1" a number."""
    assert play(model_a("/srv/t-cli")).rc == 0  # the model is there, with its manifest
    hub.clear_requests()
    # Refused: a root without the model (nothing left to download needs no free space).
    run = play(model_a("/srv/t-cli-empty" if effect == "refused" else "/srv/t-cli"), cli=cli)
    api_calls = [e for e in hub.requests() if "/api/models/" in e["path"]]
    if effect == "offline":
        assert run.rc == 0 and run.result["offline"] is True and hub.requests() == [], run
    elif effect == "online":
        assert run.rc == 0 and run.result["offline"] is False and api_calls, run
    else:
        assert run.rc != 0 and "not enough disk space" in run.out, run


def test_dropped_download_fails_then_resumes_without_refetching(play, hub):
    # Every GET of shard 3 breaks after 600 kB: huggingface_hub retries (from 0: its resume granularity is
    # 10 MiB, see test_model_fetch_module.py) and gives up; the other files complete.
    hub.set_faults({"repos": {REPO_A: {"files": {SHARD3: {"drop_at": 600000}}}}})
    first = play(model_a("/srv/t-resume", model_fetch_max_workers=2))
    assert first.rc != 0, first
    assert re.search(r"1 file\(s\) not complete: %s: \w+" % re.escape(SHARD3), first.out), first
    dropped = resolve_gets(hub, SHARD3)
    assert len(dropped) >= 2 and all("drop" in e["faults"] for e in dropped), dropped
    done_first = {e["file"] for e in resolve_gets(hub) if e["status"] == 200 and "drop" not in e["faults"]}
    assert {SHARD2, "config.json"} <= done_first
    assert sh("test -f /srv/t-resume/tiny-llama-a/%s" % SHARD2).returncode == 0
    assert sh("test -e /srv/t-resume/tiny-llama-a/%s" % SHARD3, check=False).returncode != 0

    hub.set_faults({})
    hub.clear_requests()
    second = play(model_a("/srv/t-resume", model_fetch_max_workers=2))
    assert second.rc == 0, second
    assert {e["file"] for e in resolve_gets(hub)} == {SHARD3}, hub.requests()
    assert second.result["files_downloaded"] == [SHARD3]
    assert second.result["verified"] is True


def test_disk_too_small_fails_before_any_change(play, hub):
    sh("mkdir -p /srv/t-disk/old-model && head -c 3000000 /dev/urandom > /srv/t-disk/old-model/w.safetensors")
    before = sh("find /srv/t-disk | sort").stdout
    run = play(model_a("/srv/t-disk", model_fetch_space_margin_gb=10_000_000))
    assert run.rc != 0, run
    assert run.changed == 0, run
    match = re.search(r"not enough disk space for /srv/t-disk/tiny-llama-a: ([0-9.]+) GB missing", run.out)
    assert match and float(match.group(1)) > 9_000_000, run
    assert "/srv/t-disk/old-model (0.003 GB)" in run.out
    assert "Nothing was changed" in run.out
    assert sh("find /srv/t-disk | sort").stdout == before
    assert resolve_gets(hub) == []


def test_token_required_and_never_shown(play, hub):
    hub.set_faults({"repos": {REPO_A: {"token": TOKEN}}})
    without = play(model_a("/srv/t-token"), verbosity=3)
    assert without.rc != 0, without
    assert re.search(r"401|GatedRepo|restricted", without.out), without

    sh("install -d -m 0700 /etc/llmfleet && printf '%s\\n' '" + TOKEN + "' > /etc/llmfleet/hf_token && chmod 0644 /etc/llmfleet/hf_token")
    loose = play(model_a("/srv/t-token", model_fetch_hf_token_file="/etc/llmfleet/hf_token"), verbosity=3)
    assert loose.rc != 0 and "mode 0644" in loose.out, loose
    sh("chmod 0600 /etc/llmfleet/hf_token")
    from_file = play(model_a("/srv/t-token", model_fetch_hf_token_file="/etc/llmfleet/hf_token"), verbosity=3)
    assert from_file.rc == 0, from_file
    assert from_file.result["verified"] is True

    sh("rm -rf /srv/t-token2")
    with_var = play(model_a("/srv/t-token2", model_fetch_hf_token=TOKEN), verbosity=3)
    assert with_var.rc == 0, with_var
    assert all(e["authorization"] for e in resolve_gets(hub))
    for run in (without, loose, from_file, with_var):
        assert TOKEN not in run.out
        assert TOKEN[3:] not in run.out
    # The async wrapper removes its module copy (which carries the no_log args, as for any Ansible
    # module) only after the job's last poll: give it a moment, then nothing may be left anywhere.
    for _attempt in range(30):
        leftovers = sh("grep -rl '%s' /root/.ansible /root/.ansible_async /tmp /srv 2>/dev/null || true" % TOKEN[3:]).stdout
        if not leftovers.strip():
            break
        time.sleep(1)
    assert leftovers.strip() == ""


@pytest.mark.parametrize("extra, names", [
    ({"model_fetch_verify_mode": "paranoid"}, "model_fetch_verify_mode"),
    ({"model_fetch_repo_id": "not a repo id"}, "model_fetch_repo_id"),
    ({"model_fetch_space_margin_gb": "plenty"}, "model_fetch_space_margin_gb"),
    ({"model_fetch_allow_patterns": "*.json"}, "model_fetch_allow_patterns"),
    ({"model_fetch_name": "Bad Name!"}, "model_fetch_name"),
])
def test_bad_variables_are_named(play, extra, names):
    run = play(model_a("/srv/t-bad", **extra))
    assert run.rc != 0, run
    assert names in run.out, run
    assert run.changed == 0, run
