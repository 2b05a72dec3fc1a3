#!/usr/bin/env bash
# `make demo`: the collection's main job on the embedded default. Boots a local systemd host
# (nspawn), installs vLLM's CPU engine there with roles/vllm_install, serves two tiny models made
# here through a local Hugging Face endpoint, and pivots the host from one to the other with
# playbooks/pivot.yml behind the host's gateway (HAProxy, alias `chat`) while an `openai` client sends requests
# to it, printing the client's counts, the pivot records and the benchmark comparison.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export ANSIBLE_CONFIG=$repo/ansible.cfg PATH=$repo/.venv/bin:$PATH
hub_port=18080
host=llm-demo
gateway_port=8080
client_dir=$(mktemp -d)
step() { printf '\n=== %s\n' "$*"; }

step "Making the tiny models (tiny-llama-a, tiny-llama-b) and serving them on a local HF endpoint :$hub_port"
tools/localhub/tiny-hub.sh start "$hub_port"
trap 'touch "$client_dir/stop"; tools/localhub/tiny-hub.sh stop "$hub_port"' EXIT

step "Booting the systemd host $host (vLLM CPU engine image built by roles/vllm_install, cached)"
image=$(tools/testbed/vllm-image.sh)
tools/testbed/testbed.sh up "$host" 2222 "$image"

step "playbooks/site.yml: vLLM install (idempotent check)"
ansible-playbook -i inventory/testbed playbooks/site.yml

gateway=(-e pivot_gateway=true -e pivot_alias=chat -e gateway_port="$gateway_port")
step "playbooks/pivot.yml -e model=tiny-llama-a ${gateway[*]}"
ansible-playbook -i inventory/testbed playbooks/pivot.yml -e model=tiny-llama-a "${gateway[@]}"

step "A client sends requests (model \"chat\") to the gateway http://127.0.0.1:$gateway_port/v1 from now on"
python tools/traffic/continuous_client.py --base-url "http://127.0.0.1:$gateway_port/v1" --model chat --seconds 1800 \
  --stop-file "$client_dir/stop" --output "$client_dir/traffic.json" &
client=$!
step "playbooks/pivot.yml -e model=tiny-llama-b ${gateway[*]} (blue/green: b starts beside a, then the gateway switches)"
ansible-playbook -i inventory/testbed playbooks/pivot.yml -e model=tiny-llama-b "${gateway[@]}"
touch "$client_dir/stop"
wait "$client"
step "The client's requests during the pivot"
python - "$client_dir/traffic.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print("%d requests in %.0f s through the gateway: %d ok, %d failed %s" % (s["requests"], s["seconds"], s["ok"], s["failed"], s["errors"] or ""))
PY

step "Pivot records (results/$host/pivots/)"
python - "results/$host/pivots" <<'PY'
import glob, json, os, sys
print("| model | previous | downtime s (old stopped -> new ready) | load time s | gate tok/s by concurrency |")
print("|---|---|---|---|---|")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*-latest.json")), key=os.path.getmtime):
    r = json.load(open(path))
    gate = ", ".join("c=%d: %.0f" % (lv["concurrency"], lv["output_tok_s"]) for lv in r.get("gate", []))
    dash = lambda v: "-" if v is None else v
    print("| %s | %s | %s | %s | %s |" % (r["model"], dash(r["previous_model"]), dash(r["downtime_s"]), r["load_time_s"], gate))
PY
report=$(ls -t "results/reports/$host"/*.md 2>/dev/null | head -1 || true)
if [[ -n $report ]]; then step "Benchmark comparison ($report)"; cat "$report"; fi
step "Done. $host keeps serving tiny-llama-b as \"chat\" behind its gateway http://127.0.0.1:$gateway_port/v1 (slot default, vLLM on 127.0.0.1:8001); stop it with: tools/testbed/testbed.sh down $host"
