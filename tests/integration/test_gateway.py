"""Pivots behind the host's gateway (roles/gateway: Debian's HAProxy) on a real systemd test host with vLLM's CPU
engine, while a continuous `openai` client talks only to the gateway, with the slot's alias as its model, and every
failed request is counted.

In order, on one host (slot `default`, alias `chat`):
1. nothing -> tiny-llama-a without a gateway, then the same pivot with `-e pivot_gateway=true -e pivot_alias=chat`
   (given once; the inventory sets neither): the serving slot moves behind the new gateway (vLLM restarts on
   loopback); bad gateway input and a port change of the serving slot are refused before any change
2. blue/green tiny-llama-a -> tiny-llama-b with the README's command (`-e model=` only): the slot keeps its alias and
   gateway (host state) and the run says so; b starts on the slot's standby port beside a, passes its gate, takes
   the traffic. The controller is killed (SIGKILL) after the gateway switched and before a drained: the alias still
   answers, also after `systemctl reload haproxy`; one re-run finishes the switch (a drains and stops). 0 failed
   requests, downtime 0. A re-run changes nothing.
3. rollback during load: a pivot back to tiny-llama-a whose gate cannot pass (blue/green: a starts beside b and is
   stopped again; b never stops). 0 failed requests. Then the same as stop-then-start (pivot_blue_green=false) while
   long streams run: the streams in flight finish before b stops (the drain), later requests get 503 + Retry-After
   (a on the stand-in).
4. stop, then start (a new upstream commit of tiny-llama-b, armed in the model's other unit), killed right after the
   hand-over (the old revision stopped, the new one let go, nothing recorded): clients get 503 with Retry-After (also
   after a reload), and
   one re-run rolls back to the recorded revision, then pivots; every failed request is a 503 with Retry-After
   between the first run's drain and the re-run's reopening of the gateway;
   HAProxy logs the empty backend below emergency level (journald would write an emergency to every terminal).
Observability (issue #31) rides along: Debian's Prometheus, started by the test on this machine, reads the targets
every pivot writes (observability_prometheus_host=localhost) and scrapes the slot's vLLM through the gateway's metrics
listener, HAProxy's own metrics and Debian's node_exporter, run in the test host with the textfile the pivots write.
After the blue/green pivot the new model's series carry its labels and the old one's stop, the pivot metrics equal the
pivot record, every dashboard query returns data and the metric contract passes on vLLM 0.32 (and catches a removed
metric); the killed stop-then-start shows as a pivot in progress; with API keys the metrics listener wants one too, and
with metrics-only keys it wants one of those and no API key.
"""
from __future__ import annotations

import glob
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools", "traffic"))
from continuous_client import ContinuousClient, log_summary  # noqa: E402  pylint: disable=wrong-import-position

sys.path.insert(0, os.path.join(REPO, "tools", "crash"))
import harness  # noqa: E402  pylint: disable=wrong-import-position
import bulk_refusals  # noqa: E402  pylint: disable=wrong-import-position

sys.path.insert(0, os.path.join(REPO, "tests"))
from prometheus_server import PrometheusServer, debian_prometheus_bin  # noqa: E402  pylint: disable=wrong-import-position

TESTBED = os.path.join(REPO, "tools", "testbed", "testbed.sh")
HUB = os.path.join(REPO, "tools", "localhub", "tiny-hub.sh")
MACHINE, SSH_PORT, HUB_PORT = "itest-gw", "2233", "18093"
# Ports of their own (test hosts share the host's network): the gateway, and the slot's two vLLM ports.
GW_PORT, A_PORT, B_PORT = 8590, 8501, 8502
GW_URL = f"http://127.0.0.1:{GW_PORT}"
# Observability: the gateway's metrics listener, node_exporter in the test host, Prometheus on this machine.
METRICS_PORT, NODE_PORT, PROM_PORT = 8591, 18591, 18590
TESTBED_STATE = os.environ.get("TESTBED_STATE", "/var/lib/llmfleet-testbed")
# The stand-in vLLM server (testbed.sh standin) for the one pivot whose new model only has to fail its gate.
STANDIN_VENV = "/opt/vllm-standin"
# A context of 2048 (the tiny models' positions; the catalog says 256): streams long enough to outlast the steps
# between a gateway reload and the stop of the old model (test_stop_then_start_to_another_model_...).
PORTS = {m: {"port": p, "serving": {"max_model_len": 2048}} for m, p in (("tiny-llama-a", A_PORT), ("tiny-llama-b", B_PORT))}


def _ssh(cmd: str) -> str:
    return subprocess.run([TESTBED, "ssh", MACHINE, cmd], capture_output=True, text=True, check=False).stdout.strip()


def _slot() -> dict:
    return json.loads(_ssh("cat /var/lib/llmfleet/slots.json"))["slots"]["default"]


def _main_pid(model: str) -> str:
    return _ssh(f"systemctl show -P MainPID {harness.served_unit({'default': _slot()}, model)}")


def _served_through_gateway() -> str:
    try:
        with urllib.request.urlopen(urllib.request.Request(
                GW_URL + "/v1/completions", data=json.dumps({"model": "chat", "prompt": "hi", "max_tokens": 2}).encode(),
                headers={"Content-Type": "application/json"}), timeout=30) as resp:
            return json.load(resp)["model"], resp.status
    except urllib.error.HTTPError as exc:  # what answered, and what the server's journal says
        raise AssertionError("%s %s\n%s" % (exc.code, exc.read()[:2000], _ssh(
            "systemctl status --no-pager vllm-tiny-llama-a.service vllm-tiny-llama-b.service | head -30;"
            " journalctl --no-pager -o cat -u vllm-tiny-llama-a.service --since \"$(systemctl show -P ActiveEnterTimestamp"
            " vllm-tiny-llama-a.service)\" | grep -v 'Route: ' | grep -A60 -m1 'EngineCore pid=[0-9]*) ERROR\\|Traceback'"
            " | head -90"))) from exc


@pytest.fixture(scope="module")
def pivot(tmp_path_factory, vllm_image, pivot_playbook):
    inv = tmp_path_factory.mktemp("gateway-inventory")
    results = tmp_path_factory.mktemp("gateway-results")
    targets = tmp_path_factory.mktemp("prometheus-targets")
    (inv / "hosts.yml").write_text(
        f"all:\n  hosts:\n    {MACHINE}:\n      ansible_port: {SSH_PORT}\n"
        f"      model_fetch_hf_endpoint: http://127.0.0.1:{HUB_PORT}\n      pivot_benchmark: false\n"
        f"      gateway_port: {GW_PORT}\n      gateway_retry_after_s: 5\n"
        f"      gateway_metrics_port: {METRICS_PORT}\n      observability_prometheus_host: localhost\n"
        f"      observability_targets_dir: {targets}\n      observability_node_exporter_port: {NODE_PORT}\n"
        f"      observability_target_labels: {{site: itest}}\n"
        f"      pivot_controller_results_dir: {results}\n      llmfleet_models_extra: {json.dumps(PORTS)}\n")
    os.symlink(os.path.join(REPO, "inventory", "testbed", "group_vars"), inv / "group_vars")

    run = pivot_playbook(inv)

    run.results, run.inventory = results, inv
    subprocess.run([HUB, "start", HUB_PORT], check=True)
    subprocess.run([TESTBED, "up", MACHINE, SSH_PORT, vllm_image], check=True, capture_output=True)
    subprocess.run([TESTBED, "standin", MACHINE], check=True, capture_output=True)
    # Debian's node_exporter in the test host, reading the textfile directory the pivots write into.
    rootfs = os.path.join(TESTBED_STATE, MACHINE, "rootfs")
    subprocess.run(["install", "-D", "-m", "0755", os.path.join(debian_prometheus_bin(), "prometheus-node-exporter"),
                    os.path.join(rootfs, "usr", "local", "bin", "prometheus-node-exporter")], check=True)
    _ssh("mkdir -p /var/lib/prometheus/node-exporter && systemd-run --unit node-exporter"
         f" /usr/local/bin/prometheus-node-exporter --web.listen-address=127.0.0.1:{NODE_PORT} --collector.disable-defaults"
         " --collector.textfile --collector.textfile.directory=/var/lib/prometheus/node-exporter")
    prometheus = PrometheusServer(tmp_path_factory.mktemp("prometheus"), PROM_PORT, targets).start()
    run.prometheus, run.targets = prometheus, targets
    try:
        first = run("-e", "model=tiny-llama-a", "-e", "pivot_gateway=false")
        assert first.returncode == 0, first.stdout[-6000:]
        behind_gateway = run("-e", "model=tiny-llama-a", "-e", "pivot_gateway=true", "-e", "pivot_alias=chat")
        assert behind_gateway.returncode == 0, behind_gateway.stdout[-6000:]
        yield run
    finally:
        prometheus.stop()
        subprocess.run([TESTBED, "down", MACHINE], check=False, capture_output=True)
        subprocess.run([HUB, "stop", HUB_PORT], check=False)


def _client() -> ContinuousClient:
    # A request's own timeout above what the gateway may hold it (gateway_hold_s, 300): a held request is answered.
    return ContinuousClient(GW_URL + "/v1", "chat", max_seconds=1200, timeout_s=360)


def _gateway_answer(method: str, path: str, body: dict | None = None) -> tuple:
    conn = http.client.HTTPConnection("127.0.0.1", GW_PORT, timeout=30)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def test_first_model_serves_behind_the_gateway_on_loopback(pivot):
    assert _served_through_gateway() == ("chat", 200)
    # Only the API clients use reaches vLLM: its dev-mode and admin endpoints are the gateway's 404 (issue #33 item 4).
    for method, path in (("POST", "/sleep?level=1"), ("POST", "/wake_up"), ("GET", "/is_sleeping"),
                         ("POST", "/collective_rpc"), ("POST", "/reset_prefix_cache"), ("POST", "/start_profile"),
                         ("POST", "/v1/load_lora_adapter"), ("POST", "/v1/%6coad_lora_adapter"), ("POST", "/%73leep"),
                         ("GET", "/"), ("GET", "/docs"), ("GET", "/metrics")):
        status, body = _gateway_answer(method, path, {})
        assert status == 404 and '"code": "path_not_allowed"' in body, (method, path, status, body)
    for method, path, body in (("GET", "/health", None), ("GET", "/version", None),
                               ("GET", "/v1/models", None), ("POST", "/tokenize", {"model": "chat", "prompt": "hi"})):
        status, answer = _gateway_answer(method, path, body)
        assert status == 200, (method, path, status, answer)
    listeners = _ssh(f"ss -Hltn 'sport = :{A_PORT}'")
    assert f"127.0.0.1:{A_PORT}" in listeners and f"0.0.0.0:{A_PORT}" not in listeners, listeners
    slot = _slot()
    assert (slot["model"], slot["alias"], slot["port"], slot["standby_port"]) == ("tiny-llama-a", "chat", A_PORT, B_PORT)


# Bad gateway input (issue 41 item 4): most in one ansible-playbook run (tests/integration/bulk_refusals.py: a play
# and an inventory alias of this machine per case), a few on the real CLI so that -e's strings stay tested there.
BAD_GATEWAY_INPUT = [
    (["-e", f"gateway_port={A_PORT}"], f"gateway_port {A_PORT} is a port of slot default"),
    (["-e", "slot=other", "-e", "pivot_alias=chat"], "pivot_alias=chat is already the name of slot default"),
    (["-e", "gateway_tls_cert_file=/etc/llmfleet/no-such.pem"], "gateway_tls_cert_file /etc/llmfleet/no-such.pem does not exist"),
    (["-e", "pivot_port=8599"], f"pivot_port=8599: slot default serves tiny-llama-a on port {A_PORT}, and a serving slot keeps its port"),
    # A key with a space would be two words of a map line (HAProxy keeps the first); test values, not secrets.
    (["-e", '{"gateway_api_keys": ["sk-fine", "sk bad"]}'], "gateway_api_keys: 1 of the 2 keys (number 2; values not shown)"),
    # A newline would end ExecStart= (flags after it dropped) and split the gateway's map lines (issue 27 L1).
    (["-e", '{"pivot_alias": "chat\\n"}'], "pivot_alias must be a model alias"),
    # Values written into haproxy.cfg: a space or a newline would add options or lines (L5). One case: the gateway's
    # checks run as one loop, each variable named (also the metrics-only keys of issue 43, checked as the API keys are).
    (["-e", '{"gateway_bind_address": "0.0.0.0:1 ssl crt /x\\nfrontend y", "gateway_timeout_server_s": "600\\n",'
      ' "gateway_fleet": [{"name": "h1", "address": "10.0.0.1 check\\n", "port": 8080}],'
      ' "gateway_public_paths": ["/health", "/x acl y"], "gateway_metrics_api_keys": ["sk-fine", "sk bad"]}'],
     ("gateway_bind_address must be one IP address", "gateway_timeout_server_s must be a whole number of seconds >= 1",
      "gateway_fleet must be a list of fleet hosts, each {name (letters, digits, _ . : -), address (one IP address",
      "gateway_public_paths and gateway_public_path_prefixes must be lists of URL paths",
      "gateway_metrics_api_keys: 1 of the 2 keys (number 2; values not shown)")),
    (["-e", "gateway_tls_cert_file=/etc/hostname"], "gateway_tls_cert_file /etc/hostname holds the private key but is mode"),
    # vLLM's unit has no capabilities (L8).
    (["-e", "pivot_port=80"], "pivot_port must be a TCP port in 1024..65535 (vLLM runs without privileges"),
    # Issue #31: a target label that clashes with the collection's, a targets directory Prometheus' host cannot write.
    (["-e", '{"observability_target_labels": {"slot": "x"}}'],
     "observability_target_labels: the label slot clashes with a label the collection sets"),
    (["-e", "observability_targets_dir=READONLY"], "observability_targets_dir READONLY on localhost cannot be written"),
    (["-e", f"gateway_metrics_port={GW_PORT}"], "gateway_metrics_port must be 0 (no metrics listener) or a TCP port"),
    # Issue 43: never one key in both lists; a loopback metrics listener (the default) that Prometheus would scrape at
    # another address.
    (["-e", '{"gateway_api_keys": ["sk-both"], "gateway_metrics_api_keys": ["sk-both"]}'],
     "a metrics-only key must not open the API"),
    (["-e", "observability_scrape_address=10.9.8.7"],
     "binds 127.0.0.1 (gateway_metrics_bind_address, loopback by default) but Prometheus scrapes it at 10.9.8.7"),
    # Issue 44: the buffer that holds each request's whole body, and the hold's bounds (a held request must still have
    # time for its answer, gateway_timeout_server_s 600): one case, each variable named (the checks run as one loop).
    (["-e", "gateway_max_request_bytes=1024", "-e", "gateway_hold_s=600", "-e", "gateway_hold_max=0"],
     ("gateway_max_request_bytes must be a whole number of bytes in 16384..67108864",
      "gateway_hold_s must be a whole number of seconds >= 1, below gateway_timeout_server_s",
      "gateway_hold_max must be a whole number of requests >= 1")),
]
# On the real CLI: a number given as a string, a JSON list, a path on the controller made read-only for the test.
ON_THE_CLI = (0, 4, 10)


def _refused_before_any_change(pivot, run, readonly_dir, own_targets=True):
    """run(replace) is refused (replace() puts readonly_dir where a case says READONLY), and nothing changed.
    own_targets: the run's inventory host is the machine's, whose Prometheus targets the test's Prometheus reads."""
    pid, slot, config = _main_pid("tiny-llama-a"), _slot(), _ssh("cat /etc/haproxy/haproxy.cfg")
    targets = sorted(os.listdir(pivot.targets))
    readonly_dir.mkdir()
    subprocess.run(["mount", "--bind", "-o", "ro", str(readonly_dir), str(readonly_dir)], check=True)
    try:
        run(lambda text: text.replace("READONLY", str(readonly_dir)))
    finally:
        subprocess.run(["umount", str(readonly_dir)], check=False)
    assert _main_pid("tiny-llama-a") == pid and _slot() == slot and _ssh("cat /etc/haproxy/haproxy.cfg") == config
    assert _ssh("test -e /srv/models/tiny-llama-b || echo absent") == "absent"
    if own_targets:
        assert sorted(os.listdir(pivot.targets)) == targets


@pytest.mark.parametrize("extra, message", [BAD_GATEWAY_INPUT[i] for i in ON_THE_CLI])
def test_bad_gateway_input_is_refused_before_any_change(pivot, extra, message, tmp_path):
    def run(replace):
        result = pivot("-e", "model=tiny-llama-b", *[replace(e) for e in extra])
        assert result.returncode != 0 and replace(message) in result.stdout, result.stdout[-4000:]
    _refused_before_any_change(pivot, run, tmp_path / "readonly-targets")


def test_bad_gateway_input_in_bulk_is_each_refused_before_any_change(pivot, tmp_path):
    cases = [case for i, case in enumerate(BAD_GATEWAY_INPUT) if i not in ON_THE_CLI]
    alias_targets = tmp_path / "alias-targets"  # the aliases' own targets, apart from what the test's Prometheus reads
    alias_targets.mkdir()

    def run(replace):
        result, refusals = bulk_refusals.run(pivot.inventory, MACHINE, ["-e", "model=tiny-llama-b"],
                                             [[replace(e) for e in extra] for extra, _m in cases], tmp_path / "bulk",
                                             alias_vars={"observability_targets_dir": str(alias_targets)})
        assert result.returncode == 0, result.stdout[-4000:]  # every case's failure was rescued and written down
        for (extra, messages), refusal in zip(cases, refusals):
            for message in messages if isinstance(messages, tuple) else (messages,):
                assert replace(message) in refusal, (extra, refusal)
    # The aliases publish their targets apart (alias_vars), so the machine's own are not this run's to keep.
    _refused_before_any_change(pivot, run, tmp_path / "readonly-targets", own_targets=False)


def test_blue_green_pivot_fails_no_request_and_has_no_downtime(pivot):
    with _client() as client:
        _rc, out, killed = harness.run_pivot(pivot.inventory, ["-e", "model=tiny-llama-b"],
                                             crash_before_task_named="Drain the old model")
        assert killed, out[-6000:]
        # The README's command keeps what the slot promised (given once, by the fixture's second run).
        shown = re.findall(r'"msg": "(slot default: alias [^"]*)"', out)
        assert shown == [f"slot default: alias chat (kept), gateway on (kept), port {A_PORT} (kept), API key none (kept), "
                         "hold on (kept)"], shown
        switched = _slot()
        assert (switched["model"], switched["pivot"]["phase"]) == ("tiny-llama-b", "committed"), switched
        assert _ssh("systemctl is-active vllm-tiny-llama-a.service") == "active"  # killed before a drained
        after_kill = harness.watch(GW_URL, "chat", 3)
        _ssh("systemctl reload haproxy")
        after_reload = harness.watch(GW_URL, "chat", 3)
        result = pivot("-e", "model=tiny-llama-b")
    traffic = client.summary()
    log_summary(traffic)
    assert set(after_kill) == {"ok"} and set(after_reload) == {"ok"}, (after_kill, after_reload)
    assert result.returncode == 0, result.stdout[-6000:]
    assert "stopped after its commit; finishing it: tiny-llama-b serves" in result.stdout, result.stdout[-6000:]
    assert "Took over the pivot lock" in result.stdout and "that run is gone" in result.stdout, result.stdout[-6000:]
    assert traffic["failed"] == 0 and traffic["requests"] >= 20, traffic
    assert harness.agrees(harness.host_state(MACHINE), "tiny-llama-b") == []
    slot = _slot()
    assert (slot["model"], slot["port"], slot["standby_port"]) == ("tiny-llama-b", B_PORT, A_PORT), slot
    # b serves and starts at boot; a is stopped and does not; a's weights stay beside b's.
    assert _ssh("systemctl is-active vllm-tiny-llama-a.service; systemctl is-enabled vllm-tiny-llama-a.service").split() == ["inactive", "disabled"]
    assert _ssh("systemctl is-active vllm-tiny-llama-b.service; systemctl is-enabled vllm-tiny-llama-b.service").split() == ["active", "enabled"]
    assert _ssh("ls /srv/models/tiny-llama-a/config.json /srv/models/tiny-llama-b/config.json").count("config.json") == 2
    assert _served_through_gateway() == ("chat", 200)
    again = pivot("-e", "model=tiny-llama-b")
    assert again.returncode == 0 and "changed=0" in again.stdout.split("PLAY RECAP")[-1], again.stdout[-4000:]


def test_rollback_during_load_fails_no_request(pivot):
    b_pid, slot = _main_pid("tiny-llama-b"), _slot()
    with _client() as client:
        result = pivot("-e", "model=tiny-llama-a", "-e", "pivot_gate_min_output_tok_s=1e9")
    traffic = client.summary()
    log_summary(traffic)
    assert result.returncode != 0 and "Blue/green pivot tiny-llama-b -> tiny-llama-a in slot default failed" in result.stdout, \
        result.stdout[-6000:]
    # Issue #30: tiny-llama-a starts again under the parity key it was first served with (the first test): it answers
    # as recorded then, before the throughput gate fails it.
    assert re.search(r"parity: matched with \S+/parity/tiny-llama-a-\w+\.json \(largest logprob move ", result.stdout), \
        result.stdout[-6000:]
    assert traffic["failed"] == 0 and traffic["requests"] >= 10, traffic
    assert _main_pid("tiny-llama-b") == b_pid and _slot() == slot
    assert _ssh("systemctl is-active vllm-tiny-llama-a.service") != "active"
    assert _served_through_gateway() == ("chat", 200)
    # Prometheus: the slot's last pivot was rolled back, as the host's record of it says.
    rolled_back = json.loads(_ssh("cat $(ls -1 /var/lib/llmfleet/pivots/*-rolled-back.json | tail -1)"))
    textfile = _ssh("cat /var/lib/prometheus/node-exporter/llmfleet.prom")
    assert 'llmfleet_pivot_last_result{slot="default",result="rolled_back"} 1' in textfile, (textfile, result.stdout[-5000:])
    seconds = pivot.prometheus.wait_query('llmfleet_pivot_last_rollback_seconds{slot="default"}',
                                          lambda r: r and r[0][1] == rolled_back["rollback"]["seconds"])
    assert seconds and pivot.prometheus.query('llmfleet_pivot_last_result{slot="default", result="rolled_back"}')[0][1] == 1


def test_stop_then_start_to_another_model_lets_the_streams_in_flight_end(pivot):
    """Issue #27 item 4: a stop-then-start to another model (the gateway's map changes) while a client streams
    1000-token completions back to back through the gateway, beside another client's short requests. The stream in
    flight when the gateway closed runs to its end before b stops (the drain waits on b's own count from vLLM's
    /metrics); later requests wait at the gateway (issue 44: the hold, on by default). a's gate cannot pass: the pivot
    rolls back to b, and the held requests go to b once it is back: not one failed (the clients do not retry).
    On acfc22f (gateway reloaded before the drain, which read the new worker's sessions) the stream was cut after 525
    of 1500 chunks ("EngineCore encountered an issue").
    The new model a is the STAND-IN vLLM server (STANDIN_VENV; tests/standin/vllm, held to real vLLM by
    test_standin_contract.py): what is tested is the collection's drain, gateway and rollback, while the stream in
    flight is on the real b, whose own count the drain reads, and the rollback starts b's unit as it was (issue 41: one
    real start fewer)."""
    # One stream at a time, back to back with no pause (so one is in flight when the gateway closes): the one in flight
    # is the only one left (with a second worker, a stream begun after an early reload would hold the old drain until
    # the first had ended too). The same streams across a revision pivot of one model were not cut on acfc22f.
    # The streams begin as the new unit is written, the pivot's last step before the gateway closes: back to back
    # through the whole pivot they kept one core busy for minutes of make test's CPU (issue 41).
    streams = ContinuousClient(GW_URL + "/v1", "chat", workers=1, max_tokens=1000, interval_s=0, failure_interval_s=0.5,
                               timeout_s=300, stream=True, max_seconds=1200)
    since = _ssh("date '+%Y-%m-%d %H:%M:%S'")
    with _client() as client:
        try:
            result = pivot("-e", "model=tiny-llama-a", "-e", "pivot_blue_green=false", "-e", "pivot_gate_min_output_tok_s=1e9",
                           "-e", f"vllm_install_venv={STANDIN_VENV}",
                           at_task=("Write the new unit before anything stops", streams.start))
        finally:
            streams.stop()
    assert streams.started_at is not None, result.stdout[-4000:]  # the task was found, and the streams ran
    for name, traffic in (("streams", streams.summary()), ("short", client.summary())):
        log_summary(traffic, name=f"{__name__}::stop_then_start_streams::{name}")
    assert result.returncode != 0 and "Rolled back" in result.stdout, result.stdout[-6000:]
    assert "Stop sending the slot's new requests to the draining server" in result.stdout, result.stdout[-6000:]
    failed = [r for r in streams.requests + client.requests if not r["ok"]]
    assert failed == [], failed[:3]
    # Held: the short requests that waited (each takes ~0.1 s otherwise), the first of them up to one short request
    # after the close. The stream in flight at the close is the last one begun before it, and it ended (whole) no more
    # than a second before it, or after it.
    held = [r for r in client.requests if r["end"] - r["start"] > 2]
    assert held and max(r["end"] - r["start"] for r in held) < 120, held[:3]
    closed_at = min(r["start"] for r in held)
    in_flight = [r for r in streams.requests if r["start"] < closed_at][-1]
    assert in_flight["ok"] and in_flight["chunks"] >= 900 and in_flight["end"] > closed_at - 1, (closed_at, in_flight)
    assert _slot()["model"] == "tiny-llama-b" and _served_through_gateway() == ("chat", 200)
    # Issue 44 item 3: a's answers passed, so the held requests went to a before its throughput gate; the gate failed,
    # the window closed again, a finished what it was given, and b came back. The rolled-back record counts the window
    # at the gateway: what it held (the longest about the window), nothing refused.
    out = result.stdout
    assert out.index("Admit the held requests to the new model before its throughput gate") \
        < out.index("TASK [llmfleet.vllm.pivot : Gate on throughput and errors]") \
        < out.index("Let the new model finish the requests it was admitted"), out[-6000:]
    rolled_back = json.loads(_ssh("cat $(ls -1 /var/lib/llmfleet/pivots/*-rolled-back.json | tail -1)"))
    window = rolled_back["gateway_window"]
    assert rolled_back["closed_s"] == window["closed_s"] > 0 and window["refused_requests"] == 0, rolled_back
    assert window["held_requests"] >= 1 and 2 < window["held_wait_max_s"] <= window["closed_s"] + 1, rolled_back
    # The gateway's log says each held request's wait; the window is over (its file gone, the directory kept).
    assert re.search(r'hold:"held [0-9.]+ s"', _ssh(f"journalctl -t haproxy --no-pager -o cat --since '{since}'")), "none held"
    assert _ssh("test -d /var/lib/haproxy/llmfleet-hold && ls -A /var/lib/haproxy/llmfleet-hold && echo kept") == "kept"


def test_stop_then_start_holds_requests_and_a_killed_run_answers_503_at_the_hold_bounds(pivot):
    """A new upstream commit of tiny-llama-b (stop, then start; real vLLM). The first run, with the hold bounded to 2 s
    and 1 request (gateway_hold_s, gateway_hold_max, -e strings), is killed right after the hand-over: the requests
    held then get 503 with Retry-After at a bound, which the gateway's log names. The re-run heals and pivots with the
    default bounds: none of its own window's requests fails (they wait for the new revision)."""
    subprocess.run([HUB, "publish", HUB_PORT, "tiny-llama-b"], check=True, capture_output=True)
    old_revision, old_unit = _slot()["revision"], _slot()["unit"]
    with _client() as client:
        _rc, out, killed = harness.run_pivot(pivot.inventory, ["-e", "model=tiny-llama-b", "-e", "revision=main",
                                                               "-e", "gateway_hold_s=2", "-e", "gateway_hold_max=1"],
                                             crash_before_task_named="Publish the hand-over")
        assert killed, out[-6000:]
        assert _slot()["pivot"]["phase"] == "switching" and _slot()["revision"] == old_revision
        # Killed right after the hand-over (one module run: the old revision stopped, the new one's held start let
        # go), before anything was recorded: the new revision starts in the model's other unit, unrecorded, on the
        # slot's port. The intent was written, and said in the textfile, before the first change: Prometheus sees a
        # pivot in progress (the alert on a down slot waits for it).
        assert _ssh(f"systemctl is-active {old_unit}") != "active"
        assert _ssh("ls /run/llmfleet-launch/ | grep -c hold || true") == "0"
        pivot.prometheus.wait_query('llmfleet_slot_pivot_in_progress{slot="default"} == 1', lambda r: len(r) == 1)
        # One probe each (held up to 2 s, or refused at once while the client's request is the one held): the new
        # revision, let go unrecorded, serves within seconds, and a reloaded worker's server would reach it.
        after_kill = harness.watch(GW_URL, "chat", 1)
        _ssh("systemctl reload haproxy")
        after_reload = harness.watch(GW_URL, "chat", 1)
        result = pivot("-e", "model=tiny-llama-b", "-e", "revision=main")
    traffic = client.summary()
    log_summary(traffic)
    assert set(after_kill) == {"retry"} and set(after_reload) == {"retry"}, (after_kill, after_reload)
    assert result.returncode == 0, result.stdout[-6000:]
    assert "stopped before its commit; rolling back: tiny-llama-b serves" in result.stdout, result.stdout[-6000:]
    assert harness.agrees(harness.host_state(MACHINE), "tiny-llama-b") == [] and _slot()["revision"] != old_revision
    record = json.loads((pivot.results / MACHINE / "pivots" / "tiny-llama-b-latest.json").read_text())
    assert record["strategy"] == "stop_start" and record["downtime_s"] > 0, record
    # Fast start (issue 45): the new revision was armed in the model's other unit while the old one served (vLLM
    # imported, the weights read); its load time counts from the go. The old unit is stopped and disabled, with no hold
    # file left behind by the killed run or this one.
    assert record["unit"] == _slot()["unit"] and {old_unit, record["unit"]} == set(harness.model_units("tiny-llama-b")), record
    armed = record["fast_start"]["armed"]
    assert record["fast_start"]["held"] is True and armed["import_s"] > 0 and armed["prefetch_bytes"] > 0, record
    assert 0 < record["load_time_s"] < record["downtime_s"], record
    # Where the start went, read from the server's own log (item 5): the launcher's go, then vLLM's landmarks (the CPU
    # engine logs no "Model loading took", so its weights phase stays open; vLLM's own weights figure is there).
    phases = record["start_phases"]
    assert phases["phases"]["imports"] is None and phases["phases"]["config_and_engine_process"] is not None, phases
    assert phases["phases"]["api_server"] is not None and "weights_load_s" in phases["reported"], phases
    assert 0 < phases["from_go_s"] <= record["load_time_s"] + 1.5 and not phases["spawn_forced"], phases
    assert "start phases (s, from the server log): " in result.stdout
    # Item 2: what the earlier starts cached was kept across the restarts and verified against its manifest before this
    # start: the last one recorded, tiny-llama-a's (one cache directory per host; b's blue/green commit was finished by a
    # heal, which records nothing), so its files were compared and kept under another key; b's start recorded them
    # again under b's key after the gate.
    jit = record["jit_cache"]
    assert jit["verified"]["files"] > 0 and (jit["verified"]["problems"], jit["verified"]["set_aside"]) == ([], None), jit
    assert jit["verified"]["key_matches"] is False and jit["recorded"]["files"] >= jit["verified"]["files"], jit
    assert jit["recorded"]["key_id"] == jit["recorded"]["unit_key_id"] == jit["verified"]["unit_key_id"], jit
    assert f"JIT caches: {jit['verified']['files']} files verified before the start" in result.stdout, result.stdout[-6000:]
    assert "(go -> ready; armed while the old model served: vLLM imported in" in result.stdout, result.stdout[-6000:]
    assert _ssh(f"systemctl is-active {old_unit}; systemctl is-enabled {old_unit}").split() == ["inactive", "disabled"]
    assert _ssh("ls /run/llmfleet-launch/ | grep -c hold || true") == "0"
    closed, opened = record["gateway_closed_at"], record["gateway_opened_at"]
    # Issue 44 item 3: the window counted at the gateway (its own log), beside the downtime: held, none refused; the
    # held requests went to the new revision before its throughput gate, which ran while it served them.
    window = record["gateway_window"]
    assert record["closed_s"] == window["closed_s"] == round(opened - closed, 1) > 0 and window["refused_requests"] == 0, record
    assert window["held_requests"] >= 1 and 0 < window["held_wait_p95_s"] <= window["held_wait_max_s"] <= window["closed_s"] + 1, record
    assert result.stdout.index("Admit the held requests to the new model before its throughput gate") \
        < result.stdout.index("TASK [llmfleet.vllm.pivot : Gate on throughput and errors]"), result.stdout[-6000:]
    assert f"gateway closed {record['closed_s']} s (stops admitting -> admits again" in result.stdout, result.stdout[-6000:]
    failures = [r for r in client.requests if not r["ok"]]
    assert failures, traffic  # the killed run left the slot closed for a while
    assert all(r["status"] == 503 and r.get("retry_after") == "5" for r in failures), failures[:5]
    # Every failure lies between the killed run's drain and the re-run's own close: that window's requests were held
    # and answered (the longest about the window), none failed.
    first_closed = min(r["start"] for r in failures)
    assert all(r["ok"] for r in client.requests if r["end"] < first_closed)
    assert all(r["end"] <= closed for r in failures), (closed, failures[-3:])
    held = [r for r in client.requests if closed <= r["start"] <= opened and r["end"] - r["start"] > 2]
    assert held and all(r["ok"] for r in held) and max(r["end"] - r["start"] for r in held) <= opened - closed + 2, held[:3]
    assert any(r["ok"] and r["start"] > opened for r in client.requests)
    assert _served_through_gateway() == ("chat", 200)
    # The empty backend is logged, but not as an emergency that journald writes to every terminal; the killed run's
    # window refused at both bounds, each named.
    journal = _ssh("journalctl -t haproxy --no-pager -o cat")
    assert "has no server available" in journal
    assert 'hold:"refused: 1 held already (gateway_hold_max)"' in journal, journal[-3000:]
    assert re.search(r'hold:"refused: waited [0-9.]+ s of 2 s \(gateway_hold_s\)"', journal), journal[-3000:]
    assert _ssh("journalctl -t haproxy -p 0..2 --no-pager -q") == ""
    assert _ssh("test -d /var/lib/haproxy/llmfleet-hold && ls -A /var/lib/haproxy/llmfleet-hold && echo kept") == "kept"


def _observability_playbook(pivot, *extra: str) -> subprocess.CompletedProcess:
    """playbooks/observability.yml, as users run it: targets and textfile from host state, then the metric contract."""
    return subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", str(pivot.inventory),
                           os.path.join(REPO, "playbooks", "observability.yml"), *extra],
                          capture_output=True, text=True, cwd=REPO, check=False, timeout=600)


def _dashboard_queries():
    """(dashboard, panel, PromQL) of every query of the shipped dashboards, Grafana's variables filled in."""
    for path in sorted(glob.glob(os.path.join(REPO, "roles", "observability", "files", "dashboards", "*.json"))):
        with open(path, encoding="utf-8") as handle:
            board = json.load(handle)
        for panel in board["panels"]:
            for target in panel.get("targets") or []:
                expr = re.sub(r"\$__rate_interval", "5m", target["expr"])
                yield os.path.basename(path), panel["title"], re.sub(r"\$\{?\w+\}?", ".*", expr)


def test_prometheus_follows_the_pivot_through_the_generated_targets(pivot):
    """After the stop-then-start pivot to b's new revision: the targets say so (with the slot's labels), Prometheus
    scrapes it through the gateway's metrics listener and the old revision's series are gone; the textfile's pivot
    metrics equal the pivot record;
    every dashboard query has data (the GPU panels once the GPU timer runs with NVML's test double); the metric contract passes
    on the bed's vLLM, and a metric it does not export fails it, naming its user."""
    prom, slot = pivot.prometheus, _slot()
    record = json.loads((pivot.results / MACHINE / "pivots" / "tiny-llama-b-latest.json").read_text())
    assert (record["strategy"], record["revision"]) == ("stop_start", slot["revision"]) and record["previous_revision"]
    version = json.loads(_ssh(f"curl -s http://127.0.0.1:{slot['port']}/version"))["version"]
    with open(pivot.targets / f"llmfleet-{MACHINE}.json", encoding="utf-8") as handle:
        groups = {g["labels"]["job"]: g for g in json.load(handle)}
    assert groups["llmfleet_vllm"] == {"targets": [f"127.0.0.1:{METRICS_PORT}"], "labels": {
        "job": "llmfleet_vllm", "__metrics_path__": "/slot/default/metrics", "host": MACHINE, "slot": "default",
        "model": "tiny-llama-b", "alias": "chat", "revision": slot["revision"], "gpu_ids": "", "engine_version": version,
        "revision_locked": "", "site": "itest"}}
    assert groups["llmfleet_gateway"]["targets"] == [f"127.0.0.1:{METRICS_PORT}"]
    assert groups["llmfleet_node"]["targets"] == [f"127.0.0.1:{NODE_PORT}"]

    up = prom.wait_query('up{job="llmfleet_vllm", slot="default"} == 1', lambda r: len(r) == 1)
    assert up[0][0]["model"] == "tiny-llama-b" and up[0][0]["engine_version"] == version, up
    served = prom.wait_query('vllm:num_requests_running{job="llmfleet_vllm", host="%s"}' % MACHINE,
                             lambda r: {(m["model"], m["revision"]) for m, _v in r} == {("tiny-llama-b", slot["revision"])})
    assert {m["alias"] for m, _v in served} == {"chat"}
    assert prom.query('vllm:num_requests_running{revision="%s"}' % record["previous_revision"]) == []
    assert [v for _m, v in prom.wait_query(
        'haproxy_backend_active_servers{job="llmfleet_gateway", proxy="slot_default"}', lambda r: len(r) == 1)] == [1]

    def one(expr):
        result = prom.wait_query(expr, lambda r: len(r) == 1)
        return result[0][1]
    assert one('llmfleet_pivot_last_downtime_seconds{slot="default"}') == record["downtime_s"] > 0
    assert one('llmfleet_pivot_last_timestamp_seconds{slot="default"}') == pytest.approx(record["new_ready_at"])
    assert one('llmfleet_pivot_last_load_seconds{slot="default"}') == pytest.approx(record["load_time_s"])
    assert one('llmfleet_pivot_last_info{slot="default", model="tiny-llama-b", previous_model="tiny-llama-b",'
               ' revision="%s", previous_revision="%s", strategy="stop_start", result="passed"}'
               % (record["revision"], record["previous_revision"])) == 1
    assert one('llmfleet_pivot_last_result{slot="default", result="passed"}') == 1
    for level in record["gate"]:
        assert one('llmfleet_pivot_last_gate_output_tokens_per_second{slot="default", concurrency="%s"}'
                   % level["concurrency"]) == pytest.approx(level["output_tok_s"])
    assert one('llmfleet_slot_info{slot="default", model="tiny-llama-b", port="%d"}' % slot["port"]) == 1
    assert one('llmfleet_slot_pivot_in_progress{slot="default"}') == 0
    assert one('node_textfile_scrape_error{job="llmfleet_node"}') == 0

    # Every dashboard query answers with data, but the GPU panels (no GPU here) and a table of what is wrong (none).
    empty = [(board, title, expr) for board, title, expr in _dashboard_queries()
             if "llmfleet_gpu_" not in expr and "== 0" not in expr and not prom.query(expr)]
    assert empty == [], empty

    checked = _observability_playbook(pivot)
    assert checked.returncode == 0, checked.stdout[-6000:]
    assert "changed=0" in checked.stdout.split("PLAY RECAP")[-1], checked.stdout[-4000:]
    _an_unreachable_prometheus_host_is_named_not_the_hosts_failure(pivot)
    removed = _observability_playbook(pivot, "-e", json.dumps({"observability_contract_extra": [
        {"metric": "vllm:time_per_output_token_seconds_bucket", "used_by": ["dashboard mine panel TPOT"]}]}))
    assert removed.returncode != 0, removed.stdout[-4000:]
    assert (f"{MACHINE} slot default (tiny-llama-b, vLLM {version}) does not export 1 metric(s) that dashboards or"
            " alert rules use:\\n- vllm:time_per_output_token_seconds_bucket, used by dashboard mine panel TPOT") \
        in removed.stdout, removed.stdout[-4000:]
    _gpu_timer_feeds_the_gpu_panels(pivot)


def _an_unreachable_prometheus_host_is_named_not_the_hosts_failure(pivot):
    """Issue 46 item 3: a Prometheus host that cannot be reached is refused by name before anything is written (not the
    served host marked unreachable); gone by the time a pivot publishes, it is a warning and the run goes on."""
    refused = _observability_playbook(pivot, "-e", "observability_prometheus_host=prom.invalid")
    recap = refused.stdout.split("PLAY RECAP")[-1]
    assert refused.returncode != 0 and "observability_prometheus_host prom.invalid cannot be reached" in refused.stdout, \
        refused.stdout[-4000:]
    assert re.search(MACHINE + r" +: ok=\d+ +changed=0 +unreachable=0 +failed=1", recap), recap
    play = pivot.results.parent / "publish-only.yml"
    play.write_text(json.dumps([{
        "hosts": MACHINE, "become": True, "gather_facts": False,
        "vars_files": [os.path.join(REPO, "playbooks", "vars", "run_defaults.yml")],
        "vars": {"observability_state_dir": "{{ llmfleet__state_dir }}", "observability_results_dir": str(pivot.results)},
        "tasks": [{"ansible.builtin.include_role": {"name": "llmfleet.vllm.observability", "tasks_from": "publish"}},
                  {"ansible.builtin.debug": {"msg": "the play went on"}}]}]))
    published = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible-playbook"), "-i", str(pivot.inventory), str(play),
                                "-e", "observability_prometheus_host=prom.invalid"],
                               capture_output=True, text=True, cwd=REPO, check=False, timeout=600)
    assert published.returncode == 0 and "the play went on" in published.stdout, published.stdout[-4000:]
    assert "WARNING: observability_prometheus_host prom.invalid could not be reached" in published.stdout, published.stdout[-4000:]


def _gpu_timer_feeds_the_gpu_panels(pivot):
    """Issue 43 item 3: playbooks/observability.yml installs the GPU timer (entry point gpu_metrics) on a host whose
    NVML is a TEST DOUBLE (tests/fixtures/nvml/pynvml.py in a venv of its own, a placeholder /dev/nvidiactl: no GPU here)
    with a .pth hook; the host's systemd runs it as a user of its own: node_exporter serves both fake GPUs to
    Prometheus, the dashboards' GPU panels have data, the file is root's (0644), the hook never ran; a re-run changes
    nothing."""
    _ssh("python3 -m venv --without-pip /opt/fakegpu && touch /dev/nvidiactl")
    [site] = glob.glob(os.path.join(TESTBED_STATE, MACHINE, "rootfs", "opt", "fakegpu", "lib", "python3*", "site-packages"))
    shutil.copy(os.path.join(REPO, "tests", "fixtures", "nvml", "pynvml.py"), site)
    with open(os.path.join(site, "zz-hook.pth"), "w", encoding="utf-8") as handle:
        handle.write("import sys; sys.stderr.write('HOOK RAN\\n')\n")
    gpu_python = ("-e", "observability_gpu_python=/opt/fakegpu/bin/python")
    installed = _observability_playbook(pivot, *gpu_python)
    assert installed.returncode == 0, installed.stdout[-6000:]
    power = pivot.prometheus.wait_query('llmfleet_gpu_power_watts{job="llmfleet_node"}', lambda r: len(r) == 2)
    assert sorted((m["gpu"], v) for m, v in power) == [("0", 123.456), ("1", 123.456)], power
    empty = [(board, title) for board, title, expr in _dashboard_queries()
             if "llmfleet_gpu_" in expr and not pivot.prometheus.query(expr)]
    assert empty == [], empty
    assert _ssh("ls -A /var/lib/prometheus/node-exporter | grep gpu; stat -c '%U %a' /var/lib/prometheus/node-exporter/"
                "llmfleet-gpu.prom").split("\n") == ["llmfleet-gpu.prom", "root 644"]
    assert "HOOK RAN" not in _ssh("journalctl --no-pager -u llmfleet-gpu-metrics.service")
    again = _observability_playbook(pivot, *gpu_python)
    assert again.returncode == 0 and "changed=0" in again.stdout.split("PLAY RECAP")[-1], again.stdout[-4000:]
    # The host has no GPU after all: later runs find none again.
    _ssh("systemctl disable --now llmfleet-gpu-metrics.timer; rm -f /dev/nvidiactl /var/lib/prometheus/node-exporter/llmfleet-gpu.prom")


def _gateway_status(path: str, *authorization: str, port: int = GW_PORT) -> int:
    """The status of GET path at the gateway with these Authorization headers, in order (none: no header); the keys
    stay in this process (no curl command line)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("GET", path)
        for value in authorization:
            conn.putheader("Authorization", value)
        conn.endheaders()
        return conn.getresponse().status
    finally:
        conn.close()


# Last in the module: the gateway keeps the keys afterwards.
def test_gateway_api_keys_let_in_exactly_the_configured_keys(pivot, tmp_path):
    """gateway_api_keys from a 0600 vars file (-e @file; keys never on a command line): exactly those keys pass as
    "Authorization: Bearer <key>"; "Bearer" alone, a wrong key, no header and a list of values get 401; /health 200.
    A metrics-only key (gateway_metrics_api_keys, issue 43) opens the metrics listener and not the API, which no API key
    opens; vLLM's dev paths stay 404 with a key even when every path is public (gateway_public_path_prefixes: [/])."""
    keys, metrics_key = ["sk-itest-one", "sk-itest-two"], "sk-itest-metrics"
    vars_file = tmp_path / "gateway-keys.json"
    vars_file.touch(mode=0o600)
    vars_file.write_text(json.dumps({"gateway_api_keys": keys, "gateway_metrics_api_keys": [metrics_key],
                                     "gateway_public_path_prefixes": ["/"]}))
    result = pivot("-e", f"model={_slot()['model']}", "-e", f"@{vars_file}")
    assert result.returncode == 0, result.stdout[-6000:]
    assert not any(key in result.stdout + result.stderr for key in keys + [metrics_key])
    assert _ssh("stat -c '%a %U' /etc/haproxy/llmfleet-keys.map /etc/haproxy/llmfleet-metrics-keys.map").split("\n") == ["600 root"] * 2
    dev = {path: _gateway_status(path, f"Bearer {keys[0]}") for path in ("/sleep", "/is_sleeping", "/server_info", "/%73leep")}
    assert dev == dict.fromkeys(dev, 404) and _gateway_status("/version", f"Bearer {keys[0]}") == 200, dev
    statuses = {
        "Bearer k1": _gateway_status("/v1/models", f"Bearer {keys[0]}"),
        "Bearer k2": _gateway_status("/v1/models", f"Bearer {keys[1]}"),
        "Bearer": _gateway_status("/v1/models", "Bearer"),
        "Bearer wrong": _gateway_status("/v1/models", "Bearer wrong"),
        "no header": _gateway_status("/v1/models"),
        "junk, Bearer": _gateway_status("/v1/models", "junk, Bearer"),
        "k1 without Bearer": _gateway_status("/v1/models", keys[0]),
        "two headers": _gateway_status("/v1/models", "Bearer wrong", f"Bearer {keys[0]}"),
        "metrics key": _gateway_status("/v1/models", f"Bearer {metrics_key}"),
        "/health": _gateway_status("/health"),
    }
    assert statuses == {"Bearer k1": 200, "Bearer k2": 200, "Bearer": 401, "Bearer wrong": 401, "no header": 401,
                        "junk, Bearer": 401, "k1 without Bearer": 401, "two headers": 401, "metrics key": 401,
                        "/health": 200}, statuses
    # The metrics listener wants the metrics-only key, and no API key; Prometheus scrapes again once its scrape config
    # has the metrics key.
    metrics = {(path, auth): _gateway_status(path, *auth, port=METRICS_PORT)
               for path in ("/metrics", "/slot/default/metrics", "/slot/nope/metrics")
               for auth in ((), (f"Bearer {keys[0]}",), (f"Bearer {metrics_key}",))}
    assert metrics == {("/metrics", ()): 401, ("/metrics", (f"Bearer {keys[0]}",)): 401, ("/metrics", (f"Bearer {metrics_key}",)): 200,
                       ("/slot/default/metrics", ()): 401, ("/slot/default/metrics", (f"Bearer {keys[0]}",)): 401,
                       ("/slot/default/metrics", (f"Bearer {metrics_key}",)): 200, ("/slot/nope/metrics", ()): 401,
                       ("/slot/nope/metrics", (f"Bearer {keys[0]}",)): 401, ("/slot/nope/metrics", (f"Bearer {metrics_key}",)): 404}, metrics
    # The listener binds loopback by default (gateway_metrics_bind_address), the API every address (gateway_bind_address).
    listeners = _ssh(f"ss -Hltn 'sport = :{METRICS_PORT}'; ss -Hltn 'sport = :{GW_PORT}'")
    assert f"127.0.0.1:{METRICS_PORT}" in listeners and f"0.0.0.0:{METRICS_PORT}" not in listeners, listeners
    assert f"0.0.0.0:{GW_PORT}" in listeners, listeners
    prom = pivot.prometheus
    prom.wait_query('up{job=~"llmfleet_vllm|llmfleet_gateway"} == 0', lambda r: len(r) == 2)
    credentials = tmp_path / "prometheus-credentials"
    credentials.touch(mode=0o600)
    credentials.write_text(metrics_key)
    prom.reload(str(credentials))
    prom.wait_query('up{job=~"llmfleet_vllm|llmfleet_gateway"} == 1', lambda r: len(r) == 2)
    # The keys are what the gateway promises its clients: a later run that does not give them keeps them (both kinds).
    # The API keys' map is first written as an older release wrote it ("Bearer <key> ok", whose first word HAProxy took
    # as the key): the run keeps the keys themselves, not "Bearer". That run pivots a second slot behind the gateway
    # (issue 44 item 0, below).
    old_map = os.path.join(os.environ.get("TESTBED_STATE", "/var/lib/llmfleet-testbed"), MACHINE, "rootfs", "etc", "haproxy",
                           "llmfleet-keys.map")
    with open(os.open(old_map, os.O_WRONLY | os.O_TRUNC, 0o600), "w") as handle:
        handle.write("# Authorization headers the gateway accepts (llmfleet.vllm.gateway)\n"
                     + "".join(f"Bearer {key} ok\n" for key in keys))
    _a_long_request_naming_its_model_last_reaches_that_slot(pivot, keys[1])
    assert [_gateway_status("/v1/models", value) for value in (f"Bearer {keys[0]}", f"Bearer {keys[1]}", "Bearer Bearer")] \
        == [200, 200, 401]
    assert _gateway_status("/v1/models") == 401
    assert (_gateway_status("/metrics", f"Bearer {keys[1]}", port=METRICS_PORT),
            _gateway_status("/metrics", f"Bearer {metrics_key}", port=METRICS_PORT)) == (401, 200)


# A second slot behind the same gateway: slot `other` serves tiny-llama-c (tiny-llama-b's repository under another
# name) on the STAND-IN vLLM server (STANDIN_VENV): what is tested is the gateway's route.
C_PORT = 8503


def _tiny_c() -> dict:
    with open(os.path.join(REPO, "catalog", "models.yml"), encoding="utf-8") as handle:
        entry = yaml.safe_load(handle)["tiny-llama-b"]
    return dict(entry, port=C_PORT, serving=dict(entry["serving"], **PORTS["tiny-llama-b"]["serving"]),
                description="tiny-llama-b's repository under another name")


def _chat_with_model_last(model: str, size: int, key: str) -> tuple:
    """POST a chat request of about `size` bytes whose "model" comes after its long "messages" (as curl scripts and some
    SDKs write it; JSON has no key order): (status, the answer's model or the error's code)."""
    words = "abcdefghijklmnopqrs " * (size // 20)  # about a token a word on the stand-in
    body = '{"messages": %s, "max_tokens": 2, "model": %s}' % (json.dumps([{"role": "user", "content": words}]), json.dumps(model))
    conn = http.client.HTTPConnection("127.0.0.1", GW_PORT, timeout=60)
    try:
        conn.request("POST", "/v1/chat/completions", body=body.encode(),
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        resp = conn.getresponse()
        answer = json.loads(resp.read())
        return resp.status, answer.get("model") or answer.get("error", {}).get("code")
    finally:
        conn.close()


def _a_long_request_naming_its_model_last_reaches_that_slot(pivot, key: str) -> None:
    """Issue 44 item 0: the gateway picks the slot from the body's "model", and HAProxy's default buffer held about
    15 KB of it: a longer request whose "model" came last went to the default slot (404 there). The gateway now holds
    each whole body up to gateway_max_request_bytes (-e, a string) and answers 413 above it, never routing on a part.
    The run gives no gateway keys (the caller checks that it kept them). Issue 44 item 2: -e pivot_hold=false (a string)
    is the new slot's promise, kept in its record beside its alias, the default slot's untouched."""
    result = pivot("-e", "slot=other", "-e", "model=tiny-llama-c", "-e", "pivot_gateway=true", "-e", f"vllm_install_venv={STANDIN_VENV}",
                   "-e", "gateway_max_request_bytes=65536", "-e", "pivot_hold=false",
                   "-e", json.dumps({"llmfleet_models_extra": dict(PORTS, **{"tiny-llama-c": _tiny_c()})}))
    assert result.returncode == 0, result.stdout[-6000:]
    assert "API key none (default), hold off (given)" in result.stdout, result.stdout[-6000:]
    slots = json.loads(_ssh("cat /var/lib/llmfleet/slots.json"))["slots"]
    assert slots["other"]["hold"] is False and "hold" not in slots["default"], slots
    # 30,000 bytes: twice what HAProxy's default buffer held, within the tiny model's context on the stand-in.
    routes = {(model, size): _chat_with_model_last(model, size, key) for model in ("tiny-llama-c", "other") for size in (1000, 30000)}
    assert routes == {(model, size): (200, model) for model in ("tiny-llama-c", "other") for size in (1000, 30000)}, routes
    assert _chat_with_model_last("chat", 1000, key) == (200, "chat")  # the default slot's alias still goes there
    assert _chat_with_model_last("tiny-llama-c", 70000, key) == (413, "request_too_large")
