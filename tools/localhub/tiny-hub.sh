#!/usr/bin/env bash
# Serve the tiny test models (tools/tinymodels) as repos llmfleet-test/<name> from the local hub
# fixture (tools/localhub/server.py) in the background, for molecule scenarios and the demo.
#   tiny-hub.sh start PORT [ROOT]   generate the models into ROOT and serve them on 127.0.0.1:PORT
#   tiny-hub.sh stop PORT
#   tiny-hub.sh publish PORT NAME   publish a new commit of llmfleet-test/NAME (its generation_config.json changes;
#                                   the old commit stays downloadable); prints "OLD_SHA NEW_SHA"
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=$repo/.venv/bin/python
cmd=${1:?start|stop} port=${2:?port}
root=${TESTBED_CACHE:-/var/cache/llmfleet-testbed}/hub-$port
[[ $cmd == start ]] && root=${3:-$root}
pidfile=/run/llmfleet-tiny-hub-$port.pid

stop() {
  if [[ -f $pidfile ]]; then kill "$(cat "$pidfile")" 2>/dev/null || true; rm -f "$pidfile"; fi
}

export LOCALHUB_DIR=$repo/tools/localhub
case $cmd in
  start)
    stop
    mkdir -p "$root/llmfleet-test"
    "$python" "$repo/tools/tinymodels/make_tiny_models.py" "$root/llmfleet-test" >/dev/null
    setsid "$python" "$repo/tools/localhub/server.py" --root "$root" --port "$port" --quiet \
      </dev/null >"$root.log" 2>&1 &
    echo $! >"$pidfile"
    for _ in $(seq 1 100); do
      curl -fsS "http://127.0.0.1:$port/api/models/llmfleet-test/tiny-llama-a" >/dev/null 2>&1 && exit 0
      sleep 0.2
    done
    cat "$root.log" >&2; echo "local hub did not start on port $port" >&2; exit 1 ;;
  stop) stop ;;
  publish)
    "$python" - "$root" "llmfleet-test/${3:?model name}" <<'PY'
import json, os, sys, time
sys.path.insert(0, os.path.join(os.environ.get("LOCALHUB_DIR", ""), ""))
from hub_repos import RepoStore
root, repo_id = sys.argv[1:3]
config = os.path.join(root, repo_id, "generation_config.json")
data = json.load(open(config)) if os.path.exists(config) else {}
data["llmfleet_published_at"] = time.time()
old, new = RepoStore(root).publish_commit(repo_id, {"generation_config.json": (json.dumps(data, indent=2) + "\n").encode()})
print(old, new)
PY
    ;;
  *) sed -n '2,6p' "$0"; exit 2 ;;
esac
