# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Inspect a live vLLM unit on the systemd GPU host (tools/device/gpuhost.sh inspect), as root inside the host:
    python3 gpuhost_inspect.py UNIT MODEL OUTDIR
Writes OUTDIR/inspect-UNIT.json and the raw texts: systemctl show, systemd-analyze security, the journal, the
/proc status of every process of the unit, which of them map libcuda, NVML's view, and for each sandbox setting the
run claims, a negative control: the same probe in a transient unit with and without the setting."""
import json
import os
import re
import subprocess
import sys
import time

UNIT, MODEL, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
PY = "/opt/torch/.venv/bin/python3"


def sh(*argv, timeout=120):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    return p.returncode, p.stdout + p.stderr


def save(name, text):
    with open(os.path.join(OUT, name), "w", encoding="utf-8") as handle:
        handle.write(text)


def status_fields(pid):
    try:
        text = open("/proc/%s/status" % pid, encoding="utf-8").read()
    except OSError:
        return None
    keep = ("Name", "Uid", "NoNewPrivs", "CapEff", "CapBnd", "CapPrm", "Seccomp", "Seccomp_filters")
    return {k: v.strip() for k, v in re.findall(r"^(\w+):\s*(.*)$", text, re.M) if k in keep}


result = {"unit": UNIT, "model": MODEL, "time": time.time()}
_rc, show = sh("systemctl", "show", UNIT)
save("unit-show.txt", show)
props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
result["unit_props"] = {k: props.get(k, "") for k in (
    "ActiveState", "SubState", "MainPID", "ExecMainStartTimestamp", "NRestarts", "After", "Wants", "User",
    "DevicePolicy", "DeviceAllow", "NoNewPrivileges", "ProtectSystem", "CapabilityBoundingSet", "ControlGroup",
    "LimitNOFILE", "LimitMEMLOCK", "PrivateTmp", "ProtectHome")}
_rc, sec = sh("systemd-analyze", "security", "--no-pager", UNIT)
save("security.txt", sec)
m = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", sec)
result["security"] = {"exposure": float(m.group(1)) if m else None, "rating": m.group(2) if m else None}
_rc, cat = sh("systemctl", "cat", UNIT)
save("unit-file.txt", cat)
_rc, deps = sh("systemctl", "list-dependencies", "--after", "--plain", "--no-pager", UNIT)
save("unit-after-deps.txt", deps)
result["after_uvm_unit"] = "nvidia-uvm-nodes.service" in props.get("After", "").split()
# Every process in the unit's cgroup: its sandbox state as the kernel sees it, and whether it maps libcuda.
cg = props.get("ControlGroup", "")
pids = []
for root, _dirs, files in os.walk("/sys/fs/cgroup" + cg):
    if "cgroup.procs" in files:
        pids += open(os.path.join(root, "cgroup.procs"), encoding="utf-8").read().split()
procs = []
for pid in pids:
    fields = status_fields(pid)
    if fields is None:
        continue
    try:
        maps = open("/proc/%s/maps" % pid, encoding="utf-8").read()
        cmd = open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\0", b" ").decode()[:160]
    except OSError:
        maps, cmd = "", ""
    fields.update(pid=int(pid), cmdline=cmd, maps_libcuda="libcuda.so" in maps,
                  maps_nvidia_dev=sorted(set(re.findall(r"/dev/nvidia[\w-]*", maps))))
    procs.append(fields)
result["processes"] = procs
# The live main process's mount namespace and root (-r: nspawn enters its root by chroot, so without -r nsenter
# lands in the namespace's underlying root, not the container's): the unit's filesystem view.
mainpid = props.get("MainPID", "0")
live = {}
if mainpid not in ("", "0"):
    live["write_venv"] = sh("nsenter", "-t", mainpid, "-m", "-r", "sh", "-c",
                            "touch /opt/torch/.venv/.llmfleet-probe 2>&1 && rm -f /opt/torch/.venv/.llmfleet-probe && echo wrote")[1].strip()
    live["write_cache_dir"] = sh("nsenter", "-t", mainpid, "-m", "-r", "sh", "-c",
                                 "touch /var/cache/llmfleet-vllm/.probe 2>&1 && rm -f /var/cache/llmfleet-vllm/.probe && echo wrote")[1].strip()
    live["list_root_home"] = sh("nsenter", "-t", mainpid, "-m", "-r", "sh", "-c", "ls -A /root 2>&1 | head -3; echo end")[1].strip()
result["live_namespace"] = live
# Negative controls: one probe per setting, in a transient unit with the setting and without it.
open("/tmp/llmfleet-marker", "w").close()
PROBES = {
    "ProtectSystem=strict": (["ProtectSystem=strict"],
                             "touch /opt/.llmfleet-probe 2>/dev/null && rm -f /opt/.llmfleet-probe && echo wrote || echo refused",
                             "refused"),
    "ProtectHome=true": (["ProtectHome=true"], "ls /root/carry >/dev/null 2>&1 && echo visible || echo hidden", "hidden"),
    "PrivateTmp=true": (["PrivateTmp=true"], "test -e /tmp/llmfleet-marker && echo shared || echo private", "private"),
    "NoNewPrivileges=true": (["NoNewPrivileges=true"], "grep NoNewPrivs /proc/self/status", "NoNewPrivs:\t1"),
    "CapabilityBoundingSet=": (["CapabilityBoundingSet="], "grep CapBnd /proc/self/status", "CapBnd:\t0000000000000000"),
    "SystemCallFilter=~@mount...": (["SystemCallFilter=~@clock @cpu-emulation @module @mount @obsolete @privileged @raw-io @reboot @swap",
                                     "SystemCallErrorNumber=EPERM"],
                                    "mount -t tmpfs none /mnt 2>/dev/null && echo mounted || echo refused", "refused"),
    "RestrictAddressFamilies=": (["RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK"],
                                 PY + " -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW); print(\"opened\")' 2>/dev/null || echo refused",
                                 "refused"),
    "RestrictNamespaces=true": (["RestrictNamespaces=true"], "unshare -m true 2>/dev/null && echo created || echo refused", "refused"),
    "DevicePolicy=closed (no DeviceAllow)": (["DevicePolicy=closed"],
                                             "head -c0 /dev/nvidiactl 2>/dev/null && echo opened || echo refused", "refused"),
    "DevicePolicy=strict (/dev/null)": (["DevicePolicy=strict"], "head -c0 /dev/null 2>/dev/null && echo opened || echo refused", "refused"),
}
controls = []
for name, (settings, cmd, expect) in PROBES.items():
    row = {"setting": name, "expected_with": expect}
    for label, extra in (("with", settings), ("without", [])):
        argv = ["systemd-run", "--wait", "--pipe", "-q", "-p", "PrivateMounts=yes"]
        for s in extra:
            argv += ["-p", s]
        row[label] = sh(*(argv + ["sh", "-c", cmd]))[1].strip().splitlines()[-1:] or [""]
        row[label] = row[label][0]
    row["enforced"] = row["with"] == expect and row["without"] != expect
    controls.append(row)
result["negative_controls"] = controls
# The GPU as NVML sees it, and the journal (engine, platform, device).
result["nvml"] = json.loads(sh(PY, os.path.join(os.path.dirname(__file__), "nvml_snapshot.py"))[1])
_rc, journal = sh("journalctl", "-u", UNIT, "--no-pager", "-o", "short-iso")
save("journal-%s.txt" % MODEL, journal)
result["journal_gpu_lines"] = [line[line.find(": ") + 2:][:220] for line in journal.splitlines() if re.search(
    r"platform|CUDA|cuda:0|device_config|Flash ?Attention|CUDA graph|GPU KV cache|model weights took|Available KV", line)][:25]
_rc, envfile = sh("sh", "-c", "grep -h '^CUDA_VISIBLE_DEVICES' /etc/llmfleet/*.env; stat -c '%a %U' /etc/llmfleet/*.env")
result["env_cuda_visible_devices"] = envfile.strip()
# Requests through the openai client (carried in the wheelhouse with vLLM).
port = 8000 if MODEL.endswith("-a") else 8001
code, out = sh(PY, "-c", """
import json, time, openai
c = openai.OpenAI(base_url="http://127.0.0.1:%d/v1", api_key="none", timeout=60)
ids = [m.id for m in c.models.list().data]
ok = fail = toks = 0; lat = []
for i in range(16):
    t = time.monotonic()
    try:
        r = c.completions.create(model=%r, prompt="request %%d: the GPU host" %% i, max_tokens=32, temperature=0)
        ok += 1; toks += r.usage.completion_tokens; lat.append(time.monotonic() - t)
    except Exception as e:
        fail += 1; print("fail", e)
print(json.dumps({"openai_version": openai.__version__, "models": ids, "ok": ok, "failed": fail,
                  "completion_tokens": toks, "latency_s_max": round(max(lat), 4) if lat else None,
                  "latency_s_median": round(sorted(lat)[len(lat) // 2], 4) if lat else None}))
""" % (port, MODEL))
try:
    result["openai_requests"] = json.loads(out.strip().splitlines()[-1])
except (ValueError, IndexError):
    result["openai_requests"] = {"error": out[-800:]}
with open(os.path.join(OUT, "inspect-%s.json" % MODEL), "w", encoding="utf-8") as handle:
    json.dump(result, handle, indent=1)
print(json.dumps({k: result[k] for k in ("security", "after_uvm_unit", "unit_props", "openai_requests")}, indent=1))
for row in controls:
    print("%-40s with=%-12s without=%-12s enforced=%s" % (row["setting"], row["with"], row["without"], row["enforced"]))
for p in procs:
    print(p["pid"], p.get("Uid"), p.get("NoNewPrivs"), p.get("CapBnd"), p.get("Seccomp"), p["maps_libcuda"], p["cmdline"][:80])
