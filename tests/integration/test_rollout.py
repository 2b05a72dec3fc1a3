"""Fleet rollout (playbooks/rollout.yml) on three real systemd test hosts with vLLM's CPU engine.

The hosts share the build machine's network namespace, so each host serves the tiny models on its own
ports (per-host `llmfleet_models_extra` overrides of `port`). The tests run in order on one fleet:

1. nothing -> tiny-llama-a on all hosts (canary, then one batch of 2; no previous record: gate skipped)
2. a clean rollout tiny-llama-a -> tiny-llama-b (canary gated on a's recorded tok/s, then a batch of 2)
3. back to tiny-llama-a in batches of 1 with fleet-r2 (second batch) failing its pivot gate: the rollout
   stops, fleet-r2 is rolled back to b, fleet-r3 is never touched (same MainPID), the canary keeps a
4. the same rollout without the fault continues: the canary is a no-op (same MainPID), r2 and r3 pivot
5. back to tiny-llama-a with a canary gate no model can pass: the canary is rolled back, r2/r3 untouched
6. back to tiny-llama-a without canary, batches of 2, rollout_max_fail_percentage=50 and r2 refused by its
   preflight: the first batch is within the budget, so the second (r3) still pivots

A fourth test host, fleet-gw, is the fleet gateway (group llmfleet_gateways: Debian's HAProxy in front of the three
hosts' slot ports). Every host serves the alias `chat` first; during rollouts 3 and 4 an `openai` client sends
requests with it to the fleet gateway the whole time, and no request may fail: each host is drained there before its
pivot and put back after its gate or its rollback.

A tiny model starts in ~20 s alone and a few minutes beside the other test stream; the module took ~25 min in make test.
"""
from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils.peer_seeding import authorized_key_line
from testbed_machines import up_machines

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools", "traffic"))
from continuous_client import ContinuousClient, log_summary  # noqa: E402  pylint: disable=wrong-import-position

sys.path.insert(0, os.path.join(REPO, "tools", "crash"))
import harness  # noqa: E402  pylint: disable=wrong-import-position
TESTBED = os.path.join(REPO, "tools", "testbed", "testbed.sh")
HUB = os.path.join(REPO, "tools", "localhub", "tiny-hub.sh")
HUB_PORT = "18095"
# name -> (ssh port, {model: http port})
HOSTS = {
    "fleet-r1": ("2271", {"tiny-llama-a": 8111, "tiny-llama-b": 8112}),
    "fleet-r2": ("2272", {"tiny-llama-a": 8121, "tiny-llama-b": 8122}),
    "fleet-r3": ("2273", {"tiny-llama-a": 8131, "tiny-llama-b": 8132}),
}
GATEWAY, GATEWAY_SSH_PORT, GATEWAY_PORT, ALIAS = "fleet-gw", "2276", 8190, "chat"
# A fourth host for the seeding test only (the base rootfs: it stages, it serves nothing).
STAGER, STAGER_SSH_PORT = "fleet-r4", "2277"
HUB_URL = f"http://127.0.0.1:{HUB_PORT}"
# From test 3 on, the hosts' new units run the STAND-IN vLLM server (tests/standin/vllm, testbed.sh standin): tests 3-6
# are about the rollout's order, gates and failures; tests 1 and 2 roll out and seed with the real engine.
STANDIN_VENV = "/opt/vllm-standin"
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def image(request) -> str:
    """The vLLM test-bed image; LLMFLEET_TEST_IMAGE names an already cached one (skips a rebuild)."""
    return os.environ.get("LLMFLEET_TEST_IMAGE") or request.getfixturevalue("vllm_image")


def _ssh(host: str, *cmd: str) -> str:
    return subprocess.run([TESTBED, "ssh", host, *cmd], capture_output=True, text=True, check=False).stdout.strip()


def _slot(host: str) -> dict:
    raw = _ssh(host, "cat", "/var/lib/llmfleet/slots.json")
    return json.loads(raw)["slots"].get("default", {}) if raw else {}


def _serving(host: str) -> str:
    return _slot(host).get("model", "")


def _main_pid(host: str, model: str) -> str:
    return _ssh(host, "systemctl", "show", "-P", "MainPID", harness.served_unit({"default": _slot(host)}, model))


def _is_active(host: str, model: str) -> str:
    """active when either unit of the model runs (a new revision starts in the other one)."""
    states = _ssh(host, "systemctl", "is-active", *harness.model_units(model)).split()
    return "active" if "active" in states else states[0]


def _healthy(host: str, model: str) -> bool:
    """The host's slot serves `model` on the slot's port: the port of the model it first served, stable since."""
    slot = _slot(host)
    assert slot.get("port") == HOSTS[host][1]["tiny-llama-a"], slot
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{slot['port']}/v1/models", timeout=5) as resp:
            return resp.status == 200 and [card["id"] for card in json.load(resp)["data"]] == [ALIAS, model]
    except OSError:
        return False


def _write_inventory(inv, results, faulty: str | None = None, fault: str = "gate", stager: bool = False,
                     standin: bool = False, remote_code: bool = False) -> None:
    # Host vars: they win over inventory/testbed/group_vars/all (which points at another hub).
    lines = ["all:", "  hosts:"]
    hosts = {**HOSTS, STAGER: (STAGER_SSH_PORT, HOSTS["fleet-r3"][1])} if stager else HOSTS
    for host, (ssh_port, ports) in hosts.items():
        extra = {m: {"port": p, "serving": {"enforce_eager": True}} for m, p in ports.items()}
        if remote_code:  # tiny-llama-b as a model that runs its repo's code (issue 43 item 4)
            extra["tiny-llama-b"]["serving"]["trust_remote_code"] = True
        if host == faulty and fault == "parity":
            # One numeric setting differs on this host (a much larger RMSNorm epsilon): it serves, passes its throughput
            # gate, and answers unlike the canary.
            extra["tiny-llama-b"]["serving"]["extra_args"] = ["--hf-overrides", '{"rms_norm_eps": 0.5}']
        lines += [f"    {host}:", f"      ansible_port: {ssh_port}", f"      llmfleet_models_extra: {json.dumps(extra)}",
                  f"      model_fetch_hf_endpoint: http://127.0.0.1:{HUB_PORT}", "      pivot_benchmark: false",
                  f"      pivot_controller_results_dir: {results}", f"      pivot_alias: {ALIAS}"]
        if standin:
            lines.append(f"      vllm_install_venv: {STANDIN_VENV}")
        if host == faulty and fault == "gate":
            # The pivot gate can never pass: the pivot role rolls this host back.
            lines.append("      pivot_gate_min_output_tok_s: 1.0e9")
        elif host == faulty and fault == "preflight":
            # The preflight refuses (no such unit to take over): the host fails before anything stops.
            lines.append("      pivot_adopt_unit: vllm-not-here.service")
    lines += ["  children:", "    llmfleet_gateways:", "      hosts:", f"        {GATEWAY}:",
              f"          ansible_port: {GATEWAY_SSH_PORT}", f"          gateway_port: {GATEWAY_PORT}"]
    (inv / "hosts.yml").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, image):
    inv = tmp_path_factory.mktemp("rollout-inventory")
    # ROLLOUT_TEST_RESULTS: keep the controller records in a known folder (e.g. to re-run tests 3-4 on a fleet
    # left up by an interrupted run).
    results = pathlib.Path(os.environ["ROLLOUT_TEST_RESULTS"]) if os.environ.get("ROLLOUT_TEST_RESULTS") \
        else tmp_path_factory.mktemp("rollout-results")
    os.symlink(os.path.join(REPO, "inventory", "testbed", "group_vars"), inv / "group_vars")
    _write_inventory(inv, results)

    class Fleet:
        def __init__(self):
            self.inv, self.results, self.standin = inv, results, False

        def set_fault(self, host: str | None, fault: str = "gate", stager: bool = False, remote_code: bool = False) -> None:
            _write_inventory(inv, results, host, fault, stager, self.standin, remote_code)

        def use_standin(self) -> None:
            self.standin = True
            self.set_fault(None)

        def rollout(self, name: str, *extra: str) -> subprocess.CompletedProcess:
            env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
            start = time.monotonic()
            result = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", str(inv),
                                     os.path.join(REPO, "playbooks", "rollout.yml"), *extra],
                                    capture_output=True, text=True, env=env, cwd=REPO, check=False)
            TIMINGS[name] = round(time.monotonic() - start, 1)
            (results / f"{name}.log").write_text(result.stdout + result.stderr)
            return result

        def report(self, model: str) -> str:
            return (results / f"fleet-{model}.md").read_text()

    subprocess.run([HUB, "start", HUB_PORT], check=True)
    try:
        up_machines([(host, ssh_port, image) for host, (ssh_port, _port) in HOSTS.items()]
                    + [(GATEWAY, GATEWAY_SSH_PORT), (STAGER, STAGER_SSH_PORT)])
        for host in HOSTS:
            subprocess.run([TESTBED, "standin", host], check=True, capture_output=True)
        yield Fleet()
    finally:
        print(f"\nrollout timings (s): {TIMINGS}; logs and reports under {results}")
        for host in [*HOSTS, GATEWAY, STAGER]:
            subprocess.run([TESTBED, "down", host], check=False, capture_output=True)
        subprocess.run([HUB, "stop", HUB_PORT], check=False)


def _tail(result: subprocess.CompletedProcess) -> str:
    return (result.stdout + result.stderr)[-6000:]


def _fleet_client(timeout_s: float = 60) -> ContinuousClient:
    """Requests to the fleet gateway with the alias every host serves, paced so that the CPU stays with the pivots."""
    return ContinuousClient(f"http://127.0.0.1:{GATEWAY_PORT}/v1", ALIAS, interval_s=1.0, max_seconds=2400,
                            timeout_s=timeout_s)


def _fleet_hold_lines(since: float) -> list[str]:
    """The fleet gateway's hold verdicts since `since` (its own log lines: roles/gateway/files/llmfleet-hold.lua)."""
    out = _ssh(GATEWAY, f"journalctl -t haproxy -o cat --no-pager -q --since=@{int(since)} | grep '^llmfleet-hold slot=fleet '")
    return out.splitlines()


def _fleet_runtime(command: str) -> str:
    """A command to the fleet gateway's HAProxy runtime API."""
    script = ("import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect('/run/haproxy-llmfleet.sock'); "
              "s.sendall(sys.argv[1].encode() + b'\\n'); print(s.makefile().read())")
    return _ssh(GATEWAY, "python3", "-c", shlex.quote(script), shlex.quote(command))


def _drained_before_stopped(out: str, host: str) -> bool:
    """The rollout set `host`'s server at the fleet gateway (HAProxy's runtime API, a task delegated there) before the
    pivot stopped its model - the drain - and again after - the enable."""
    def after(banner: str, result: str) -> list[int]:
        return [m.end() for m in re.finditer(r"^TASK \[%s.*\n(?:(?!TASK \[).*\n)*?%s" % (banner, result), out, re.M)]
    at_gateway = after(r"llmfleet\.vllm\.gateway : Set a server's state at the gateway", r"changed: \[%s -> %s" % (host, GATEWAY))
    stops = after(r"llmfleet\.vllm\.service_deploy : Hand over from the old model \(stop it", r"changed: \[%s\]" % host)
    return len(stops) == 1 and len(at_gateway) == 2 and at_gateway[0] < stops[0] < at_gateway[1]


def _hub(method: str, path: str, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{HUB_URL}{path}", data=data, method=method)
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.load(resp) if method == "GET" else None


def _file_bodies_served(model: str) -> dict[str, int]:
    """{file: times the local hub sent its body} for the model's repo, from the hub's request log."""
    counts: dict[str, int] = {}
    for entry in _hub("GET", "/_fixture/requests"):
        if entry.get("repo") == f"llmfleet-test/{model}" and entry.get("file") and entry["method"] == "GET" \
                and entry["bytes_sent"] > 0:
            counts[entry["file"]] = counts.get(entry["file"], 0) + 1
    return counts


def _hub_files(model: str) -> list[str]:
    return sorted(s["rfilename"] for s in _hub("GET", f"/api/models/llmfleet-test/{model}?blobs=true")["siblings"])


def _seed_access_left(host: str) -> str:
    """What a seeding leaves of its access on a host: authorized_keys lines and per-run key directories."""
    return _ssh(host, "grep -v '^#' /var/lib/llmfleet-seed/.ssh/authorized_keys 2>/dev/null; "
                      "ls -A /run/llmfleet-seed 2>/dev/null")


def _staged(report: str, host: str) -> str:
    line = [row for row in report.splitlines() if row.startswith(f"| {host} |") and "MB" in row]
    assert len(line) == 1, report
    return line[0]


def test_1_first_rollout_from_nothing(fleet):
    _hub("DELETE", "/_fixture/requests")
    result = fleet.rollout("1-initial-a", "-e", "model=tiny-llama-a", "-e", "rollout_batch_size=2")
    assert result.returncode == 0, _tail(result)
    for host in HOSTS:
        assert _serving(host) == "tiny-llama-a" and _healthy(host, "tiny-llama-a"), host
    report = fleet.report("tiny-llama-a")
    assert "3/3 hosts serve tiny-llama-a" in report, report
    # Pre-stage ran on every host before the first switch.
    out = result.stdout
    assert out.index("Download once, then copy host to host over the LAN, while the old model keeps serving: tiny-llama-a") \
        < out.index("Hand over from the old model")
    # Downloaded once for the fleet: the hub sent each file of the commit once; the other hosts copied from peers.
    assert _file_bodies_served("tiny-llama-a") == {name: 1 for name in _hub_files("tiny-llama-a")}, _tail(result)
    assert "| hub |" in _staged(report, "fleet-r1"), report
    for host in ("fleet-r2", "fleet-r3"):
        assert "| peers |" in _staged(report, host) and "from fleet-r" in _staged(report, host), report
    assert "From the hub: " in report and "from peers over the LAN: 0.0 MB" not in report, report
    for host in HOSTS:
        assert _seed_access_left(host) == "", host
    lock = json.loads((fleet.results / "locks" / "tiny-llama-a.json").read_text())
    assert sorted(f["path"] for f in lock["manifest"]["files"]) == _hub_files("tiny-llama-a"), lock
    # Issue 45 item 2: what the canary's vLLM cached for its start (its JIT caches) went to the fleet with their manifest
    # in the lock; the batch's hosts were given them before their starts, checked file by file against it.
    jit = lock["jit_cache"]
    assert jit["files"] and jit["key"]["device"] == "cpu" and (fleet.results / "locks" / "tiny-llama-a.jit.tar").is_file(), jit
    canary = _pivot_record(fleet, "fleet-r1", "tiny-llama-a")["jit_cache"]
    assert "seeded" not in canary and canary["recorded"]["key_id"] == jit["key_id"], canary
    for host in ("fleet-r2", "fleet-r3"):
        record = _pivot_record(fleet, host, "tiny-llama-a")["jit_cache"]
        assert record["seeded"]["seeded"] and record["seeded"]["files"] == len(jit["files"]), (host, record)
        # Verified first: a host that never served has nothing of its own; the copy was of its key.
        assert (record["verified"]["files"], record["verified"]["problems"]) == (0, []), (host, record)
        assert record["seeded"]["key_matches"] and record["seeded"]["unit_key_id"] == jit["key_id"], (host, record)
        here = json.loads(_ssh(host, "cat", "/var/cache/llmfleet-vllm/llmfleet-jit-manifest.json"))
        assert here["key_id"] == jit["key_id"] and set(jit["files"]) <= set(here["files"]), (host, here)
    assert out.count("JIT caches: seeded from the fleet's copy (%d files)" % len(jit["files"])) == 2, _tail(result)


def _pivot_record(fleet, host: str, model: str) -> dict:
    return json.loads((fleet.results / host / "pivots" / f"{model}-latest.json").read_text())


def _sender_pid(host: str) -> str:
    """The rsync sending a model to a peer on `host` (rrsync's rsync --server --sender), or ''. (A receiving host's ssh
    client has that command in its arguments too: the pattern is anchored.)"""
    return subprocess.run([TESTBED, "exec", host, "pgrep", "-f", "-o", "^(/usr/bin/)?rsync --server --sender"],
                          capture_output=True, text=True, check=False).stdout.strip()


class SeedingFaults(threading.Thread):
    """While the stage-only rollout runs: once a host other than the seeder sends to a peer (round 2), flip one byte of
    the last file it sends in its own verified copy (a peer with a flipped byte), and a second later kill the seeder's
    sender, busy with another host of the same round (a peer dying mid-copy)."""

    def __init__(self, seeder: str, hosts: list[str], last_file: str):
        super().__init__(daemon=True)
        self.seeder, self.hosts, self.last_file = seeder, hosts, last_file
        self.flipped_on, self.flipped, self.killed = "", "", ""
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.1) and not self.flipped_on:
            self.flipped_on = next((h for h in self.hosts if h != self.seeder and _sender_pid(h)), "")
        if self.stop.is_set():
            return
        flip = ("import glob; p = glob.glob('/srv/models/tiny-llama-b*/%s')[0]; f = open(p, 'r+b'); f.seek(10); "
                "b = f.read(1); f.seek(10); f.write(bytes([b[0] ^ 1])); f.close(); print(p)" % self.last_file)
        done = subprocess.run([TESTBED, "exec", self.flipped_on, "python3", "-c", flip], capture_output=True, text=True,
                              check=False)
        self.flipped = done.stdout.strip() or done.stderr.strip()[-300:]
        time.sleep(1.0)
        pid = _sender_pid(self.seeder)
        if pid:
            subprocess.run([TESTBED, "exec", self.seeder, "kill", "-9", pid], check=False)
            self.killed = pid


def test_2_stage_only_seeds_four_hosts_from_one_download_through_a_kill_and_a_flipped_byte(fleet):
    """Stage tiny-llama-b on four hosts (-e rollout_stage_only=true) behind a hub throttled to 1 MB/s for the whole
    site, each copy capped at 1 MB/s: fleet-r1 downloads, fleet-r2 copies from it; in the second round fleet-r2 sends a
    flipped byte and fleet-r1 dies mid-copy. Every host ends verified, and the hub sent each file once."""
    files, hosts = _hub_files("tiny-llama-b"), [*HOSTS, STAGER]
    _hub("DELETE", "/_fixture/requests")
    # Here tiny-llama-b runs its repo's code (issue 43 item 4): its branch is refused before anything, naming the commit,
    # until a run accepts that commit, which the revision lock keeps.
    commit = _hub("GET", "/api/models/llmfleet-test/tiny-llama-b")["sha"]
    fleet.set_fault(None, stager=True, remote_code=True)
    refused = fleet.rollout("2-remote-code-refused", "-e", "model=tiny-llama-b", "-e", "rollout_stage_only=true")
    assert refused.returncode != 0, _tail(refused)
    assert ('tiny-llama-b runs the Python code of its repo (trust_remote_code), and revision "main" is not a full commit (a'
            ' branch, a tag or a short commit) and can move to code nobody reviewed (now commit %s). Review that commit\'s'
            ' code, then pin it: -e revision=%s, or accept it for the fleet (kept in the revision lock) with'
            ' -e accept_remote_code=%s. Nothing was changed.'
            % (commit, commit, commit)) in refused.stdout, _tail(refused)
    assert not (fleet.results / "locks" / "tiny-llama-b.json").exists()
    _hub("POST", "/_fixture/faults", {"uplink_rate": 1_000_000})
    faults = SeedingFaults("fleet-r1", hosts, files[-1])
    faults.start()
    try:
        result = fleet.rollout("2-stage-b-seeded", "-e", "model=tiny-llama-b", "-e", "rollout_stage_only=true",
                               "-e", "model_seed_bwlimit_mb_s=1", "-e", f"accept_remote_code={commit}")
    finally:
        faults.stop.set()
        faults.join()
        _hub("POST", "/_fixture/faults", {})
        fleet.set_fault(None)
    print(f"seeding faults: flipped {faults.flipped} on {faults.flipped_on}, killed sender pid {faults.killed}")
    assert result.returncode == 0, _tail(result)
    assert faults.flipped.startswith("/srv/models/") and faults.killed, (faults.flipped, faults.killed, _tail(result))
    report = fleet.report("tiny-llama-b")
    print(report)
    # The hub sent each file of the commit once, for four hosts.
    assert _file_bodies_served("tiny-llama-b") == {name: 1 for name in files}, _tail(result)
    lock = json.loads((fleet.results / "locks" / "tiny-llama-b.json").read_text())
    assert (lock["commit"], lock["revision"], lock["remote_code_accepted"]) == (commit, "main", commit), lock
    size_mb = sum(f["size"] for f in lock["manifest"]["files"]) / 1e6
    assert f"From the hub: {size_mb:.1f} MB;" in report, report
    expected = {f["path"]: f["sha256"] for f in lock["manifest"]["files"] if f["sha256"]}
    # Every host ends with the commit's bytes (sha256 read on the host); none serves it: nothing was switched.
    for host in hosts:
        # The slot's directory of b at that commit (host_slots names it; here the unpinned name is free).
        sums = _ssh(host, "cd /srv/models/tiny-llama-b && sha256sum %s" % " ".join(sorted(expected)))
        assert {line.split()[1]: line.split()[0] for line in sums.splitlines()} == expected, (host, sums)
        assert [r for r in report.splitlines() if r.startswith(f"| {host} |")][0].split(" | ")[2] == "staged", report
        assert _serving(host) != "tiny-llama-b" and _seed_access_left(host) == "", host
    # The flipped byte was not passed on: its source was named, and its own copy checked and healed.
    assert re.search(r"sent bad data: %s \(to fleet-r\d\)" % re.escape(files[-1]), _staged(report, faults.flipped_on)), report
    assert _ssh(faults.flipped_on, "ls /srv/models/tiny-llama-b/.cache/llmfleet/quarantine/") == files[-1]
    # The copy the seeder died in went on from another peer, which sent only what had not arrived.
    killed_copy = [r for r in report.splitlines() if "from fleet-r1 in" in r and "failed)" in r]
    assert len(killed_copy) == 1, report
    assert sum(float(mb) for mb in re.findall(r"([\d.]+) MB from fleet-r\d+ in", killed_copy[0])) <= size_mb + 0.2, \
        killed_copy[0]
    assert "| hub |" in _staged(report, "fleet-r1"), report


def _seed_ssh(key: str, *remote: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-i", key, "-p", STAGER_SSH_PORT, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                           "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                           "llmfleet-seed@127.0.0.1", *remote], capture_output=True, text=True, check=False, timeout=30)


def _seed_rsync(key: str, *args: str) -> subprocess.CompletedProcess:
    rsh = (f"ssh -i {key} -p {STAGER_SSH_PORT} -o BatchMode=yes -o IdentitiesOnly=yes -o StrictHostKeyChecking=no "
           "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR")
    return subprocess.run(["rsync", "--rsh", rsh, *args], capture_output=True, text=True, check=False, timeout=30)


def test_2b_a_seeding_key_only_reads_one_directory_from_its_address_until_it_expires(fleet, tmp_path):
    """The authorized_keys options a rollout writes (module_utils/peer_seeding.py), against fleet-r4's real sshd and
    Debian's rrsync: the key reads the model directory and nothing else, not from another address, not after expiry."""
    if not shutil.which("rsync"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "rsync"], check=True, capture_output=True)
    keys = {}
    for name in ("good", "expired", "elsewhere"):
        keys[name] = str(tmp_path / name)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", keys[name]], check=True)
    later = time.strftime("%Y%m%d%H%MZ", time.gmtime(time.time() + 3600))
    earlier = time.strftime("%Y%m%d%H%MZ", time.gmtime(time.time() - 3600))
    pub = {name: pathlib.Path(path + ".pub").read_text() for name, path in keys.items()}
    lines = [authorized_key_line(pub["good"], "/srv/models/tiny-llama-b", "127.0.0.1", later, "good"),
             authorized_key_line(pub["expired"], "/srv/models/tiny-llama-b", "127.0.0.1", earlier, "expired"),
             authorized_key_line(pub["elsewhere"], "/srv/models/tiny-llama-b", "10.9.9.9", later, "elsewhere")]
    assert _ssh(STAGER, "id -u llmfleet-seed") != "", "the staging run created the account"
    subprocess.run([TESTBED, "exec", STAGER, "sh", "-c", "cat > /var/lib/llmfleet-seed/.ssh/authorized_keys"],
                   input="\n".join(lines) + "\n", text=True, check=True)
    try:
        listing = _seed_rsync(keys["good"], "--list-only", "llmfleet-seed@127.0.0.1:/")
        assert listing.returncode == 0 and "tokenizer.json" in listing.stdout, listing
        shell = _seed_ssh(keys["good"], "id")
        assert shell.returncode != 0 and "uid=" not in shell.stdout, shell
        outside = _seed_rsync(keys["good"], "--list-only", "llmfleet-seed@127.0.0.1:/../../../etc/")
        assert "passwd" not in outside.stdout, outside
        (tmp_path / "upload").write_text("x")
        push = _seed_rsync(keys["good"], str(tmp_path / "upload"), "llmfleet-seed@127.0.0.1:/")
        assert push.returncode != 0 and _ssh(STAGER, "ls /srv/models/tiny-llama-b/upload 2>&1") != "/srv/models/tiny-llama-b/upload", push
        for name in ("expired", "elsewhere"):
            refused = _seed_rsync(keys[name], "--list-only", "llmfleet-seed@127.0.0.1:/")
            # rsync exits 255 or 12 (its stream closed) when ssh is refused, which of the two varies from run to run.
            assert refused.returncode in (12, 255) and "Permission denied" in refused.stderr, (name, refused)
            assert "tokenizer.json" not in refused.stdout, (name, refused)
    finally:
        _ssh(STAGER, "rm -f /var/lib/llmfleet-seed/.ssh/authorized_keys")


def test_3_failed_second_batch_stops_the_rollout(fleet):
    """a -> b in batches of one; fleet-r2 (second batch) answers unlike the canary (fleet parity, issue #30): one numeric
    setting of its unit differs. From here on the new units run the stand-in (STANDIN_VENV): its answers depend on the
    numeric settings as vLLM's do, and the parity key names the engine's version, so the canary records its own. The
    canary's throughput gate compares the stand-in's tokens/s with what real vLLM served in test 1 (only the
    mechanism is tested here, at a ratio of 0.05; test 5 has it fail)."""
    fleet.use_standin()
    r3_pid = _main_pid("fleet-r3", "tiny-llama-a")
    fleet.set_fault("fleet-r2", "parity")
    try:
        with _fleet_client() as client:
            result = fleet.rollout("3-a-to-b-fault", "-e", "model=tiny-llama-b", "-e", "rollout_batch_size=1",
                                   "-e", "rollout_min_tok_s_ratio=0.05")
    finally:
        fleet.set_fault(None)
    traffic = client.summary()
    log_summary(traffic)
    assert result.returncode != 0, _tail(result)
    # Clients of the fleet gateway never noticed: the canary and the failing host were drained before their pivots.
    assert traffic["failed"] == 0 and traffic["requests"] >= 20, traffic
    assert _drained_before_stopped(result.stdout, "fleet-r1") and _drained_before_stopped(result.stdout, "fleet-r2"), _tail(result)
    # The canary was gated on tiny-llama-a's recorded throughput on the same host, and keeps the new model.
    assert '"previous_tok_s": ' in result.stdout, _tail(result)
    assert _serving("fleet-r1") == "tiny-llama-b" and _healthy("fleet-r1", "tiny-llama-b")
    # The canary recorded its answers; fleet-r2 was compared with them and named with its first diverging token.
    canary_records = list((fleet.results / "fleet-r1" / "parity").glob("tiny-llama-b-*.json"))
    assert len(canary_records) == 1, canary_records
    assert re.search(r"tiny-llama-b answers differently from the golden answers in %s \(this start's parity key \w+\): "
                     r"\w+: token \d+ differs \(first diverging token \d+: expected id \d+, got id \d+"
                     % re.escape(str(canary_records[0])), result.stdout), _tail(result)
    # The failed host was rolled back by the pivot role and serves the old model again.
    assert "Rolled back" in result.stdout, _tail(result)
    assert _serving("fleet-r2") == "tiny-llama-a" and _healthy("fleet-r2", "tiny-llama-a")
    assert _is_active("fleet-r2", "tiny-llama-b") != "active"
    # The host after the failed batch was never touched.
    assert _serving("fleet-r3") == "tiny-llama-a" and _healthy("fleet-r3", "tiny-llama-a")
    assert _main_pid("fleet-r3", "tiny-llama-a") == r3_pid
    batches = result.stdout[result.stdout.index("PLAY [Roll"):result.stdout.index("PLAY [Fleet report")]
    assert "[fleet-r3]" not in batches, batches[-3000:]
    report = fleet.report("tiny-llama-b")
    assert "| fleet-r1 | tiny-llama-b | pivoted |" in report, report
    assert "| fleet-r2 | tiny-llama-a | failed |" in report, report
    assert "| fleet-r3 | tiny-llama-a | stopped before its batch |" in report, report
    assert "Rollout of tiny-llama-b stopped" in result.stdout
    print(report)


def test_4_rerun_continues_where_it_stopped(fleet):
    fleet.use_standin()  # as from test 3 (each of tests 3-6 says so: any of them may be re-run alone)
    r1_pid = _main_pid("fleet-r1", "tiny-llama-b")
    # A cache that is no longer what its manifest says (one byte of a file it lists) is set aside before the start.
    manifest = json.loads(_ssh("fleet-r3", "cat", "/var/cache/llmfleet-vllm/llmfleet-jit-manifest.json"))
    flipped = sorted(manifest["files"])[0]
    subprocess.run([TESTBED, "exec", "fleet-r3", "python3", "-c", f"f = open('/var/cache/llmfleet-vllm/{flipped}', 'r+b'); "
                    "b = f.read(1); f.seek(0); f.write(bytes([b[0] ^ 1])); f.close()"], check=True)
    began = time.time()
    with _fleet_client() as client:
        result = fleet.rollout("4-a-to-b-rerun", "-e", "model=tiny-llama-b", "-e", "rollout_batch_size=2",
                               "-e", "rollout_min_tok_s_ratio=0.05", "-e", "fast_start_seed_cache=false")
    traffic = client.summary()
    log_summary(traffic)
    assert result.returncode == 0, _tail(result)
    # Both hosts of the batch were out of the fleet gateway at once; fleet-r1 took every request, none failed, and
    # none was held (a host could serve).
    assert traffic["failed"] == 0 and traffic["requests"] >= 20, traffic
    assert _fleet_hold_lines(began) == []
    assert _drained_before_stopped(result.stdout, "fleet-r2") and _drained_before_stopped(result.stdout, "fleet-r3"), _tail(result)
    for host in HOSTS:
        assert _serving(host) == "tiny-llama-b" and _healthy(host, "tiny-llama-b"), host
        assert _is_active(host, "tiny-llama-a") != "active", host
    # The canary already served tiny-llama-b: left alone, not restarted.
    assert _main_pid("fleet-r1", "tiny-llama-b") == r1_pid
    report = fleet.report("tiny-llama-b")
    assert "3/3 hosts serve tiny-llama-b" in report and "| fleet-r1 | tiny-llama-b | unchanged |" in report, report
    # Without the numeric difference the hosts answer as the canary did (its record, the same key) and keep their own.
    for host in ("fleet-r2", "fleet-r3"):
        assert [p.name for p in (fleet.results / host / "parity").glob("tiny-llama-b-*.json")] == \
            [p.name for p in (fleet.results / "fleet-r1" / "parity").glob("tiny-llama-b-*.json")], host
    assert "| fleet-r2 | tiny-llama-b | pivoted | tiny-llama-a |" in report, report
    # One commit for the fleet: resolved by the first run of this rollout, locked in the results, served everywhere.
    lock = json.loads((fleet.results / "locks" / "tiny-llama-b.json").read_text())
    assert lock["revision"] == "main" and len(lock["commit"]) == 40, lock
    assert {_slot(host)["revision"] for host in HOSTS} == {lock["commit"]}
    # -e fast_start_seed_cache=false: no host was given the canary's caches; fleet-r3's flipped one was set aside, said.
    jit = {host: _pivot_record(fleet, host, "tiny-llama-b")["jit_cache"] for host in ("fleet-r2", "fleet-r3")}
    assert "seeded" not in jit["fleet-r2"] and jit["fleet-r2"]["verified"]["problems"] == [], jit
    assert "seeded" not in jit["fleet-r3"] and jit["fleet-r3"]["verified"]["problems"] == [
        f"{flipped} differs from the manifest (sha256)"], jit
    aside = jit["fleet-r3"]["verified"]["set_aside"]
    assert flipped in _ssh("fleet-r3", "cat", f"{aside}/REASON") and "set aside before the start" in result.stdout, jit
    print(report)


def test_5_canary_failing_its_gate_stops_the_fleet(fleet):
    """b -> a with a canary ratio no model can reach (-e strings): the canary is put back, no other host changes."""
    fleet.use_standin()
    pids = {host: _main_pid(host, "tiny-llama-b") for host in ("fleet-r2", "fleet-r3")}
    result = fleet.rollout("5-b-to-a-canary-gate", "-e", "model=tiny-llama-a", "-e", "rollout_batch_size=2",
                           "-e", "rollout_min_tok_s_ratio=1000", "-e", "rollout_canary_rollback=true")
    assert result.returncode != 0, _tail(result)
    assert "canary gate: tiny-llama-a on fleet-r1 reached" in result.stdout, _tail(result)
    assert "within the 95 % interval of the ratio" in result.stdout, _tail(result)  # 3 rounds a level: an interval
    assert _serving("fleet-r1") == "tiny-llama-b" and _healthy("fleet-r1", "tiny-llama-b")
    assert _is_active("fleet-r1", "tiny-llama-a") != "active"
    for host, pid in pids.items():
        assert _serving(host) == "tiny-llama-b" and _main_pid(host, "tiny-llama-b") == pid, host
    report = fleet.report("tiny-llama-a")
    assert "| fleet-r1 | tiny-llama-b | gate_failed |" in report, report
    assert "| fleet-r2 | tiny-llama-b | stopped before its batch |" in report, report


def test_6_failure_within_max_fail_percentage_continues(fleet):
    """b -> a without canary in batches of 2, 50 % allowed to fail: fleet-r2 fails in the first batch (its preflight
    refuses, so it keeps serving b untouched), which is within the budget, so the second batch (fleet-r3) still runs.
    (test 3 shows a batch past the budget stopping.) fleet-r3 is in maintenance at the fleet gateway when the run
    begins, so the first batch takes every host out: the fleet gateway holds the requests until a host is back
    (issue 44 item 5); the client, without retries, waits past the hold."""
    fleet.use_standin()
    r2_pid = _main_pid("fleet-r2", "tiny-llama-b")
    fleet.set_fault("fleet-r2", "preflight")
    began = time.time()
    assert _fleet_runtime("set server fleet/fleet-r3 state maint") == ""
    try:
        with _fleet_client(timeout_s=330) as client:
            result = fleet.rollout("6-b-to-a-max-fail", "-e", "model=tiny-llama-a", "-e", "rollout_canary=false",
                                   "-e", "rollout_batch_size=2", "-e", "rollout_max_fail_percentage=50")
    finally:
        fleet.set_fault(None)
    traffic = client.summary()
    log_summary(traffic)
    assert result.returncode != 0, _tail(result)  # a host failed: the run says so
    held = _fleet_hold_lines(began)
    assert traffic["failed"] == 0 and held and all(" held " in line for line in held), (traffic, held)
    # fleet-r3 is back at the fleet gateway: no administrative state (maintenance, drain) left on its server.
    r3_state = [line.split() for line in _fleet_runtime("show servers state fleet").splitlines() if " fleet-r3 " in line]
    assert len(r3_state) == 1 and r3_state[0][6] == "0", r3_state
    assert _serving("fleet-r1") == "tiny-llama-a" and _healthy("fleet-r1", "tiny-llama-a")
    assert _serving("fleet-r2") == "tiny-llama-b" and _main_pid("fleet-r2", "tiny-llama-b") == r2_pid
    assert _serving("fleet-r3") == "tiny-llama-a" and _healthy("fleet-r3", "tiny-llama-a")
    report = fleet.report("tiny-llama-a")
    assert "| fleet-r2 | tiny-llama-b | failed |" in report, report
    assert "| fleet-r3 | tiny-llama-a | pivoted | tiny-llama-b |" in report, report
    print(report)


# --- Multi-node Ray (playbooks/ray-cluster.yml, roles/ray_cluster): what the CPU test bed can check ---------
# Two test hosts (the vLLM CPU image) become a Ray head and a worker: Ray is installed into the vLLM venv,
# the units are rendered and pass `systemd-analyze verify`, the head starts first, the worker joins, and
# the play waits until `ray status` lists both nodes. vLLM itself is not started over Ray (ray_cluster_serve=false):
# a real multi-node vLLM run needs GPUs on several hosts (docs/multinode-ray.md); a Ray driver runs in the vLLM
# unit's own sandbox instead.
RAY_HOSTS = {"fleet-ray1": "2274", "fleet-ray2": "2275"}
DRIVER_CHECK = r"""
import re, subprocess
unit = open('/etc/systemd/system/vllm-tiny-llama-a-ray.service').read()
unit = re.sub(r'^ExecStart=(.*\\\n)*.*\n', 'ExecStart=/opt/vllm/bin/python -c "import ray; ray.init(log_to_driver=False); '
              'print(\'nodes\', sum(n[\'Alive\'] for n in ray.nodes()), \'task\', ray.get(ray.remote(lambda: 41 + 1).remote()))"\n',
              unit, count=1, flags=re.M)
unit = unit.replace('Type=exec', 'Type=oneshot').replace('Restart=on-failure', 'Restart=no')
open('/run/systemd/system/ray-driver-check.service', 'w').write(unit)
subprocess.run(['systemctl', 'daemon-reload'], check=True)
start = subprocess.run(['systemctl', 'start', 'ray-driver-check.service'], capture_output=True, text=True)
log = subprocess.run(['journalctl', '-u', 'ray-driver-check.service', '-o', 'cat', '--no-pager'], capture_output=True, text=True)
print(start.returncode, start.stderr, log.stdout[-3000:])
"""


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory, image):
    inv = tmp_path_factory.mktemp("ray-inventory")
    os.symlink(os.path.join(REPO, "inventory", "testbed", "group_vars"), inv / "group_vars")
    head, worker = RAY_HOSTS
    (inv / "hosts.yml").write_text(
        "all:\n  vars:\n    ray_cluster_node_ip: 127.0.0.1\n    ray_cluster_port: 6391\n    ray_cluster_num_gpus: 0\n"
        "    ray_cluster_prestage: false\n    ray_cluster_serve: false\n  children:\n"
        f"    ray_head:\n      hosts:\n        {head}: {{ansible_port: {RAY_HOSTS[head]}}}\n"
        f"    ray_workers:\n      hosts:\n        {worker}: {{ansible_port: {RAY_HOSTS[worker]}}}\n")

    def run(*extra: str) -> subprocess.CompletedProcess:
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        return subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", str(inv),
                               os.path.join(REPO, "playbooks", "ray-cluster.yml"), "-e", "ray_cluster_model=tiny-llama-a", *extra],
                              capture_output=True, text=True, env=env, cwd=REPO, check=False)

    try:
        up_machines([(host, port, image) for host, port in RAY_HOSTS.items()])
        yield run
    finally:
        for host in RAY_HOSTS:
            subprocess.run([TESTBED, "down", host], check=False, capture_output=True)


def test_ray_cluster_units_verify_and_nodes_join_in_order(ray_cluster):
    start = time.monotonic()
    result = ray_cluster()
    TIMINGS["ray-cluster"] = round(time.monotonic() - start, 1)
    out = result.stdout
    assert result.returncode == 0, _tail(result)
    assert "Verify the units with systemd-analyze" in out
    # Ordering: head first, then the workers join, then the wait for every node.
    assert out.index("ray_cluster : Start ray-head.service]") < out.index("ray_cluster : Start ray-worker.service]") \
        < out.index("ray_cluster : Wait until `ray status` lists every node: 2]")
    head, worker = RAY_HOSTS
    assert _ssh(head, "systemctl", "is-active", "ray-head.service") == "active"
    assert _ssh(worker, "systemctl", "is-active", "ray-worker.service") == "active"
    assert "2/2 nodes active" in _ssh(head, "/usr/local/libexec/llmfleet/ray-wait-nodes", "2", "0")
    unit = _ssh(head, "cat", "/etc/systemd/system/vllm-tiny-llama-a-ray.service")
    for arg in ("--distributed-executor-backend ray", "--pipeline-parallel-size 2", "--tensor-parallel-size 1",
                "BindsTo=ray-head.service", "ExecStartPre=/usr/local/libexec/llmfleet/ray-wait-nodes 2 600"):
        assert arg in unit.replace(" \\\n", " ").replace("\n    ", " ") or arg in unit, (arg, unit)
    assert _ssh(head, "systemd-analyze", "verify", "/etc/systemd/system/vllm-tiny-llama-a-ray.service",
                "/etc/systemd/system/ray-head.service", "&&", "echo", "ok").endswith("ok")
    # Issue #27 item 10: no key, so vLLM would listen on loopback; the units' HOME is the service user's, 0700 (Ray's
    # world-writable temp dir lives inside it), each unit has a private /tmp.
    assert "--host 127.0.0.1" in unit, unit
    for host, unit_name in ((head, "ray-head.service"), (worker, "ray-worker.service")):
        assert _ssh(host, "stat", "-c", "'%a %U'", "/var/lib/llmfleet-ray") == "700 vllm"
        assert _ssh(host, "systemctl", "show", "-P", "PrivateTmp", unit_name) == "yes"
        # Issue #27 item 7: each node records the dir it serves from over Ray, so pivots sharing the storage keep it.
        assert json.loads(_ssh(host, "cat", f"/srv/models/.llmfleet/serving/{host}.ray.json")) == {
            "host": host, "dirs": ["tiny-llama-a"]}
    assert "session_latest" in _ssh(head, "ls", "/var/lib/llmfleet-ray/tmp")
    # The vLLM unit's own file, its ExecStart swapped for a Ray driver (vLLM's part the CPU test bed cannot run over
    # Ray): in service_deploy's strict sandbox, with the unit's environment file (RAY_ADDRESS) and after its
    # ExecStartPre= (shm cleanup, every node joined), the driver joins the cluster and runs a task on it.
    driver = _ssh(head, "echo", base64.b64encode(DRIVER_CHECK.encode()).decode(), "|", "base64", "-d", "|",
                  "timeout", "300", "python3", "-")
    assert "nodes 2 task 42" in driver, driver
    # A second run changes nothing (no restart of the head or the worker).
    again = ray_cluster()
    assert again.returncode == 0, _tail(again)
    assert "changed=0" in again.stdout.split("PLAY RECAP")[-1], again.stdout[-3000:]
    # With ray_cluster_api_key (rendered only): the key is in the vLLM unit's 0600 root-only environment file, nowhere
    # else; vLLM then listens on every interface.
    keyed = ray_cluster("-e", "ray_cluster_api_key=ray-secret-4711", "-e", "ray_cluster_state=present",
                        "-e", "ray_cluster_install=false")
    assert keyed.returncode == 0, _tail(keyed)
    assert "ray-secret-4711" not in keyed.stdout + keyed.stderr
    unit = _ssh(head, "cat", "/etc/systemd/system/vllm-tiny-llama-a-ray.service")
    assert "--host 0.0.0.0" in unit and "ray-secret-4711" not in unit and "EnvironmentFile=/etc/llmfleet/vllm-tiny-llama-a-ray.env" in unit
    assert _ssh(head, "stat", "-c", "'%a %U'", "/etc/llmfleet/vllm-tiny-llama-a-ray.env") == "600 root"
    assert 'VLLM_API_KEY="ray-secret-4711"' in _ssh(head, "cat", "/etc/llmfleet/vllm-tiny-llama-a-ray.env")
    assert "ray-secret-4711" not in _ssh(head, "cat", "/etc/llmfleet/ray.env")
    assert _ssh(worker, "test", "-e", "/etc/llmfleet/vllm-tiny-llama-a-ray.env", "||", "echo", "absent") == "absent"
