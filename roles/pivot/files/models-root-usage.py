# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Print the models root's free bytes, each model dir's size and the model dirs each host serves from it.

Usage: models-root-usage.py ROOT. Hosts that share ROOT (llmfleet_storage_group) each keep a record
ROOT/.llmfleet/serving/<host>.json (written by roles/pivot: {host, dirs: [names under ROOT]}; records of older
releases name one {model}); dot dirs are never model dirs.
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
    out = subprocess.run(["du", "-sb", *dirs], capture_output=True, text=True, check=True).stdout
    sizes = {line.split("\t", 1)[1]: int(line.split("\t", 1)[0]) for line in out.splitlines()}
served_by = {}
for record in sorted(glob.glob(os.path.join(root, ".llmfleet", "serving", "*.json"))):
    try:
        with open(record) as handle:
            data = json.load(handle)
        served_by[data["host"]] = [str(d) for d in data["dirs"]] if "dirs" in data else [str(data["model"])]
    except (OSError, ValueError, KeyError, TypeError):
        served_by[os.path.basename(record)[:-5]] = []
print(json.dumps({"free_bytes": shutil.disk_usage(probe).free, "dirs": sizes,
                  "served_by": {h: d for h, d in served_by.items() if d}}))
