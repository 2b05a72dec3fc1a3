#!/usr/bin/env bash
# Serve the tiny test models (tools/tinymodels) as repos llmfleet-test/<name> from the local hub
# fixture (tools/localhub/server.py) in the background, for molecule scenarios and the demo.
#   tiny-hub.sh start PORT [ROOT]   generate the models into ROOT and serve them on 127.0.0.1:PORT
#   tiny-hub.sh stop PORT
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=$repo/.venv/bin/python
cmd=${1:?start|stop} port=${2:?port}
root=${3:-${TESTBED_CACHE:-/var/cache/llmfleet-testbed}/hub-$port}
pidfile=/run/llmfleet-tiny-hub-$port.pid

stop() {
  if [[ -f $pidfile ]]; then kill "$(cat "$pidfile")" 2>/dev/null || true; rm -f "$pidfile"; fi
}

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
  *) sed -n '2,6p' "$0"; exit 2 ;;
esac
