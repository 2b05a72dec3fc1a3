# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""module_utils/shm_segments: /proc parsing, the removal plan, the kernel lease probe.

Fake /proc trees (directories with real symlinks and maps files) stand in for processes where a
case cannot be produced on demand (a process vanishing between listdir and readlink); everything
else uses real files in /dev/shm and real processes. The module end to end, with live holders
and SIGKILL, is in tests/integration/test_nccl_shm_cleanup.py.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from ansible_collections.llmfleet.vllm.plugins.module_utils import shm_segments as shm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
FIX = os.path.join(REPO, "tests", "fixtures", "nvidia")
SHM = "/dev/shm"


@pytest.fixture
def shmdir():
    """A private directory in the real tmpfs /dev/shm (so leases and mmaps behave as in production)."""
    base = SHM if os.path.isdir(SHM) else "/tmp"
    path = os.path.join(base, "llmfleet-unit-%s" % uuid.uuid4().hex[:10])
    os.mkdir(path)
    yield path
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if os.path.isdir(full):
            os.rmdir(full)
        else:
            os.unlink(full)
    os.rmdir(path)


def touch(path, size=0, age=0):
    with open(path, "wb") as fh:
        fh.write(b"\0" * size)
    if age:
        t = time.time() - age
        os.utime(path, (t, t))
    return path


def hold(path, how="fd"):
    """A real process holding `path` open (fd) or only mapped (maps, fd closed)."""
    code = r"""
import ctypes, mmap, os, sys, time
path, how = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDWR)
if how == "maps":
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    addr = libc.mmap(None, 4096, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    os.close(fd)
print("ready", flush=True)
time.sleep(600)
"""
    proc = subprocess.Popen([sys.executable, "-c", code, path, how], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def stop(proc):
    proc.kill()
    proc.wait()
    proc.stdout.close()


# ------------------------------------------------------------------ parsing

def test_parse_maps_line_variants():
    line = "7f1c2a000000-7f1c2a100000 rw-s 00000000 00:1a 123456                     /dev/shm/psm_abc\n"
    assert shm._parse_maps_line(line) == (os.makedev(0, 0x1a), 123456, "/dev/shm/psm_abc")
    spaced = "7f1c2a000000-7f1c2a100000 rw-s 00000000 00:1a 99  /dev/shm/odd name (deleted)"
    assert shm._parse_maps_line(spaced)[2] == "/dev/shm/odd name (deleted)"
    assert shm._parse_maps_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0                  [stack]") is None
    assert shm._parse_maps_line("55d0c000-55d0d000 r--p 00000000 00:00 0 ") is None
    assert shm._parse_maps_line("garbage") is None
    assert shm._strip_deleted("/dev/shm/x (deleted)") == ("/dev/shm/x", True)


def test_default_patterns_and_matching():
    assert shm.DEFAULT_PATTERNS == ("nccl-*", "psm_*", "sem.mp-*", "torch_*")
    for name, pattern in (("nccl-shm-0a1b", "nccl-*"), ("psm_7f3a", "psm_*"), ("sem.mp-x1y2", "sem.mp-*"),
                          ("torch_1234_5678_0", "torch_*")):
        assert shm.match_patterns(name, shm.DEFAULT_PATTERNS) == pattern
    for name in ("NCCL-x", "sem.loky-1", "pulse-shm-1", "psm", "mytorch_1"):
        assert shm.match_patterns(name, shm.DEFAULT_PATTERNS) is None


# ------------------------------------------------------------------ fake /proc

def _fake_proc(tmp_path, target, maps_st):
    """pid 100 holds `target` by fd, pid 101 maps it (by dev:ino, under another path), pid 102 has
    vanished (no fd/ or maps left), pid 103 is unrelated, 'self' and non-pid entries are noise."""
    proc = tmp_path / "proc"
    (proc / "100" / "fd").mkdir(parents=True)
    os.symlink(target, str(proc / "100" / "fd" / "7"))
    os.symlink("/dev/null", str(proc / "100" / "fd" / "0"))
    os.symlink("/gone/file", str(proc / "100" / "fd" / "9"))  # dangling, like a just-closed fd
    (proc / "100" / "maps").write_text("")
    (proc / "100" / "comm").write_text("vllm-worker\n")
    (proc / "101" / "fd").mkdir(parents=True)
    major, minor = os.major(maps_st.st_dev), os.minor(maps_st.st_dev)
    (proc / "101" / "maps").write_text(
        "7f00-7f10 rw-s 00000000 %02x:%02x %d   %s (deleted)\n"
        "7f20-7f30 r--p 00000000 00:00 0 [heap]\n" % (major, minor, maps_st.st_ino, os.path.dirname(target) + "/renamed"))
    (proc / "101" / "comm").write_text("python3\n")
    (proc / "102").mkdir()
    (proc / "103" / "fd").mkdir(parents=True)
    (proc / "103" / "maps").write_text("")
    (proc / "self").mkdir()
    (proc / "sys").mkdir()
    return str(proc)


def test_scan_fake_proc_fd_maps_and_vanished(tmp_path, shmdir):
    target = touch(os.path.join(shmdir, "psm_held"))
    st = os.stat(target)
    scan = shm.scan_processes(shmdir, proc_root=_fake_proc(tmp_path, target, st), self_pid=-1)
    holders = [h.as_dict() for h in scan.holders_of(target, st)]
    assert holders == [{"pid": 100, "comm": "vllm-worker", "via": "fd"},
                       {"pid": 101, "comm": "python3", "via": "maps"}]
    assert scan.scanned == 4 and scan.unreadable == {}


def test_scan_skips_own_pid(tmp_path, shmdir):
    target = touch(os.path.join(shmdir, "psm_held"))
    st = os.stat(target)
    scan = shm.scan_processes(shmdir, proc_root=_fake_proc(tmp_path, target, st), self_pid=100)
    assert [h.pid for h in scan.holders_of(target, st)] == [101]


def test_plan_with_fake_proc(tmp_path, shmdir):
    held = touch(os.path.join(shmdir, "nccl-held"), 100)
    stale = touch(os.path.join(shmdir, "nccl-stale"), 4096, age=3600)
    young = touch(os.path.join(shmdir, "torch_1_2_3"), 10)
    touch(os.path.join(shmdir, "pulse-shm-1"))
    os.mkdir(os.path.join(shmdir, "psm_dir"))
    proc_root = _fake_proc(tmp_path, held, os.stat(held))
    remove, keep, names, scan = shm.plan_cleanup(shmdir, shm.DEFAULT_PATTERNS, min_age=60,
                                                 proc_root=proc_root, probe=None)
    assert names == ["nccl-held", "nccl-stale", "psm_dir", "pulse-shm-1", "torch_1_2_3"]
    assert [(r["name"], r["size"], r["pattern"]) for r in remove] == [("nccl-stale", 4096, "nccl-*")]
    assert remove[0]["allocated"] >= 4096 and remove[0]["age"] >= 3599
    reasons = {k["name"]: k["reason"] for k in keep}
    assert reasons == {"nccl-held": "in_use", "psm_dir": "not_a_file", "pulse-shm-1": "not_matching",
                       "torch_1_2_3": "too_young"}
    held_entry = [k for k in keep if k["name"] == "nccl-held"][0]
    assert held_entry["detected_by"] == "proc" and [h["pid"] for h in held_entry["holders"]] == [100, 101]
    assert os.path.exists(stale)  # planning removes nothing


def test_unreadable_process_keeps_files_of_its_owner(shmdir):
    f = touch(os.path.join(shmdir, "psm_maybe"))
    scan = shm.ProcScan()
    scan.unreadable = {4242: os.stat(f).st_uid}
    remove, keep, _x, _x = shm.plan_cleanup(shmdir, ["psm_*"], scan=scan, probe=None)
    assert remove == [] and keep[0]["reason"] == "holder_unverifiable" and keep[0]["unreadable_pids"] == [4242]
    # the kernel lease probe can settle it
    remove, keep, _x, _x = shm.plan_cleanup(shmdir, ["psm_*"], scan=scan, probe=lambda p: True)
    assert [r["name"] for r in remove] == ["psm_maybe"]
    # a different owner's unreadable process does not block
    scan.unreadable = {4242: os.stat(f).st_uid + 1}
    remove, _x, _x, _x = shm.plan_cleanup(shmdir, ["psm_*"], scan=scan, probe=None)
    assert [r["name"] for r in remove] == ["psm_maybe"]


SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")


@pytest.mark.skipif(os.geteuid() != 0 or not SYSTEM_PYTHON, reason="needs root (to drop to another uid) and a system python3")
def test_real_permission_errors_as_unprivileged_user(shmdir):
    """Real: a scan run as 'nobody' cannot read root's processes; it must not crash and must report them."""
    helper = subprocess.Popen(["sleep", "60"])  # a root process nobody cannot inspect
    try:
        code = ("import json, sys; sys.path.insert(0, %r);"
                "from ansible_collections.llmfleet.vllm.plugins.module_utils import shm_segments as s;"
                "scan = s.scan_processes(%r); print(json.dumps(sorted(scan.unreadable)))"
                % (os.path.join(REPO, ".ansible", "collections"), shmdir))
        out = subprocess.run([SYSTEM_PYTHON, "-c", code], user=65534, group=65534, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, timeout=60, check=True, cwd="/")
        assert helper.pid in json.loads(out.stdout), out.stderr
    finally:
        helper.kill()
        helper.wait()


def test_real_vanishing_processes_do_not_break_the_scan(shmdir):
    """Real: processes start and exit continuously while /proc is scanned."""
    target = touch(os.path.join(shmdir, "psm_steady"))
    holder = hold(target)
    churn = subprocess.Popen([sys.executable, "-c",
                              "import subprocess\nfor _x in range(400): subprocess.run(['true'])"])
    try:
        for _x in range(15):
            scan = shm.scan_processes(shmdir)
            assert [h.pid for h in scan.holders_of(target, os.stat(target))] == [holder.pid]
    finally:
        churn.kill()
        churn.wait()
        stop(holder)


# ------------------------------------------------------------------ the kernel lease probe, real processes

@pytest.mark.parametrize("how", ["fd", "maps"])
def test_lease_probe_sees_real_holders(shmdir, how):
    f = touch(os.path.join(shmdir, "psm_lease"), 4096)
    assert shm.lease_probe(f) is True
    proc = hold(f, how)
    try:
        assert shm.lease_probe(f) is False
    finally:
        stop(proc)
    assert shm.lease_probe(f) is True
    assert shm.lease_probe(shmdir) is None  # not a regular file: cannot tell


def test_lease_catches_holder_that_proc_cannot_see(tmp_path, shmdir):
    """An empty fake /proc models a holder in another PID namespace; the real holder is caught by the lease."""
    f = touch(os.path.join(shmdir, "nccl-ns"), 4096)
    (tmp_path / "proc").mkdir()
    proc = hold(f, "maps")
    try:
        remove, keep, _x, _x = shm.plan_cleanup(shmdir, ["nccl-*"], proc_root=str(tmp_path / "proc"))
        assert remove == []
        assert keep[0]["reason"] == "in_use" and keep[0]["detected_by"] == "lease" and keep[0]["holders"] == []
        # fault injection: without the probe the segment would have been removed
        remove, _x, _x, _x = shm.plan_cleanup(shmdir, ["nccl-*"], proc_root=str(tmp_path / "proc"), probe=None)
        assert [r["name"] for r in remove] == ["nccl-ns"]
    finally:
        stop(proc)


def test_recheck_catches_a_process_that_started_after_the_plan(shmdir):
    f = touch(os.path.join(shmdir, "torch_late"), 10)
    gone = touch(os.path.join(shmdir, "torch_gone"), 10)
    remove, _x, _x, _x = shm.plan_cleanup(shmdir, ["torch_*"])
    assert sorted(r["name"] for r in remove) == ["torch_gone", "torch_late"]
    os.unlink(gone)
    proc = hold(f, "fd")
    try:
        free, busy = shm.recheck(remove, shmdir, probe=None)
        assert free == []
        assert [(b["name"], b["reason"], [h["pid"] for h in b["holders"]]) for b in busy] == \
            [("torch_late", "in_use", [proc.pid])]
    finally:
        stop(proc)
    free, busy = shm.recheck(remove, shmdir)
    assert [e["name"] for e in free] == ["torch_late"] and busy == []


# ------------------------------------------------------------------ what the real H200 run recorded

def test_h200_recorded_run_kept_live_and_removed_after_sigkill():
    """tests/fixtures/nvidia/h200-shm-*.json: the module's results on the H200 (docs/gpu-validation.md)."""
    with open(os.path.join(FIX, "h200-shm-holder.json")) as fh:
        holder = json.load(fh)
    with open(os.path.join(FIX, "h200-shm-live.json")) as fh:
        live = json.load(fh)
    with open(os.path.join(FIX, "h200-shm-killed.json")) as fh:
        killed = json.load(fh)
    pids = {holder["pid"], holder["child_pid"]}
    assert sorted(r["name"] for r in live["real"]["removed"]) == ["nccl-stale-planted", "torch_stale_planted"]
    live_kept = {k["name"]: k for k in live["real"]["kept"]}
    assert set(live_kept) == set(holder["dev_shm"]) - {"nccl-stale-planted", "torch_stale_planted"}
    for entry in live_kept.values():
        assert entry["reason"] == "in_use" and {h["pid"] for h in entry["holders"]} <= pids
    assert live["check"]["changed"]
    assert [r["name"] for r in live["check"]["removed"]] == [r["name"] for r in live["real"]["removed"]]
    assert not live["again"]["changed"]
    removed_after_kill = {r["name"] for r in killed["real"]["removed"]}
    assert "psm_h200_live" in removed_after_kill and any(n.startswith("sem.mp-") for n in removed_after_kill)
    torch_seg = "torch_%d_" % holder["pid"]
    assert any(n.startswith(torch_seg) for n in removed_after_kill)  # the real torch file_system segment
    assert removed_after_kill <= set(live_kept)
    assert not killed["again"]["changed"] and killed["again"]["kept"] == []
