# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The helpers of the H200 vLLM run (tools/device, docs/gpu-validation.md), on this GPU-less host:
unit_runner's systemd parsing, its start/stop of a real process and the systemctl shim that
roles/service_deploy's wait-ready.py reads, and random_llama's padded tokenizer."""
from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEVICE = os.path.join(REPO, "tools", "device")
sys.path.insert(0, DEVICE)

import unit_runner  # noqa: E402

WAIT_READY = os.path.join(REPO, "roles", "service_deploy", "files", "wait-ready.py")


def test_split_words_follows_systemd_quoting():
    assert unit_runner.split_words('a "b c" \'d e\' f\\"g "h\\\\i" "j\\"k"') == ["a", "b c", "d e", 'f"g', "h\\i", 'j"k']
    assert unit_runner.split_words("  ") == []


def test_command_line_expands_specifiers_and_dollars():
    prefixes, argv = unit_runner.command_line('+/bin/x --a "%C/y z" 100%% $$HOME')
    assert prefixes == "+"
    assert argv == ["/bin/x", "--a", "/var/cache/y z", "100%", "$HOME"]
    with pytest.raises(ValueError, match="%h"):
        unit_runner.command_line("/bin/x %h")


def test_environment_file_unescapes_what_systemd_env_file_writes():
    from ansible_collections.llmfleet.vllm.plugins.module_utils.serve_args import env_file
    env = {"A": 'x "q" $y `z` \\w', "B": True, "C": 0.9}
    assert unit_runner.environment_file("# comment\n\n" + env_file(env)) == {"A": 'x "q" $y `z` \\w', "B": "1", "C": "0.9"}


def test_parse_unit_joins_continuations_and_lists_what_is_not_emulated():
    unit = unit_runner.parse_unit(
        "[Unit]\nDescription=x\n[Service]\nUser=vllm\nEnvironmentFile=/etc/x.env\nCacheDirectory=c\nRuntimeDirectory=l/u\n"
        "WorkingDirectory=%C/c\nEnvironment=HOME=%C/c XDG_CACHE_HOME=%C/c\nExecStartPre=+/usr/bin/pre\n"
        "ExecStart=/opt/v/bin/vllm serve /m \\\n    --port 8000 \\\n    --served-model-name m\n"
        "LimitNOFILE=65536\nLimitMEMLOCK=infinity\nUMask=0077\nNoNewPrivileges=true\nTimeoutStopSec=120\n"
        "ProtectSystem=strict\nRestart=on-failure\n")
    assert unit["argv"] == ["/opt/v/bin/vllm", "serve", "/m", "--port", "8000", "--served-model-name", "m"]
    assert unit["exec_start_pre"] == [("+", ["/usr/bin/pre"])]
    assert unit["environment"] == {"HOME": "/var/cache/c", "XDG_CACHE_HOME": "/var/cache/c"}
    assert unit["workingdirectory"] == "/var/cache/c" and unit["umask"] == 0o077 and unit["timeout_stop_s"] == 120
    assert unit["limitmemlock"] == unit_runner.resource.RLIM_INFINITY and unit["no_new_privileges"] is True
    assert unit["runtimedirectory"] == "l/u"
    assert unit["ignored"] == ["ProtectSystem=strict", "Restart=on-failure"]


@pytest.fixture
def state_dir(monkeypatch):
    """A directory the unit's user (nobody) can read, unlike pytest's 0700 tmp_path."""
    import pathlib
    import shutil
    import tempfile
    path = pathlib.Path(tempfile.mkdtemp(prefix="llmfleet-unit-runner-"))
    os.chmod(path, 0o755)
    monkeypatch.setattr(unit_runner, "STATE_DIR", str(path / "state"))
    monkeypatch.setenv("LLMFLEET_UNIT_STATE_DIR", str(path / "state"))  # the systemctl shim's processes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_systemctl_shim_answers_what_wait_ready_reads(state_dir, capsys):
    unit_runner.write_state("u.service", {"ActiveState": "active", "NRestarts": 0,
                                          "ExecMainStartTimestampMonotonic": 1500000, "MainPID": 42})
    assert unit_runner.systemctl(["show", "-P", "ExecMainStartTimestampMonotonic", "u.service"]) == 0
    assert unit_runner.systemctl(["show", "--property=ActiveState,NRestarts", "u.service"]) == 0
    assert unit_runner.systemctl(["is-active", "nothing.service"]) == 3
    assert capsys.readouterr().out.splitlines() == ["1500000", "ActiveState=active", "NRestarts=0", "inactive"]


PYTHON_FOR_NOBODY = "/usr/bin/python3"  # the venv's interpreter may sit where nobody cannot reach it


@pytest.mark.skipif(os.geteuid() != 0 or not os.access(PYTHON_FOR_NOBODY, os.X_OK),
                    reason="starting a unit as its User= needs root and a system python3")
def test_start_wait_ready_and_stop_a_real_process(state_dir):
    """A unit whose ExecStart is a small HTTP server: start as nobody, wait-ready.py through the shim, stop."""
    port = 18000 + os.getpid() % 1000
    server = state_dir / "srv.py"
    server.write_text(
        "import http.server, json, os, sys\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        body = json.dumps({'uid': os.getuid(), 'cwd': os.getcwd(), 'foo': os.environ.get('FOO'),\n"
        "                           'home': os.environ.get('HOME'), 'argv': sys.argv[1:],\n"
        "                           'run_dir_writable': os.access(sys.argv[3], os.W_OK)}).encode()\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
        "    def log_message(self, *a): pass\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")
    (state_dir / "u.env").write_text('FOO="bar \\"baz\\""\n')
    cache = "llmfleet-unit-runner-test-%d" % os.getpid()
    # As systemd makes RuntimeDirectory= (the launcher's run directory, vllm-launch.py): the unit's user's, parents root's.
    run_dir = "/run/%s/unit" % cache
    (state_dir / "u.service").write_text(
        "[Service]\nUser=nobody\nEnvironmentFile=%s\nCacheDirectory=%s\nRuntimeDirectory=%s/unit\n"
        "WorkingDirectory=%%C/%s\nEnvironment=HOME=%%C/%s\nExecStartPre=+/bin/true\n"
        "ExecStart=%s %s %d \"a b\" %s\nTimeoutStopSec=10\n"
        % (state_dir / "u.env", cache, cache, cache, cache, PYTHON_FOR_NOBODY, server, port, run_dir))
    shims = state_dir / "shims"
    env = dict(os.environ, PATH="%s:%s" % (shims, os.environ["PATH"]))
    try:
        started = unit_runner.start(str(state_dir / "u.service"))
        assert started["state"]["ActiveState"] == "active" and started["user"] == "nobody"
        subprocess.run([sys.executable, os.path.join(DEVICE, "unit_runner.py"), "shims", str(shims)], check=True)
        ready = subprocess.run([sys.executable, WAIT_READY, "u.service", "http://127.0.0.1:%d/" % port, "30", "0.1"],
                               env=env, capture_output=True, text=True, check=True)
        assert 0 <= json.loads(ready.stdout)["time_to_ready_s"] < 30
        import urllib.request
        seen = json.loads(urllib.request.urlopen("http://127.0.0.1:%d/" % port, timeout=5).read())
        assert seen == {"uid": pwd.getpwnam("nobody").pw_uid, "cwd": "/var/cache/" + cache, "foo": 'bar "baz"',
                        "home": "/var/cache/" + cache, "argv": [str(port), "a b", run_dir], "run_dir_writable": True}
    finally:
        stopped = unit_runner.stop("u.service")
        subprocess.run(["rm", "-rf", "/var/cache/" + cache, "/run/" + cache], check=False)
    assert stopped["was"] == "active" and stopped["active_state"] == "inactive"
    assert unit_runner.read_state("u.service")["MainPID"] == 0


def test_padded_tokenizer_decodes_every_id_and_never_encodes_padding():
    pytest.importorskip("tokenizers")
    sys.path.insert(0, os.path.join(REPO, "tools", "tinymodels"))
    import random_llama
    from tiny_tokenizer import VOCAB_SIZE, train_tokenizer
    tok = random_llama.padded_tokenizer(train_tokenizer(), 4096)
    assert tok.get_vocab_size() == 4096
    assert tok.decode([VOCAB_SIZE, 4095]) == " t%d t4095" % VOCAB_SIZE
    ids = tok.encode("the quick brown fox t1500 jumps over t4095 lazy dogs").ids
    assert ids and max(ids) < VOCAB_SIZE
