# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The STAND-IN vLLM server (tests/standin/vllm, for tests of the collection's own logic) held to the real vLLM CPU
server of this run: the same statuses and the same shapes (keys and value types) from every endpoint the collection
reads -- /health, /version, /v1/models, completions and chat completions with and without logprobs, prompt logprobs,
the SSE framing of both streams and their usage chunks, the error bodies of an unknown model and a bad request,
/tokenize -- and the same labels on the metric families the drain, the gate and the dashboards read
(tests/standin/contract.py). A vLLM upgrade that changes any of them fails here until the stand-in follows."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STANDIN = os.path.join(REPO, "tests", "standin")
sys.path.insert(0, STANDIN)
import contract  # noqa: E402  pylint: disable=wrong-import-position


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(model_dir, port, *extra, env=None):
    return subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model_dir, "--host", "127.0.0.1",
                             "--port", str(port), "--served-model-name", "tiny-llama-a", "--max-model-len", "256",
                             "--enforce-eager", *extra],
                            env=dict(os.environ, PYTHONPATH=STANDIN, **(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait(url, proc, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(url)


@pytest.fixture(scope="module")
def standin(tiny_models):
    port = _free_port()
    proc = _start(os.path.join(tiny_models, "tiny-llama-a"), port)
    url = "http://127.0.0.1:%d" % port
    try:
        _wait(url, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_standin_answers_in_the_shape_of_the_real_vllm_server(vllm_server, standin):
    real = contract.probe(vllm_server.base_url, vllm_server.model)
    stand = contract.probe(standin, "tiny-llama-a")
    differences = {name: {"real": real[name], "standin": stand.get(name)} for name in real if stand.get(name) != real[name]}
    assert not differences, json.dumps(differences, indent=1)[:6000]
    # What the comparison rests on: the real server's own answers (a probe that read nothing would compare nothing).
    assert real["models"]["status"] == 200 and real["completion_stream"]["last"] == "[DONE]"
    assert set(real["metrics"]) == set(contract.METRICS) and real["unknown_model"]["status"] == 404


def test_the_standin_is_named_a_standin_answers_the_same_prompt_alike_and_refuses_a_model_without_config(standin, tmp_path):
    with urllib.request.urlopen(standin + "/version") as resp:
        assert json.load(resp)["version"].endswith("+standin")
    body = json.dumps({"model": "tiny-llama-a", "prompt": "Paris is", "max_tokens": 5, "logprobs": 1}).encode()

    def complete():
        request = urllib.request.Request(standin + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request) as resp:
            return json.load(resp)["choices"][0]

    first, second = complete(), complete()
    assert first["text"] == second["text"] and first["logprobs"] == second["logprobs"] and first["finish_reason"] == "length"
    empty = tmp_path / "no-config"
    empty.mkdir()
    proc = _start(str(empty), _free_port())
    assert proc.wait(timeout=20) != 0 and "config.json" in proc.stdout.read()


def test_the_standin_wants_the_api_key_it_is_given_on_v1_only(tiny_models):
    port = _free_port()
    proc = _start(os.path.join(tiny_models, "tiny-llama-a"), port, env={"VLLM_API_KEY": "standin-secret"})
    url = "http://127.0.0.1:%d" % port
    try:
        _wait(url, proc)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url + "/v1/models")
        assert refused.value.code == 401
        request = urllib.request.Request(url + "/v1/models", headers={"Authorization": "Bearer standin-secret"})
        with urllib.request.urlopen(request) as resp:
            assert json.load(resp)["data"][0]["id"] == "tiny-llama-a"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_test_bed_puts_the_standin_on_a_host_as_a_venv_that_systemd_runs(vllm_server):
    """`testbed.sh standin` on the real server's host: /opt/vllm-standin is a venv over the host's python3 (no pip, no
    vLLM) whose `vllm serve` runs under systemd as the vllm user and answers; its argument parser takes any option (a
    host on the stand-in does not check vLLM's flags), while the real /opt/vllm beside it still refuses a wrong one."""
    testbed = os.path.join(REPO, "tools", "testbed", "testbed.sh")
    subprocess.run([testbed, "standin", vllm_server.machine], check=True, capture_output=True)
    port = _free_port()
    started = vllm_server.machine_exec(
        "systemd-run", "--unit=itest-standin", "--uid=vllm", "/opt/vllm-standin/bin/vllm", "serve", "/srv/models/tiny-llama-a",
        "--served-model-name", "tiny-llama-a", "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", "4", check=False)
    assert started.returncode == 0, started.stderr
    url = "http://127.0.0.1:%d" % port
    try:
        deadline = time.monotonic() + 20
        while not _healthy(url):
            journal = ["journalctl", "-u", "itest-standin", "--no-pager"]
            assert time.monotonic() < deadline, vllm_server.machine_exec(*journal, check=False).stdout
            time.sleep(0.1)
        assert contract.probe(url, "tiny-llama-a")["completion_stream"]["last"] == "[DONE]"
        parse = ("from vllm.entrypoints.cli import serve; from vllm.utils.argparse_utils import FlexibleArgumentParser as P; "
                 "p = P(prog='vllm'); c = serve.cmd_init()[0]; c.subparser_init(p.add_subparsers(dest='s')); "
                 "print(p.parse_args(['serve', 'm', '--no-such-flag', '--port', '1']).port)")
        assert vllm_server.machine_exec("/opt/vllm-standin/bin/python3", "-c", f'"{parse}"').stdout.strip() == "1"
        real = vllm_server.machine_exec("/opt/vllm/bin/python3", "-c", f'"{parse}"', check=False)
        assert real.returncode != 0 and "unrecognized arguments: --no-such-flag" in real.stderr, real.stderr[-2000:]
    finally:
        vllm_server.machine_exec("systemctl", "stop", "itest-standin", check=False)


def _healthy(url):
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False
