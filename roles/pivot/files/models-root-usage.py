# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Print the models root's free bytes, its model dirs as prune candidates and the model dirs each host serves from it.

Usage: models-root-usage.py ROOT. Prints {free_bytes, candidates: [{path, size_bytes, mtime}] (oldest first),
served_by: {record: [names under ROOT]}}. Hosts that share ROOT (llmfleet_storage_group) each keep a record
ROOT/.llmfleet/serving/<host>.json (written by roles/pivot: {host, dirs: [names under ROOT]}; records of older
releases name one {model}); playbooks/ray-cluster.yml keeps <host>.ray.json the same way. served_by is keyed by
the record's file name without .json, so one host's two records are two entries. Dot dirs are never model dirs.
"""
import glob
import json
import os
import shutil
import subprocess
import sys

root = sys.argv[1]
probe = root
while not os.path.isdir(probe):
    probe = os.path.dirname(probe)
names = sorted(os.listdir(root)) if os.path.isdir(root) else []
dirs = [os.path.join(root, d) for d in names if not d.startswith(".")]
dirs = [d for d in dirs if os.path.isdir(d) and not os.path.islink(d)]
sizes = {}
if dirs:
    out = subprocess.run(["du", "-sb", "--", *dirs], capture_output=True, text=True, check=True).stdout
    sizes = {line.split("\t", 1)[1]: int(line.split("\t", 1)[0]) for line in out.splitlines()}
# Oldest first by the dir's mtime (model_fetch writes its manifest there last), the order disk_plan prunes in.
candidates = sorted(({"path": d, "size_bytes": sizes[d], "mtime": os.stat(d).st_mtime} for d in dirs if d in sizes),
                    key=lambda c: (c["mtime"], c["path"]))
served_by = {}
for record in sorted(glob.glob(os.path.join(root, ".llmfleet", "serving", "*.json"))):
    try:
        with open(record) as handle:
            data = json.load(handle)
        served_by[os.path.basename(record)[:-5]] = [str(d) for d in data["dirs"]] if "dirs" in data else [str(data["model"])]
    except (OSError, ValueError, KeyError, TypeError):
        served_by[os.path.basename(record)[:-5]] = []
print(json.dumps({"free_bytes": shutil.disk_usage(probe).free, "candidates": candidates,
                  "served_by": {h: d for h, d in served_by.items() if d}}))
