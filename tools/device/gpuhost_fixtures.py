# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The recordings of a GPU host pivot run (tools/device/gpuhost.sh pivot-* phases, unpacked from its gpuhost.tgz) as
the small fixtures tests/unit/recordings/test_gpu_pivot_h200.py (and test_gpu_wake.py) read:
    python3 gpuhost_fixtures.py RESDIR FIXDIR [NAME [CARD]]     (files FIXDIR/<CARD, default h200>-pivot[-NAME]-*)
Compacts the client's request log and the NVML timeline to arrays, keeps the pivot records, the slots after each
pivot, the play logs' summaries and failures, and the vLLM units' lifecycle lines of the journal."""
import glob
import json
import os
import re
import sys

res, fix = sys.argv[1], sys.argv[2]
card = sys.argv[4] if len(sys.argv) > 4 else "h200"
prefix = os.path.join(fix, "%s-pivot-%s" % (card, sys.argv[3] + "-" if len(sys.argv) > 3 and sys.argv[3] else ""))


def write(name, text):
    with open(prefix + name, "w") as handle:
        handle.write(text)


client = json.load(open(os.path.join(res, "client.json")))
requests = [[round(r["start"], 3), round(r["end"], 3), r["ok"], r["status"], r.get("retry_after"), r["error"]]
            for r in client.pop("requests_log")]
write("client.json", json.dumps(dict(client, columns=["start", "end", "ok", "status", "retry_after", "error"],
                                     rows=requests), separators=(",", ":")) + "\n")

rows = [json.loads(line) for line in open(os.path.join(res, "nvml-timeline.jsonl"))]
write("nvml-timeline.json", json.dumps({"columns": ["t", "used_mib", "compute_processes", "power_w"],
                                        "rows": [[r["t"], r["used_mib"], len(r["procs"]), r["power_w"]] for r in rows]},
                                       separators=(",", ":")) + "\n")

records = {os.path.basename(p): json.load(open(p))
           for p in sorted(glob.glob(os.path.join(res, "controller", "**", "*-latest.json"), recursive=True))}
records.update({os.path.basename(p): json.load(open(p)) for p in sorted(glob.glob(os.path.join(res, "pivot-*-record.json")))})
# The host's records of rolled-back pivots (gpuhost.sh copies them after each pivot).
records.update({os.path.basename(p): json.load(open(p)) for p in sorted(glob.glob(os.path.join(res, "*-rolled-back.json")))})
write("records.json", json.dumps(records, indent=1, sort_keys=True) + "\n")

# Only the runs that got past the preflight; an earlier failed attempt's "--- NAME" block is left out.
blocks = re.split(r"^--- ", open(os.path.join(res, "slots-after.txt")).read(), flags=re.M)
kept = {}
for block in blocks:
    name, _newline, body = block.partition("\n")
    if '"slots"' in body:
        kept[name.strip()] = body
write("slots-after.txt", "".join("--- %s\n%s" % item for item in kept.items()))

summaries = [open(os.path.join(res, "pivots.txt")).read()]
for log in sorted(glob.glob(os.path.join(res, "pivot-*.log"))):
    text = open(log).read()
    name = os.path.basename(log)[len("pivot-"):-len(".log")]
    summary = re.findall(r"TASK \[llmfleet\.vllm\.pivot : (?:Pivot summary|Show what the slot promises[^\]]*)\].*?\n}\n", text, re.S)
    failed = [json.loads(line.split("=> ", 1)[1]).get("msg", "") for line in re.findall(r"^fatal: .*$", text, re.M)]
    failed = [msg for msg in failed if "Rolled back" in msg or "rolled back" in msg]
    recap = re.findall(r"^gpuhost +: .*$", text, re.M)
    failures = "".join("failed: %s\n" % f for f in failed)
    summaries.append("=== pivot-%s\n%s%s%s\n" % (name, "".join(summary), failures, "\n".join(recap)))
write("summaries.txt", "\n".join(summaries))

keep = re.compile(r"systemd\[1\]: (Start|Stopp|Stopped|Deactivated)|version 0\.26\.0|backend=nccl|\[cuda\.py|Model loading "
                  r"took|Available KV cache|GPU KV cache size|Free memory on device|fall asleep|to wake up|Sleep mode freed|"
                  r"sleep freed|POST /(sleep|wake_up)")
lines = [line for line in open(os.path.join(res, "journal-units.txt"))
         if ("vllm-gpuhost" in line or "llmfleet-asleep" in line) and keep.search(line) and "POST /v1" not in line]
write("journal-vllm.txt", "".join(lines))
# The gateway's access log lines that say more than "served" (issue 44: held, refused at a bound, sent to the admitted
# port by the hold, 503), its maintenance and reload lines, and how many request lines there were in all.
gateway_log = os.path.join(res, "journal-gateway.txt")
if os.path.exists(gateway_log):
    lines = open(gateway_log).read().splitlines()
    said = [line for line in lines if re.search(r'hold:"[^"]|llmfleet-hold slot=|" 503 | 503 [0-9]+ - |llmfleet_held/|maintenance|Reload', line)]
    write("journal-gateway.txt", "# %d request lines in all\n%s\n" % (sum('"POST /v1/' in line for line in lines), "\n".join(said)))
for name in ("hub-repos.txt", "hub-publish.txt", "inspect-gpuhost-llama1b-b.json", "expiry.txt", "cache-sizes.txt",
             "cache-fleet.txt", "cache-seed.txt"):
    if not os.path.exists(os.path.join(res, name)):
        continue
    with open(os.path.join(res, name)) as handle:
        write(name.replace("gpuhost-llama1b-", ""), handle.read())
print("\n".join(sorted(glob.glob(prefix + "*"))))
