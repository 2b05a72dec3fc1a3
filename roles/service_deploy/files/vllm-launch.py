# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Start vLLM's server in two steps: first everything that needs no GPU, then the server on a go signal.

Runs as a unit's ExecStart in place of `vllm serve ...`, with the venv's Python:

    python3 vllm-launch.py --run-dir DIR [--hold-file PATH] [--prefetch PATH]... [--prefetch-max-bytes N]
                           [--prefetch-ram-fraction F] [--wait-s S] [--serve-link LINK --serve-target DIR]
                           -- VLLM_ARGV...

1. imports vLLM's server, engine and worker modules; CUDA stays uninitialised, so vLLM can still fork its engine
   process, which then inherits the imports instead of repeating them;
2. when the start is held (--hold-file exists when the launcher starts, written less than 120 s before; or no
   --hold-file is given: the go file
   alone releases it), reads the files under each --prefetch path once, so the weights are in the page cache
   (skipped, and said, when they exceed --prefetch-max-bytes or the fraction F of MemAvailable), writes DIR/armed
   (JSON: what each step took) and waits until the hold file is gone or DIR/go exists (--wait-s: give up after S s
   with exit status 3); a start that is not held (a boot, a restart, a plain deploy) goes on at once;
3. checks that LINK (the model's serving path, which the unit's ExecStartPre pointed at DIR) still points at DIR,
   else exits with status 4 (another unit's start moved it while this one was held);
4. writes DIR/went (JSON: CLOCK_MONOTONIC and epoch seconds of the go, the origin of the start's time to ready)
   and runs VLLM_ARGV (its first word, the `vllm` program, is replaced by this process) with the modules loaded.

Every step is logged on stderr as one `llmfleet-launch: ` line with a JSON object, for the start's phases.
"""

import importlib
import json
import os
import sys
import time

# The modules a `vllm serve` start imports, server first; a module a vLLM version lacks is skipped and said.
PRELOAD = (
    "torch",
    "vllm.entrypoints.cli.main",
    "vllm.entrypoints.cli.serve",
    "vllm.entrypoints.openai.api_server",
    "vllm.v1.engine.async_llm",
    "vllm.v1.engine.core",
)
READ_CHUNK = 16 * 1024 * 1024
POLL_S = 0.02
GAVE_UP = 3
# A hold is written right before its unit starts; an older one was left by a start that never ran (refused by systemd,
# a controller killed in between) and holds nothing.
HOLD_FRESH_S = 120
OPTIONS = {"--run-dir": "run_dir", "--hold-file": "hold_file", "--prefetch": "prefetch",
           "--prefetch-max-bytes": "prefetch_max_bytes", "--prefetch-ram-fraction": "prefetch_ram_fraction",
           "--wait-s": "wait_s", "--serve-link": "serve_link", "--serve-target": "serve_target"}
LINK_MOVED = 4


def log(event, **fields):
    fields = dict(event=event, t=round(time.time(), 3), **fields)
    sys.stderr.write("llmfleet-launch: %s\n" % json.dumps(fields, sort_keys=True))
    sys.stderr.flush()


def parse_args(argv):
    if "--" not in argv:
        raise SystemExit("usage: vllm-launch.py --run-dir DIR [options] -- VLLM_ARGV...")
    split = argv.index("--")
    own, vllm_argv = argv[:split], argv[split + 1:]
    if len(vllm_argv) < 2:
        raise SystemExit("vllm-launch.py: nothing to run after --")
    opts = {"run_dir": None, "hold_file": None, "prefetch": [], "prefetch_max_bytes": 0,
            "prefetch_ram_fraction": 0.0, "wait_s": 0.0, "serve_link": None, "serve_target": None}
    i = 0
    while i < len(own):
        key = own[i]
        if key not in OPTIONS or i + 1 >= len(own):
            raise SystemExit("vllm-launch.py: unknown or incomplete option %r" % key)
        name, value = OPTIONS[key], own[i + 1]
        if name == "prefetch":
            opts[name].append(value)
        elif name == "prefetch_max_bytes":
            opts[name] = int(value)
        elif name in ("prefetch_ram_fraction", "wait_s"):
            opts[name] = float(value)
        else:
            opts[name] = value
        i += 2
    if not opts["run_dir"]:
        raise SystemExit("vllm-launch.py: --run-dir is required")
    return opts, vllm_argv


def preload(modules=PRELOAD):
    started = time.monotonic()
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # another vLLM version or engine: that module is simply not needed
            missing.append("%s (%s)" % (name, exc))
    torch = sys.modules.get("torch")
    cuda_initialised = bool(torch is not None and hasattr(torch, "cuda") and torch.cuda.is_initialized())
    return {"import_s": round(time.monotonic() - started, 3), "missing": missing, "cuda_initialised": cuda_initialised}


def files_under(paths):
    found = []
    for path in paths:
        if os.path.isfile(path):
            found.append(path)
            continue
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found.extend(os.path.join(root, n) for n in sorted(names) if not n.startswith("."))
    return found


def mem_available_bytes(meminfo="/proc/meminfo"):
    try:
        with open(meminfo) as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def prefetch_budget(max_bytes, ram_fraction, available):
    """The bytes a prefetch may read: the smaller of max_bytes and ram_fraction x MemAvailable (0/None: no limit)."""
    limits = [max_bytes] if max_bytes else []
    if ram_fraction and available is not None:
        limits.append(int(ram_fraction * available))
    return min(limits) if limits else 0


def prefetch(paths, max_bytes):
    """Read every file once (page cache); none at all when they add up to more than max_bytes (0: no limit): the old
    model still serves from this host's RAM while the new one's weights are read."""
    files = files_under(paths)
    total = sum(os.path.getsize(f) for f in files)
    if max_bytes and total > max_bytes:
        return {"prefetch_bytes": 0, "prefetch_s": 0.0, "prefetch_files": len(files),
                "prefetch_skipped": "%d bytes over the %d allowed" % (total, max_bytes)}
    started = time.monotonic()
    buf = bytearray(READ_CHUNK)
    done = 0
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            with os.fdopen(fd, "rb", buffering=0, closefd=False) as handle:
                while True:
                    n = handle.readinto(buf)
                    if not n:
                        break
                    done += n
        finally:
            os.close(fd)
    return {"prefetch_bytes": done, "prefetch_s": round(time.monotonic() - started, 3), "prefetch_files": len(files)}


def file_age_s(path):
    try:
        return time.time() - os.stat(path).st_mtime
    except OSError:
        return None


def read_link(path):
    try:
        return os.readlink(path)
    except OSError:
        return None


def link_points_at(link, target):
    found = read_link(link)
    return found is not None and os.path.normpath(found) == os.path.normpath(target)


def write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(data, handle, sort_keys=True)
    os.replace(tmp, path)


def released(go_path, hold_file):
    return os.path.exists(go_path) or bool(hold_file and not os.path.exists(hold_file))


def wait_for_go(go_path, hold_file, wait_s):
    started = time.monotonic()
    while not released(go_path, hold_file):
        if wait_s and time.monotonic() - started > wait_s:
            return None
        time.sleep(POLL_S)
    return round(time.monotonic() - started, 3)


def run_vllm(vllm_argv):
    from vllm.entrypoints.cli.main import main as vllm_main  # pylint: disable=import-outside-toplevel

    sys.argv = ["vllm"] + vllm_argv[1:]
    return vllm_main()


def arm_and_wait(opts, armed):
    """The held start: the weights into the page cache, DIR/armed written, then the wait for the go. None: gave up."""
    if opts["prefetch"]:
        budget = prefetch_budget(opts["prefetch_max_bytes"], opts["prefetch_ram_fraction"], mem_available_bytes())
        fetched = prefetch(opts["prefetch"], budget)
        armed.update(fetched)
        log("prefetched", **fetched)
    armed["armed_at"] = round(time.time(), 3)
    write_json(os.path.join(opts["run_dir"], "armed"), armed)
    log("armed", run_dir=opts["run_dir"])
    return wait_for_go(os.path.join(opts["run_dir"], "go"), opts["hold_file"], opts["wait_s"])


def main(argv):
    opts, vllm_argv = parse_args(argv)
    os.makedirs(opts["run_dir"], exist_ok=True)
    # Held: asked for right before this process started (a fresh hold file), or no hold file at all (the go file only).
    hold_age = file_age_s(opts["hold_file"]) if opts["hold_file"] else None
    held = not opts["hold_file"] or (hold_age is not None and hold_age < HOLD_FRESH_S)
    if hold_age is not None and not held:
        log("stale_hold", hold_file=opts["hold_file"], age_s=round(hold_age, 1))
    armed = {"pid": os.getpid(), "started_at": round(time.time(), 3), "held": held}
    armed.update(preload())
    log("imported", **armed)
    waited = arm_and_wait(opts, armed) if held else 0.0
    if waited is None:
        log("gave_up", wait_s=opts["wait_s"])
        return GAVE_UP
    # The unit pointed the link at its revision before it started; another unit's start since (the old model restarted
    # while this one was held) may have moved it: serving another revision under this unit's name is worse than failing.
    if opts["serve_link"] and opts["serve_target"] and not link_points_at(opts["serve_link"], opts["serve_target"]):
        log("link_moved", link=opts["serve_link"], want=opts["serve_target"], found=read_link(opts["serve_link"]))
        return LINK_MOVED
    went = {"monotonic_s": round(time.clock_gettime(time.CLOCK_MONOTONIC), 3), "at": round(time.time(), 3),
            "held": held, "waited_s": waited}
    write_json(os.path.join(opts["run_dir"], "went"), went)
    log("go", waited_s=waited, held=held, multiproc_method=os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", ""))
    return run_vllm(vllm_argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
