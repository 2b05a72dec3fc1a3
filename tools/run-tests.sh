#!/usr/bin/env bash
# `make test`: static checks and unit tests first (fast, fail early), then the two long suites that
# mostly wait on real vLLM servers starting in systemd test hosts, side by side: pytest integration
# and the molecule scenarios use distinct machines and ports, and vLLM's start-up is one core's work.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export PATH=$repo/.venv/bin:$PATH ANSIBLE_CONFIG=$repo/ansible.cfg ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 NO_COLOR=1 PY_COLORS=0
logs=$repo/tests/output/logs
mkdir -p "$logs"
stamp() { date -u +%H:%M:%S; }
step() { printf '\n=== [%s] %s\n' "$(stamp)" "$*"; }

# The test-bed images mostly wait on downloads (Debian's mirror, PyPI): they build while the static checks and unit
# tests use the CPUs, and nothing before the long suites needs them.
step "test-bed images in the background (debootstrap base, vLLM CPU engine via roles/vllm_install; log: tests/output/logs/images.log)"
# setsid: its own process group, so that a failed check stops debootstrap and pip with it.
# base.ready: the base rootfs is there (the molecule scenarios of bare machines need no more).
rm -f "$logs/base.ready"
setsid bash -c 'tools/testbed/testbed.sh build && touch "$0" && tools/testbed/vllm-image.sh' "$logs/base.ready" >"$logs/images.log" 2>&1 &
images=$!
stop_images() { kill -- "-$images" 2>/dev/null; wait "$images" 2>/dev/null; }
# Its own session does not get the terminal's Ctrl-C or CI's TERM: pass them on.
trap 'stop_images; exit 130' INT TERM

# One AnsiballZ cache for every ansible-playbook run of `make test` (the unit tests' and the jobs'), keyed by the
# modules' content (building the payloads was a quarter of a pivot's controller CPU: docs/testbed.md;
# tools/ci/callback_plugins/shared_ansiballz_cache.py).
export ANSIBLE_CALLBACK_PLUGINS=$repo/tools/ci/callback_plugins${ANSIBLE_CALLBACK_PLUGINS:+:$ANSIBLE_CALLBACK_PLUGINS}
export LLMFLEET_ANSIBALLZ_CACHE=$repo/tests/output/ansiballz-cache
# Each payload with its module_utils' bytecode beside their sources (checked hash-based pycs): a module run on a test
# host compiled about 60 of them every time, a third of its CPU (tools/ci/callback_plugins/ansiballz_bytecode.py).
export LLMFLEET_ANSIBALLZ_BYTECODE=1
# The test hosts' /var/cache/llmfleet (vLLM command lines accepted by its parser) is one folder for the whole run,
# emptied here so that each run parses each line at least once (tools/testbed/testbed.sh).
export TESTBED_ARGS_CACHE=$repo/tests/output/vllm-args-cache
rm -rf "$TESTBED_ARGS_CACHE" && mkdir -p "$TESTBED_ARGS_CACHE"
# Every playbook run's tasks and controller CPU, per test (tools/ci/callback_plugins/playbook_tally.py), summed per test
# module at the end: where the Ansible half of the run's CPU goes.
export LLMFLEET_PLAYBOOK_TALLY=$logs/playbooks.tsv
: >"$LLMFLEET_PLAYBOOK_TALLY"
# lint and sanity are each mostly one process's work, and sanity waits on pip for its venvs: beside the unit tests'
# two workers the three took 294 s where lint and sanity side by side, then the unit tests, took 340 s (cold sanity
# venvs, this box; docs/testbed.md).
step "lint, sanity and unit (two workers), side by side (logs: tests/output/logs/lint.log, sanity.log)"
# setsid: their own process groups, which Ctrl-C and CI's TERM stop with the images (background jobs ignore SIGINT).
setsid make -s lint >"$logs/lint.log" 2>&1 & lint=$!
setsid make -s sanity >"$logs/sanity.log" 2>&1 & sanity=$!
trap 'kill -- "-$lint" "-$sanity" 2>/dev/null; stop_images; exit 130' INT TERM
make -s unit PYTEST_UNIT_OPTS="-n 2"; unit_rc=$?
((unit_rc == 0)) || echo "unit failed"
wait $lint; lint_rc=$?
wait $sanity; sanity_rc=$?
trap 'stop_images; exit 130' INT TERM
for check in lint sanity; do
  rc_var=${check}_rc
  if ((${!rc_var} != 0)); then tail -60 "$logs/$check.log"; echo "$check failed"; fi
done
grep -hE "^(Passed|Failed):|^FATAL|^ERROR" "$logs/lint.log" "$logs/sanity.log" | head -20
((lint_rc == 0 && sanity_rc == 0 && unit_rc == 0)) || { stop_images; exit 1; }
step "bench smoke"; make -s bench-smoke >"$logs/bench-smoke.log" 2>&1 || { tail -40 "$logs/bench-smoke.log"; stop_images; exit 1; }

# A new machine (CI's) builds the vLLM image for minutes after the static checks: the jobs start once the base rootfs is
# there, the bare machines' scenarios first (tools/ci/jobs.tsv), and a job that boots from the vLLM image waits on the
# image's lock (tools/testbed/vllm-image.sh) until the build is done.
step "test-bed base image: waiting for it (the vLLM image may still be building: its jobs wait for it)"
until [[ -e $logs/base.ready ]]; do
  kill -0 "$images" 2>/dev/null || { wait "$images"; tail -50 "$logs/images.log"; exit 1; }
  sleep 2
done

step "integration and molecule: jobs on two workers, in the order of tools/ci/jobs.tsv (logs: tests/output/logs/)"
# What memory and vLLM servers looked like over the run: test hosts share the box's 24 GB, and an
# OOM-killed server reads like a server that never starts.
oom_kills() { awk '$1 == "oom_kill" {print $2}' /proc/vmstat; }
oom_before=$(oom_kills)
# idle_pct: the share of both cores left idle since the last line (/proc/stat: idle and iowait over all), which says
# whether a third worker would find CPU to use.
cpu_times() { awk '$1 == "cpu" {print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }
( read -r idle0 total0 < <(cpu_times)
  while sleep 15; do
    read -r idle total < <(cpu_times)
    printf '%s avail_mb=%s vllm_engines=%s load=%s idle_pct=%s\n' "$(stamp)" "$(awk '/MemAvailable/ {print int($2/1024)}' /proc/meminfo)" \
      "$(pgrep -c -f 'VLLM::EngineCore' || true)" "$(cut -d' ' -f1 /proc/loadavg)" "$((100 * (idle - idle0) / (total - total0 + 1)))"
    idle0=$idle total0=$total
  done >"$logs/resources.log" ) &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT
# Each job stops itself in time to print what it did (CI stops the whole job at 90 min): pytest gets SIGINT first,
# so its summary and --durations still reach the log.
tools/ci/run-jobs.sh 2 "${LLMFLEET_STREAM_LIMIT_S:-4200}"; jobs_rc=$?

step "test-bed images (log: tests/output/logs/images.log)"
wait "$images" || { tail -50 "$logs/images.log"; jobs_rc=1; }
trap - INT TERM
grep -E "^\[testbed\]" "$logs/images.log" | tail -5

step "resources: least memory available, most vLLM servers at once, CPU left idle, OOM kills during the run"
sort -t= -k2 -n "$logs/resources.log" | head -1
sort -t= -k3 -n "$logs/resources.log" | tail -1
awk -F'idle_pct=' 'NF == 2 {sum += $2; n++} END {if (n) printf "CPU idle through the long suites: %.0f %% of both cores on average\n", sum / n}' \
  "$logs/resources.log"
echo "oom_kill: $(($(oom_kills) - oom_before))"
step "ansible-playbook runs: tasks and controller CPU per test module (tests/output/logs/playbooks.tsv)"
python3 tools/ci/playbook_tally.py "$LLMFLEET_PLAYBOOK_TALLY"
while IFS=$'\t' read -r job rc _rest; do
  log=$logs/$job.log
  step "$job (rc=$rc)"
  case $job in
    molecule-*) grep -E "➜ .*(Executed|ERROR)|^ERROR|CRITICAL|failed=[1-9]" "$log" | tail -20 ;;
    *) sed -n '/seconds per test module/,$p' "$log" | head -50 ;;
  esac
  ((rc == 0)) || { grep -E "^(FAILED|ERROR)" "$log"; tail -150 "$log"; }
done <"$logs/jobs.tsv"
exit $jobs_rc
