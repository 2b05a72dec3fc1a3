# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Start vLLM's server in two steps: first everything that needs no GPU, then the server on a go signal.

Runs as a unit's ExecStart in place of `vllm serve ...`, with the venv's Python:

    python3 vllm-launch.py --run-dir DIR [--prefetch PATH]... [--prefetch-max-bytes N] [--wait-s S] -- VLLM_ARGV...

1. imports vLLM's server, engine and worker modules; CUDA stays uninitialised, so vLLM can still fork its engine
   process, which then inherits the imports instead of repeating them;
2. reads the files under each --prefetch path once, so the weights are in the page cache (skipped, and said,
   when they exceed --prefetch-max-bytes);
3. writes DIR/armed (JSON: what each step took) and waits until DIR/go exists (--wait-s: give up after S s);
4. runs VLLM_ARGV (its first word, the `vllm` program, is replaced by this process) with the modules loaded.

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
    opts = {"run_dir": None, "prefetch": [], "prefetch_max_bytes": 0, "wait_s": 0.0}
    i = 0
    while i < len(own):
        key = own[i]
        if key not in ("--run-dir", "--prefetch", "--prefetch-max-bytes", "--wait-s") or i + 1 >= len(own):
            raise SystemExit("vllm-launch.py: unknown or incomplete option %r" % key)
        value = own[i + 1]
        if key == "--run-dir":
            opts["run_dir"] = value
        elif key == "--prefetch":
            opts["prefetch"].append(value)
        elif key == "--prefetch-max-bytes":
            opts["prefetch_max_bytes"] = int(value)
        else:
            opts["wait_s"] = float(value)
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


def prefetch(paths, max_bytes):
    """Read every file once (page cache); none at all when they add up to more than max_bytes (0: no limit)."""
    files = files_under(paths)
    total = sum(os.path.getsize(f) for f in files)
    if max_bytes and total > max_bytes:
        return {"prefetch_bytes": 0, "prefetch_s": 0.0, "prefetch_skipped": "%d bytes over the %d allowed" % (total, max_bytes)}
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


def write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(data, handle, sort_keys=True)
    os.replace(tmp, path)


def wait_for_go(go_path, wait_s):
    started = time.monotonic()
    while not os.path.exists(go_path):
        if wait_s and time.monotonic() - started > wait_s:
            return None
        time.sleep(POLL_S)
    return round(time.monotonic() - started, 3)


def run_vllm(vllm_argv):
    from vllm.entrypoints.cli.main import main as vllm_main  # pylint: disable=import-outside-toplevel

    sys.argv = ["vllm"] + vllm_argv[1:]
    return vllm_main()


def main(argv):
    opts, vllm_argv = parse_args(argv)
    os.makedirs(opts["run_dir"], exist_ok=True)
    armed = {"pid": os.getpid(), "started_at": round(time.time(), 3)}
    armed.update(preload())
    log("imported", **armed)
    if opts["prefetch"]:
        fetched = prefetch(opts["prefetch"], opts["prefetch_max_bytes"])
        armed.update(fetched)
        log("prefetched", **fetched)
    armed["armed_at"] = round(time.time(), 3)
    write_json(os.path.join(opts["run_dir"], "armed"), armed)
    log("armed", run_dir=opts["run_dir"])
    waited = wait_for_go(os.path.join(opts["run_dir"], "go"), opts["wait_s"])
    if waited is None:
        log("gave_up", wait_s=opts["wait_s"])
        return 3
    log("go", waited_s=waited, multiproc_method=os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", ""))
    return run_vllm(vllm_argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
