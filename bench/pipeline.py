# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Download + verification against the download alone, from the local hub with a bandwidth limit that makes the
download the bottleneck.

    .venv/bin/python bench/pipeline.py [--shards 32] [--shard-mib 64] [--rate-mb 40] [--runs 3]

A synthetic repo of N random shards is served by tools/localhub (TEST FIXTURE) with a per-file rate limit
(8 files at once, so about 8 x --rate-mb MB/s). In each run, in turn:
  * alone:     hf_snapshot with hash_while_downloading=false (the download, nothing else: the floor);
  * after:     the same download, then shard_verify full mode (every byte read again after the last one landed);
  * pipelined: hf_snapshot hashing each file as it lands, then shard_verify full with use_download_hashes.
Both modules run as Ansible runs them (`ansible localhost -m`); times are the modules' own wall seconds, so
Ansible's start-up is not counted. Prints Markdown for docs/benchmarks.md and writes results/bench-pipeline.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools", "localhub"))
from server import LocalHub  # noqa: E402  pylint: disable=wrong-import-position

ANSIBLE = os.path.join(REPO, ".venv", "bin", "ansible")
PYTHON = os.path.join(REPO, ".venv", "bin", "python")
REPO_ID = "bench/pipeline"


def module(name: str, args: dict) -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_NOCOLOR="1")
    out = subprocess.run([ANSIBLE, "localhost", "-c", "local", "-e", f"ansible_python_interpreter={PYTHON}",
                          "-m", name, "-a", json.dumps(args)], capture_output=True, text=True, env=env, cwd=REPO, check=False)
    result = json.loads(out.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    if result.get("failed"):
        sys.exit(f"{name} failed: {result.get('msg')}")
    return result


def make_repo(root: str, shards: int, shard_mib: int) -> None:
    repo = os.path.join(root, REPO_ID)
    os.makedirs(repo)
    with open(os.path.join(repo, "config.json"), "w", encoding="utf-8") as fh:
        fh.write('{"model_type": "llama"}\n')
    chunk = os.urandom(1 << 20)
    for i in range(shards):
        with open(os.path.join(repo, f"model-{i + 1:05d}-of-{shards:05d}.bin"), "wb") as fh:
            for j in range(shard_mib):
                fh.write(chunk[j % 7:] + chunk[:j % 7] if j else os.urandom(1 << 20))


def run_once(hub: LocalHub, work: str, way: str) -> dict:
    target = os.path.join(work, way)
    shutil.rmtree(target, ignore_errors=True)
    snap = module("llmfleet.vllm.hf_snapshot",
                  {"repo_id": REPO_ID, "endpoint": hub.url, "local_dir": target, "hash_while_downloading": way == "pipelined"})
    verify = {"seconds": 0.0, "bytes_hashed": 0}
    if way != "alone":
        verify = module("llmfleet.vllm.shard_verify",
                        {"path": target, "mode": "full", "required_files": [], "use_download_hashes": way == "pipelined"})
    shutil.rmtree(target, ignore_errors=True)
    return {"download_s": snap["seconds"], "verify_s": verify["seconds"], "total_s": snap["seconds"] + verify["seconds"],
            "bytes_hashed_after": verify["bytes_hashed"], "bytes": snap["bytes_total"],
            "hashed_while_downloading": snap.get("hashed_while_downloading")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--shard-mib", type=int, default=64)
    parser.add_argument("--rate-mb", type=float, default=40.0, help="per-file limit of the hub, MB/s")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-pipeline-")
    root = os.path.join(work, "hub")
    make_repo(root, args.shards, args.shard_mib)
    ways = ("alone", "after", "pipelined")
    runs: dict[str, list[dict]] = {way: [] for way in ways}
    try:
        with LocalHub(root) as hub:
            rate = int(args.rate_mb * 1e6)
            files = sorted(os.listdir(os.path.join(root, REPO_ID)))
            hub.set_faults({"repos": {REPO_ID: {"files": {name: {"rate": rate} for name in files}}}})
            run_once(hub, work, "alone")  # not counted: the hub hashes its files once, the page cache fills
            for _run in range(args.runs):
                for way in ways:
                    runs[way].append(run_once(hub, work, way))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    alone = [r["total_s"] for r in runs["alone"]]
    summary = {"args": vars(args), "runs": runs,
               "ratio_to_alone": {way: [round(r["total_s"] / a, 3) for r, a in zip(runs[way], alone)] for way in ways}}
    os.makedirs(os.path.join(REPO, "results"), exist_ok=True)
    with open(os.path.join(REPO, "results", "bench-pipeline.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=2)
    gib = args.shards * args.shard_mib / 1024
    print(f"\n{args.shards} shards x {args.shard_mib} MiB ({gib:.1f} GiB), hub limit {args.rate_mb:g} MB/s per file "
          f"(8 at once), {args.runs} runs, alternating\n")
    print("| way | download s | verify after s | total s (median, min-max) | bytes read after the download | total / alone |")
    print("|---|---:|---:|---:|---:|---:|")
    for way in ways:
        rs, ratios = runs[way], summary["ratio_to_alone"][way]
        totals = [r["total_s"] for r in rs]
        print(f"| {way} | {statistics.median(r['download_s'] for r in rs):.2f} | {statistics.median(r['verify_s'] for r in rs):.2f} | "
              f"{statistics.median(totals):.2f} ({min(totals):.2f}-{max(totals):.2f}) | "
              f"{statistics.median(r['bytes_hashed_after'] for r in rs) / 2 ** 20:.0f} MiB | "
              f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |")


if __name__ == "__main__":
    main()
