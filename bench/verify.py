# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark llmfleet.vllm.shard_verify against parallel sha256sum on a synthetic sharded model.

    .venv/bin/python bench/verify.py --size-gb 4 --shards 64 --runs 5

Builds a model of N safetensors shards (stdlib writer, random data, a manifest with
the sha256 of every file), then times, page cache warm and cold:
  - shard_verify full mode, called in-process through model_verify.verify_model_dir
    (the module's code path without the AnsibleModule wrapper),
  - find | xargs -P$(nproc) -n1 sha256sum   (the ask's baseline),
  - find | xargs -P$(nproc) -n1 openssl dgst -sha256   (a baseline with SHA-NI code),
  - `hf cache verify ORG/NAME --local-dir DIR` (huggingface_hub's own checksum verification, from
    .venv; the expected sha256s come from the local hub fixture tools/localhub serving the same
    folder, warmed once so its own hashing is not timed; skipped without .venv/bin/hf),
plus fast mode, and one run of the real module through `ansible localhost -m`.
Cold runs drop the page cache with /proc/sys/vm/drop_caches when writable, else
with posix_fadvise(DONTNEED) per file. The model is deleted afterwards unless --keep.
Stdlib only, so it also runs with a bare system python.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _collection_on_path():
    """Import the repo as ansible_collections.llmfleet.vllm, with or without `make venv`'s link."""
    collections = os.path.join(REPO_ROOT, ".ansible", "collections")
    if not os.path.isdir(os.path.join(collections, "ansible_collections", "llmfleet", "vllm")):
        collections = tempfile.mkdtemp(prefix="llmfleet-collections-")
        os.makedirs(os.path.join(collections, "ansible_collections", "llmfleet"))
        os.symlink(REPO_ROOT, os.path.join(collections, "ansible_collections", "llmfleet", "vllm"))
    sys.path.insert(0, collections)


_collection_on_path()

# pylint: disable=wrong-import-position
from ansible_collections.llmfleet.vllm.plugins.module_utils.file_hashing import default_workers  # noqa: E402
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_manifest import (  # noqa: E402
    MANIFEST_FILENAME, write_manifest)
from ansible_collections.llmfleet.vllm.plugins.module_utils.model_verify import verify_model_dir  # noqa: E402

MIB = 1024 * 1024
TENSORS_PER_SHARD = 48


def build_model(model_dir, size_bytes, shards):
    """Shards of BF16 tensors with real safetensors headers; returns the manifest it wrote."""
    os.makedirs(model_dir)
    block = os.urandom(8 * MIB)
    shard_bytes = size_bytes // shards
    tensor_elements = shard_bytes // TENSORS_PER_SHARD // 2
    files, weight_map = [], {}
    for number in range(1, shards + 1):
        name = "model-%05d-of-%05d.safetensors" % (number, shards)
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for index in range(TENSORS_PER_SHARD):
            tensor = "model.layers.%d.mlp.w%d.weight" % (number, index)
            header[tensor] = {"dtype": "BF16", "shape": [tensor_elements], "data_offsets": [offset, offset + tensor_elements * 2]}
            weight_map[tensor] = name
            offset += tensor_elements * 2
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        digest = hashlib.sha256()
        with open(os.path.join(model_dir, name), "wb") as handle:
            for chunk in (struct.pack("<Q", len(raw)), raw, number.to_bytes(8, "little")):
                handle.write(chunk)
                digest.update(chunk)
            left = offset - 8
            while left:
                chunk = memoryview(block)[:min(left, len(block))]
                handle.write(chunk)
                digest.update(chunk)
                left -= len(chunk)
        files.append({"path": name, "size": os.path.getsize(os.path.join(model_dir, name)),
                      "sha256": digest.hexdigest(), "git_sha1": None})
    side_files = {
        "model.safetensors.index.json": {"metadata": {"total_size": shard_bytes * shards}, "weight_map": weight_map},
        "config.json": {"architectures": ["LlamaForCausalLM"]},
        "tokenizer_config.json": {"model_max_length": 4096},
    }
    for name, content in side_files.items():
        data = json.dumps(content).encode()
        with open(os.path.join(model_dir, name), "wb") as handle:
            handle.write(data)
        files.append({"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "git_sha1": None})
    manifest = {"format": 1, "repo_id": None, "revision": None, "files": sorted(files, key=lambda f: f["path"])}
    write_manifest(manifest, os.path.join(model_dir, MANIFEST_FILENAME))
    return manifest


def drop_caches(model_dir, method):
    """Empty the page cache of the model; returns the method used.

    drop_caches empties the whole machine's cache (other users' too); fadvise(DONTNEED)
    evicts only the model's clean pages, and needs no privilege.
    """
    subprocess.run(["sync"], check=True)
    if method == "drop_caches":
        try:
            with open("/proc/sys/vm/drop_caches", "w", encoding="ascii") as handle:
                handle.write("3\n")
            return "drop_caches"
        except OSError:
            pass
    for name in os.listdir(model_dir):
        fd = os.open(os.path.join(model_dir, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "posix_fadvise DONTNEED per file"


def warm(model_dir):
    for name in os.listdir(model_dir):
        with open(os.path.join(model_dir, name), "rb") as handle:
            while handle.read(16 * MIB):
                pass


def run_shard_verify(model_dir, workers):
    started = time.monotonic()
    result = verify_model_dir(model_dir, mode="full", workers=workers)
    elapsed = time.monotonic() - started
    if result["failed"]:
        raise SystemExit("shard_verify failed on the synthetic model: %s" % result["msg"])
    return elapsed


def shell_baseline(tool):
    def run(model_dir, workers):
        command = "find %s -type f -name '*' -print0 | xargs -0 -P%d -n1 %s > /dev/null" % (model_dir, workers, tool)
        started = time.monotonic()
        subprocess.run(["bash", "-c", "set -o pipefail; " + command], check=True)
        return time.monotonic() - started
    return run


class HfCacheVerify:
    """`hf cache verify` against the local hub fixture serving the synthetic model as bench/synthetic."""

    REPO_ID = "bench/synthetic"

    def __init__(self, model_dir):
        self.hf = os.path.join(REPO_ROOT, ".venv", "bin", "hf")
        self.model_dir = model_dir
        root = os.path.join(os.path.dirname(model_dir), "hub")
        os.makedirs(os.path.join(root, "bench"))
        os.symlink(model_dir, os.path.join(root, self.REPO_ID))
        server = os.path.join(REPO_ROOT, "tools", "localhub", "server.py")
        self.proc = subprocess.Popen([sys.executable, server, "--root", root, "--port", "0", "--quiet"],
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        self.endpoint = line.split()[-1]  # "localhub fixture serving ROOT on http://HOST:PORT"
        self.verified = self._verify()  # warms the fixture's own hashing of the files

    def _verify(self):
        env = dict(os.environ, HF_ENDPOINT=self.endpoint, HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_OFFLINE="0")
        process = subprocess.run([self.hf, "cache", "verify", self.REPO_ID, "--local-dir", self.model_dir,
                                  "--fail-on-missing-files", "--json"], capture_output=True, text=True, env=env,
                                 check=False)
        if process.returncode != 0:
            raise SystemExit("hf cache verify failed:\n%s%s" % (process.stdout, process.stderr))
        return process.stdout

    def __call__(self, model_dir, workers):
        started = time.monotonic()
        self._verify()
        return time.monotonic() - started

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def run_ansible_module(model_dir, mode):
    ansible = os.path.join(REPO_ROOT, ".venv", "bin", "ansible")
    command = [ansible, "localhost", "-i", "localhost,", "-c", "local", "-m", "llmfleet.vllm.shard_verify",
               "-a", "path=%s mode=%s" % (model_dir, mode), "-e", "ansible_python_interpreter=/usr/bin/python3"]
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO_ROOT, "ansible.cfg"))
    started = time.monotonic()
    process = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - started
    if process.returncode != 0:
        raise SystemExit("ansible run failed:\n%s%s" % (process.stdout, process.stderr))
    return elapsed


def summary(seconds, total_bytes):
    rates = [total_bytes / MIB / s for s in seconds]
    return {"median_s": statistics.median(seconds), "min_s": min(seconds), "max_s": max(seconds),
            "median_mib_s": statistics.median(rates), "min_mib_s": min(rates), "max_mib_s": max(rates)}


def machine_facts(workdir):
    with open("/proc/meminfo", encoding="ascii") as handle:
        meminfo = dict(line.split(":", 1) for line in handle)
    cpu = platform.processor() or ""
    with open("/proc/cpuinfo", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    disk = subprocess.run(["df", "-h", "--output=source,fstype,size,avail", workdir], capture_output=True,
                          text=True, check=False).stdout.splitlines()[-1]
    return {"nproc": os.cpu_count(), "cpu": cpu,
            "mem_total_gib": int(meminfo["MemTotal"].split()[0]) / 1024 / 1024,
            "mem_available_gib": int(meminfo["MemAvailable"].split()[0]) / 1024 / 1024,
            "python": platform.python_version(), "disk": " ".join(disk.split())}


def render(args, facts, model_bytes, files, results, fast, ansible, cold_method):
    lines = [
        "## shard_verify benchmark",
        "",
        "Command: `%s`" % " ".join(["python", "bench/verify.py"] + sys.argv[1:]),
        "",
        "Machine: %(nproc)d CPUs (%(cpu)s), %(mem_total_gib).1f GiB RAM (%(mem_available_gib).1f GiB available at start), "
        "bench Python %(python)s, disk `%(disk)s`." % facts,
        "",
        "Model: %d files, %.2f GiB (%d safetensors shards of %d BF16 tensors, index, config, manifest); "
        "%d runs per cell, workers = %d; cold = page cache emptied before each run (%s)."
        % (files, model_bytes / 1024 ** 3, args.shards, TENSORS_PER_SHARD, args.runs, args.workers, cold_method),
        "",
        "| cache | tool | median s | min–max s | median MiB/s | min–max MiB/s | vs sha256sum |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for cache in ("warm", "cold"):
        base = results[cache]["sha256sum"]["median_mib_s"]
        for tool, row in results[cache].items():
            lines.append("| %s | %s | %.2f | %.2f–%.2f | %.0f | %.0f–%.0f | %.2f× |" % (
                cache, tool, row["median_s"], row["min_s"], row["max_s"], row["median_mib_s"],
                row["min_mib_s"], row["max_mib_s"], row["median_mib_s"] / base))
    lines += [
        "",
        "shard_verify = `model_verify.verify_model_dir(mode='full')` in-process (the module's code path minus "
        "AnsibleModule); sha256sum = `find DIR -type f -print0 | xargs -0 -P%d -n1 sha256sum`; openssl = the same with "
        "`openssl dgst -sha256`; hf cache verify = huggingface_hub's `hf cache verify ORG/NAME --local-dir DIR` "
        "against the local hub fixture serving the same files (tools/localhub, its hashing warmed before timing)."
        % args.workers,
        "",
        "Fast mode on the %d-shard model (headers and sizes only), warm, %d runs: median %.3f s, min–max %.3f–%.3f s "
        "(target < 1 s: %s)." % (args.shards, len(fast), statistics.median(fast), min(fast), max(fast),
                                 "met" if max(fast) < 1 else "MISSED"),
        "",
    ]
    if ansible:
        lines += [
            "The real module through `ansible localhost -m llmfleet.vllm.shard_verify` (target python /usr/bin/python3, "
            "warm, one run each, ansible start-up included): fast %.2f s, full %.2f s." % (ansible["fast"], ansible["full"]),
            "",
        ]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--size-gb", type=float, default=4.0)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--workdir", default="/var/tmp")
    parser.add_argument("--output", default=os.path.join(REPO_ROOT, "results", "bench-verify.md"))
    parser.add_argument("--keep", action="store_true", help="keep the synthetic model")
    parser.add_argument("--cold-method", choices=["drop_caches", "fadvise"], default="drop_caches",
                        help="how cold runs empty the page cache (drop_caches falls back to fadvise when not allowed)")
    parser.add_argument("--skip-ansible", action="store_true", help="skip the ansible ad-hoc runs (no .venv needed)")
    parser.add_argument("--skip-hf", action="store_true", help="skip `hf cache verify`")
    args = parser.parse_args()

    size_bytes = int(args.size_gb * 1024 ** 3)
    free = shutil.disk_usage(args.workdir).free
    if free < size_bytes * 1.5:
        raise SystemExit("need %.1f GiB free in %s, have %.1f" % (size_bytes * 1.5 / 1024 ** 3, args.workdir, free / 1024 ** 3))
    facts = machine_facts(args.workdir)
    model_dir = os.path.join(tempfile.mkdtemp(prefix="llmfleet-bench-verify-", dir=args.workdir), "model")
    hf_verify = None
    try:
        print("building %.1f GiB model in %s" % (args.size_gb, model_dir), flush=True)
        manifest = build_model(model_dir, size_bytes, args.shards)
        model_bytes = sum(entry["size"] for entry in manifest["files"])
        tools = {"shard_verify": run_shard_verify, "sha256sum": shell_baseline("sha256sum"),
                 "openssl": shell_baseline("openssl dgst -sha256")}
        if os.path.exists(os.path.join(REPO_ROOT, ".venv", "bin", "hf")) and not args.skip_hf:
            hf_verify = HfCacheVerify(model_dir)
            tools["hf cache verify"] = hf_verify
        results, cold_method = {}, None
        for cache in ("warm", "cold"):
            seconds = {tool: [] for tool in tools}
            for run in range(args.runs):
                for tool, timer in tools.items():  # interleaved so drift hits every tool alike
                    if cache == "cold":
                        cold_method = drop_caches(model_dir, args.cold_method)
                    else:
                        warm(model_dir)
                    seconds[tool].append(timer(model_dir, args.workers))
                    print("%s run %d %s: %.2f s" % (cache, run + 1, tool, seconds[tool][-1]), flush=True)
            results[cache] = {tool: summary(values, model_bytes) for tool, values in seconds.items()}
        warm(model_dir)
        fast = []
        for _run in range(max(args.runs, 5)):
            started = time.monotonic()
            verify_model_dir(model_dir, mode="fast")
            fast.append(time.monotonic() - started)
        ansible = None if args.skip_ansible else {mode: run_ansible_module(model_dir, mode) for mode in ("fast", "full")}
        report = render(args, facts, model_bytes, len(manifest["files"]) + 1, results, fast, ansible, cold_method)
    finally:
        if hf_verify:
            hf_verify.stop()
        if not args.keep:
            shutil.rmtree(os.path.dirname(model_dir), ignore_errors=True)
    print(report)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(report)
        print("wrote %s" % args.output)


if __name__ == "__main__":
    main()
