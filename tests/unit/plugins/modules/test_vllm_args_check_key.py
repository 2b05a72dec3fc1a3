# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the accepted-command-line cache of llmfleet.vllm.vllm_args_check keys on (the parse itself runs against the
real vLLM in tests/integration/test_catalog_argv.py), and who runs the parse."""
import json
import os
import pathlib
import pwd
import shutil
import subprocess
import sys
import tempfile

import pytest
from bare_venv import bare_venv

from ansible_collections.llmfleet.vllm.plugins.modules import vllm_args_check

REPO = pathlib.Path(__file__).resolve().parents[4]
BIN = pathlib.Path(sys.executable).parent


def test_port_and_address_values_do_not_change_the_key_anything_else_does():
    base = ["/srv/models/m", "--host", "127.0.0.1", "--port", "8001", "--max-model-len", "256"]
    keyed = vllm_args_check.key_commands({"m": base})
    assert keyed == {"m": ["/srv/models/m", "--host", "<--host>", "--port", "<--port>", "--max-model-len", "256"]}
    other_port = list(base)
    other_port[4] = "8002"
    other_host = list(base)
    other_host[2] = "0.0.0.0"
    assert vllm_args_check.key_commands({"m": other_port}) == keyed == vllm_args_check.key_commands({"m": other_host})
    # A flag's value elsewhere, the model path, a flag named like a port's value: all still part of the key.
    for changed in (base[:6] + ["512"], ["/srv/models/n"] + base[1:], base + ["--port-offset", "1"]):
        assert vllm_args_check.key_commands({"m": changed}) != keyed
    # Values of the blind flags only: "--port" as the last word has no value to hide.
    assert vllm_args_check.key_commands({"m": ["/m", "--port"]}) == {"m": ["/m", "--port"]}


# ------------------------------------------------------------------ issue 43: no code of the vLLM venv runs as root

# What a package of the venv could ship: a .pth line runs at every start of a Python that processes the site.
PTH_HOOK = "import os; open(%r, 'a').write('%%d\\n' %% os.getuid())\n"  # the log's path filled in


def _standin_venv(base):
    """A venv holding the STAND-IN vllm package (tests/standin/vllm: its serve parser takes the CHECKER's calls), its
    dist-info as the test bed writes it, and a .pth hook that logs the uid of every Python that runs it."""
    venv = base / "venv"
    site = bare_venv(venv)
    shutil.copytree(REPO / "tests" / "standin" / "vllm", site / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "vllm-0.0.0+standin.dist-info").mkdir()
    (site / "vllm-0.0.0+standin.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.0.0+standin\n")
    (site / "zz-hook.pth").write_text(PTH_HOOK % str(base / "hooks" / "uids"))
    return venv


def site_of(venv):
    [site] = venv.glob("lib/python3*/site-packages")
    return site


def _check(base, venv, user):
    args = {"commands": {"m": ["/srv/models/m", "--max-model-len", "256"]}, "python": str(venv / "bin" / "python"),
            "user": user, "cache_file": str(base / "accepted.json")}
    done = subprocess.run([str(BIN / "ansible"), "localhost", "-c", "local", "-e", "ansible_python_interpreter=%s" % sys.executable,
                           "-m", "llmfleet.vllm.vllm_args_check", "-a", json.dumps(args)],
                          capture_output=True, text=True, cwd=REPO, check=False,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
                                   ANSIBLE_CALLBACK_RESULT_FORMAT="json", LLMFLEET_SECRET_OF_THE_PLAY="sk-not-for-vllm"))
    return done.returncode, json.loads(done.stdout.split(" => ", 1)[1])


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the check as another user, which needs root (CI runs as root)")
def test_the_parse_runs_as_the_service_user_and_root_runs_no_pth_file_of_the_venv():
    """The module under the controller's Python starts the installation's only as the service user (here nobody): the
    venv's .pth hook logs that user's uid and never root's; the cache's key is read with -S (the second run is a hit
    that starts nothing with a site)."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="llmfleet-argscheck-"))
    try:
        base.chmod(0o755)
        (base / "hooks").mkdir()
        (base / "hooks").chmod(0o1777)
        venv = _standin_venv(base)
        nobody = pwd.getpwnam("nobody").pw_uid
        rc, result = _check(base, venv, "nobody")
        assert rc == 0 and result["commands_checked"] == {"m": {"ok": True, "error": None}}, result
        assert result["cached"] is False and result["vllm_version"] == "0.0.0+standin", result
        # (A venv's site-packages may be on the path twice, lib and lib64: each start logs once per entry.)
        logged = (base / "hooks" / "uids").read_text().split()
        assert logged and set(logged) == {str(nobody)}, logged
        rc, again = _check(base, venv, "nobody")
        assert rc == 0 and again["cached"] is True, again
        assert (base / "hooks" / "uids").read_text().split() == logged
        # The user's environment is its own: nothing of the module's (a play's secrets) reaches it.
        env_log = base / "hooks" / "env"
        (site_of(venv) / "zz-env.pth").write_text("import os; open(%r, 'w').write(repr(sorted(os.environ)))\n" % str(env_log))
        (base / "accepted.json").unlink()
        rc, _again = _check(base, venv, "nobody")
        assert rc == 0 and "LLMFLEET_SECRET_OF_THE_PLAY" not in env_log.read_text() and "'HOME'" in env_log.read_text()
        # Without a user, as root, the module refuses; with user root (meant) the parse runs as root: the hook says so,
        # so the checks above can fail.
        rc, refused = _check(base, venv, "")
        assert rc != 0 and "python is given without user" in refused["msg"], refused
        (base / "accepted.json").unlink()
        rc, as_root = _check(base, venv, "root")
        assert rc == 0 and set((base / "hooks" / "uids").read_text().split()) == {str(nobody), "0"}, as_root
        rc, unknown = _check(base, venv, "no-such-user-here")
        assert rc != 0 and "user no-such-user-here: no such user on this host" in unknown["msg"], unknown
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_runs_that_remember_side_by_side_each_keep_their_entries(tmp_path):
    """Test hosts of one run share one cache folder (tools/testbed/testbed.sh, TESTBED_ARGS_CACHE), and two slots of a
    host may check at once: every remembered entry stays (a lock around the read and the write)."""
    cache = str(tmp_path / "cache" / "accepted.json")
    children = []
    for writer in range(3):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                for n in range(15):
                    vllm_args_check.remember(cache, "w%d-%02d" % (writer, n), {"ok": True})
            finally:
                os._exit(0)  # pylint: disable=protected-access
        children.append(pid)
    for pid in children:
        assert os.waitpid(pid, 0)[1] == 0
    assert len(vllm_args_check.read_cache(cache)) == 45
