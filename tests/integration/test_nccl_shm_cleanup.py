# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""llmfleet.vllm.nccl_shm_cleanup through real `ansible-playbook` runs (connection: local) on the
real /dev/shm, with real processes holding segments:

* a python process holding a multiprocessing.shared_memory.SharedMemory segment (fd + mapping),
* a python process that only has a segment mapped (fd closed, ctypes mmap),
* genuinely leaked segments (SharedMemory closed without unlink) and stale files,
* optionally a real PyTorch multiprocessing leftover (torch_* + sem.mp-* of a spawn child and
  torch_shm_manager), using a venv with torch's CPU build that the `torch_python` fixture
  creates once (LLMFLEET_TORCH_PYTHON points at another interpreter with torch).

Every run restricts `patterns` to names this test created, so other users' segments in
/dev/shm are never touched.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from multiprocessing import resource_tracker, shared_memory

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLAYBOOK_BIN = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
SHM = "/dev/shm"
TORCH_VENV = os.environ.get("LLMFLEET_TORCH_VENV", "/var/cache/llmfleet-testbed/torch-venv")
TORCH_VERSION = "2.13.0"  # the CPU build vLLM's CPU engine pins too

pytestmark = pytest.mark.skipif(not os.path.isdir(SHM), reason="no /dev/shm")


def play(tmp_path, args, check=False, diff=False):
    """Run the module once in a real playbook; return (module result, ansible-playbook stdout)."""
    out = tmp_path / ("result-%s.json" % uuid.uuid4().hex[:8])
    book = tmp_path / "play.yml"
    book.write_text(
        "- hosts: localhost\n"
        "  connection: local\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - name: clean\n"
        "      llmfleet.vllm.nccl_shm_cleanup: %s\n"
        "      register: r\n"
        "    - name: save\n"
        "      ansible.builtin.copy:\n"
        "        content: \"{{ r | to_json }}\"\n"
        "        dest: %s\n"
        "        mode: '0600'\n"
        "      check_mode: false\n"
        "      diff: false\n" % (json.dumps(args), out))
    cmd = [PLAYBOOK_BIN, "-i", "localhost,", "-e", "ansible_python_interpreter=" + sys.executable, str(book)]
    if check:
        cmd.append("--check")
    if diff:
        cmd.append("--diff")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0")
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout
    return json.loads(out.read_text()), proc.stdout


HOLDER = r"""
import ctypes, mmap, os, sys, time
from multiprocessing import resource_tracker, shared_memory
name, how = sys.argv[1], sys.argv[2]
shm = shared_memory.SharedMemory(name=name, create=True, size=1 << 20)
resource_tracker.unregister(shm._name, "shared_memory")  # a SIGKILL must leave it behind, as in a crash
shm.buf[:4] = b"live"
if how == "maps":
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fd = os.open("/dev/shm/" + name, os.O_RDWR)
    addr = libc.mmap(None, 1 << 20, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    os.close(fd)
    shm.close()  # closes SharedMemory's own fd and mmap: only the raw mapping is left
print("ready", flush=True)
time.sleep(600)
"""


def start_holder(name, how):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, name, how], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def fds_pointing_to(pid, path):
    found = []
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            if os.readlink("/proc/%d/fd/%s" % (pid, fd)) == path:
                found.append(fd)
        except OSError:
            pass
    return found


def leak_segment(name, size=8192):
    """A real leaked SharedMemory segment: created, written, closed, never unlinked."""
    seg = shared_memory.SharedMemory(name=name, create=True, size=size)
    resource_tracker.unregister(seg._name, "shared_memory")
    seg.buf[:5] = b"stale"
    seg.close()
    return os.path.join(SHM, name)


def touch(path, age=0):
    with open(path, "wb") as fh:
        fh.write(b"x" * 100)
    if age:
        t = time.time() - age
        os.utime(path, (t, t))
    return path


@pytest.fixture
def tag():
    tag = uuid.uuid4().hex[:8]
    yield tag
    for name in os.listdir(SHM):
        if tag in name:
            os.unlink(os.path.join(SHM, name))


def kill9(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()


def test_live_segments_kept_stale_removed_then_removed_after_sigkill(tmp_path, tag):
    live = "psm_%s_live" % tag
    mapped = "psm_%s_mapped" % tag
    holder_fd = start_holder(live, "fd")
    holder_map = start_holder(mapped, "maps")
    try:
        # precondition: the second holder has no fd on its segment, only a mapping
        assert fds_pointing_to(holder_map.pid, os.path.join(SHM, mapped)) == []
        assert fds_pointing_to(holder_fd.pid, os.path.join(SHM, live)) != []
        stale = [leak_segment("psm_%s_stale" % tag), touch(os.path.join(SHM, "nccl-%s-stale" % tag), 7200),
                 touch(os.path.join(SHM, "sem.mp-%s" % tag)), touch(os.path.join(SHM, "torch_%s_1_0" % tag))]
        other = touch(os.path.join(SHM, "other-%s" % tag))
        args = {"use_default_patterns": False,
                "patterns": ["psm_%s_*" % tag, "nccl-%s*" % tag, "sem.mp-%s*" % tag, "torch_%s_*" % tag]}
        expected_removed = sorted(os.path.basename(p) for p in stale)

        # check mode: reports, removes nothing
        result, stdout = play(tmp_path, args, check=True, diff=True)
        assert result["changed"] is True
        assert sorted(r["name"] for r in result["removed"]) == expected_removed
        assert all(os.path.exists(p) for p in stale)
        assert "-nccl-%s-stale" % tag in stdout and "+++ after" in stdout  # the diff
        assert result["bytes_freed"] == 8192 + 3 * 100

        # the lease probe off: /proc alone (fd AND maps) must protect both holders
        result, _x = play(tmp_path, dict(args, lease_probe=False))
        kept = {k["name"]: k for k in result["kept"] if k["name"].startswith("psm_%s" % tag)}
        assert kept[live]["reason"] == "in_use" and kept[live]["detected_by"] == "proc"
        assert {(h["pid"], h["via"]) for h in kept[live]["holders"]} == {(holder_fd.pid, "fd"), (holder_fd.pid, "maps")}
        assert [(h["pid"], h["via"]) for h in kept[mapped]["holders"]] == [(holder_map.pid, "maps")]
        if result["unreadable_pids"]:
            # some process (e.g. a sandbox's pid 1) could not be inspected and there is no lease
            # probe to settle it: root's stale files must be kept, not removed
            assert result["removed"] == [] and all(os.path.exists(p) for p in stale)
            assert {k["reason"] for k in result["kept"] if k["name"] in expected_removed} == {"holder_unverifiable"}
        else:
            assert sorted(r["name"] for r in result["removed"]) == expected_removed

        # for real, lease probe on (default)
        result, _x = play(tmp_path, args)
        if not os.path.exists(stale[0]) and result["removed"] == []:
            pass  # already removed by the run above (all processes were readable)
        else:
            assert result["changed"] is True
            assert sorted(r["name"] for r in result["removed"]) == expected_removed
        assert not any(os.path.exists(p) for p in stale)
        kept = {k["name"]: k for k in result["kept"] if k["name"].startswith("psm_%s" % tag)}
        assert kept[live]["reason"] == "in_use" and kept[mapped]["reason"] == "in_use"
        assert os.path.exists(os.path.join(SHM, live)) and os.path.exists(os.path.join(SHM, mapped))
        assert os.path.exists(other)

        # nothing stale left: unchanged, live ones still kept
        result, _x = play(tmp_path, args)
        assert result["changed"] is False and result["removed"] == []
        assert {k["name"] for k in result["kept"] if k["reason"] == "in_use"} >= {live, mapped}
    finally:
        kill9(holder_fd)
        kill9(holder_map)

    # the holders are gone (SIGKILL, no cleanup ran): now both segments are stale
    assert os.path.exists(os.path.join(SHM, live)) and os.path.exists(os.path.join(SHM, mapped))
    result, _x = play(tmp_path, args, check=True)
    assert sorted(r["name"] for r in result["removed"]) == sorted([live, mapped])
    assert os.path.exists(os.path.join(SHM, live))
    result, _x = play(tmp_path, args)
    assert result["changed"] is True and sorted(r["name"] for r in result["removed"]) == sorted([live, mapped])
    assert result["bytes_freed"] == 2 << 20
    assert not os.path.exists(os.path.join(SHM, live)) and not os.path.exists(os.path.join(SHM, mapped))
    result, _x = play(tmp_path, args)
    assert result["changed"] is False


def test_default_patterns_min_age_and_not_matching(tmp_path):
    """Default patterns on a private directory inside /dev/shm, with a real holder."""
    path = os.path.join(SHM, "llmfleet-itest-%s" % uuid.uuid4().hex[:8])
    os.mkdir(path)
    holder = None
    try:
        for name in ("nccl-old", "psm_old", "sem.mp-old", "torch_1_2_old"):
            touch(os.path.join(path, name), age=3600)
        touch(os.path.join(path, "torch_young"))
        touch(os.path.join(path, "pulse-shm-123"), age=3600)
        held = touch(os.path.join(path, "nccl-held"), age=3600)
        holder = subprocess.Popen([sys.executable, "-c", "import sys,time; f=open(sys.argv[1]); print('ready', flush=True); "
                                   "time.sleep(600)", held], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "ready"
        result, _x = play(tmp_path, {"path": path, "min_age": 600})
        assert sorted(r["name"] for r in result["removed"]) == ["nccl-old", "psm_old", "sem.mp-old", "torch_1_2_old"]
        reasons = {k["name"]: k["reason"] for k in result["kept"]}
        assert reasons == {"torch_young": "too_young", "pulse-shm-123": "not_matching", "nccl-held": "in_use"}
        assert sorted(os.listdir(path)) == ["nccl-held", "pulse-shm-123", "torch_young"]
        result, _x = play(tmp_path, {"path": path, "min_age": 600, "report_not_matching": False})
        assert result["changed"] is False and "pulse-shm-123" not in [k["name"] for k in result["kept"]]
    finally:
        if holder:
            kill9(holder)
        for name in os.listdir(path):
            os.unlink(os.path.join(path, name))
        os.rmdir(path)


def test_bad_path_fails(tmp_path):
    book = tmp_path / "bad.yml"
    book.write_text("- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n"
                    "    - llmfleet.vllm.nccl_shm_cleanup:\n        path: /nonexistent/shm\n")
    proc = subprocess.run([PLAYBOOK_BIN, "-i", "localhost,", "-e", "ansible_python_interpreter=" + sys.executable,
                           str(book)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=120, env=dict(os.environ, ANSIBLE_NOCOLOR="1"), check=False)
    assert proc.returncode != 0 and "is not a directory" in proc.stdout


TORCH_HOLDER = r"""
import json, os, sys, time
import torch, torch.multiprocessing as tmp
def child(q, done):
    t = q.get(); done.put(float(t.sum())); time.sleep(600)
if __name__ == "__main__":
    tmp.set_sharing_strategy("file_system")
    ctx = tmp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(q, done), daemon=True)
    p.start()
    shared = torch.arange(1 << 20, dtype=torch.float32)
    q.put(shared)
    done.get(timeout=120)
    print(json.dumps({"pid": os.getpid(), "child": p.pid}), flush=True)
    time.sleep(600)
"""


def _session_and_children(leader):
    """pids in the leader's session plus its direct children in other sessions (torch_shm_manager calls setsid)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ppid, sid = int(fields[1]), int(fields[3])
        if sid == leader or ppid == leader:
            pids.append(int(entry))
    return pids


@pytest.fixture(scope="session")
def torch_python():
    """An interpreter with torch's CPU build: $LLMFLEET_TORCH_PYTHON, or a cached venv made here."""
    if os.environ.get("LLMFLEET_TORCH_PYTHON"):
        return os.environ["LLMFLEET_TORCH_PYTHON"]
    python = os.path.join(TORCH_VENV, "bin", "python")
    probe = [python, "-c", "import torch; assert torch.__version__.startswith('%s')" % TORCH_VERSION]
    if not os.access(python, os.X_OK) or subprocess.run(probe, capture_output=True, check=False).returncode != 0:
        subprocess.run([sys.executable, "-m", "venv", "--clear", TORCH_VENV], check=True)
        local_wheels = os.path.isdir("/opt/wheels") and any(
            f.startswith("torch-%s+cpu" % TORCH_VERSION) for f in os.listdir("/opt/wheels"))
        source = ["--find-links", "/opt/wheels"] if local_wheels else ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]
        subprocess.run([python, "-m", "pip", "install", "-q", "torch==%s+cpu" % TORCH_VERSION, *source], check=True)
        subprocess.run(probe, check=True)
    return python


def test_real_torch_multiprocessing_leftovers(tmp_path, torch_python):
    before = set(os.listdir(SHM))
    script = tmp_path / "torch_holder.py"
    script.write_text(TORCH_HOLDER)
    proc = subprocess.Popen([torch_python, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True,
                            cwd=str(tmp_path))
    pids = []
    try:
        info = json.loads(proc.stdout.readline())
        pids = _session_and_children(proc.pid)  # before any assertion, so the finally kills them all
        created = sorted(set(os.listdir(SHM)) - before)
        torch_segs = [n for n in created if n.startswith("torch_%d_" % info["pid"])]
        maps = ""
        for pid in (info["pid"], info["child"]):
            with open("/proc/%d/maps" % pid) as fh:
                maps += fh.read()
        # only the semaphores our holder maps (another process may create sem.mp-* meanwhile)
        sems = [n for n in created if n.startswith("sem.mp-") and "/dev/shm/" + n in maps]
        assert torch_segs, created
        args = {"use_default_patterns": False, "patterns": ["torch_%d_*" % info["pid"]] + sems}
        result, _x = play(tmp_path, args)
        assert result["changed"] is False, result
        kept = {k["name"]: k for k in result["kept"]}
        for name in torch_segs:
            assert kept[name]["reason"] == "in_use", result
            assert {h["pid"] for h in kept[name]["holders"]} == {info["pid"], info["child"]}, result
        assert info["child"] in pids and proc.pid in pids, (pids, info)
    finally:
        for pid in pids or [proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        proc.stdout.close()
    time.sleep(1)
    leftovers = [n for n in torch_segs + sems if os.path.exists(os.path.join(SHM, n))]
    assert set(torch_segs) <= set(leftovers), (pids, leftovers)  # torch_shm_manager was killed too
    result, _x = play(tmp_path, args)
    assert result["changed"] is True, result
    assert sorted(r["name"] for r in result["removed"]) == sorted(leftovers), result
    assert not any(os.path.exists(os.path.join(SHM, n)) for n in leftovers)
