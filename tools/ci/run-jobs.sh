#!/usr/bin/env bash
# The long suites of `make test` (tools/run-tests.sh): WORKERS workers take the jobs of tools/ci/jobs.tsv in the
# file's order (longest first, as measured, but for what runs beside what: see the file), each the next one free, so
# that neither waits alone at the end while the other has work left (the box has 2 cores; the suites are CPU-bound). Each job writes tests/output/logs/<job>.log and is
# stopped (SIGINT, so pytest still prints its summary and durations) when the run's limit LIMIT_S is spent.
#   tools/ci/run-jobs.sh WORKERS LIMIT_S      -> tests/output/logs/jobs.tsv: job, rc, seconds, started, ended
set -uo pipefail
workers=${1:?workers} limit_s=${2:?limit in seconds}
repo=$(cd "$(dirname "$0")/../.." && pwd)
logs=$repo/tests/output/logs
queue=$logs/jobs.queue results=$logs/jobs.tsv
mkdir -p "$logs"
jobs_file=${LLMFLEET_JOBS:-$repo/tools/ci/jobs.tsv}
# Every line a job: NAME (a log file's name), SECONDS, COMMAND, tab-separated; a run with a job lost passes nothing.
awk -F'\t' '!/^#/ && NF && !(NF == 3 && $1 ~ /^[A-Za-z0-9_-]+$/ && $2 ~ /^[0-9]+$/ && $3 != "") {
  printf "%s:%d: not NAME<TAB>SECONDS<TAB>COMMAND: %s\n", FILENAME, NR, $0; bad = 1 } END {exit bad}' "$jobs_file" || exit 2
# Each molecule scenario is a job of its own (molecule/_* are shared files, default has no machine).
for scenario in "$repo"/molecule/*/; do
  scenario=$(basename "$scenario")
  [[ $scenario == _* || $scenario == default ]] && continue
  grep -q "^molecule-$scenario"$'\t' "$jobs_file" || { echo "$jobs_file: no job molecule-$scenario"; exit 2; }
done
grep -v '^#' "$jobs_file" | grep -v '^$' >"$queue"
queued=$(wc -l <"$queue")
((queued > 0)) || { echo "$jobs_file: no jobs"; exit 2; }
: >"$results"
started=$SECONDS

next_job() {  # pop the queue's first line, under a lock shared by the workers
  flock "$queue.lock" bash -c 'head -1 "$1"; sed -i 1d "$1"' _ "$queue"
}

worker() {
  local line name _secs cmd t0 rc left
  while line=$(next_job) && [[ -n $line ]]; do
    IFS=$'\t' read -r name _secs cmd <<<"$line"
    left=$((limit_s - (SECONDS - started)))
    ((left > 0)) || left=1  # timeout 0 would mean no limit
    t0=$SECONDS
    printf '[%s] worker %s: %s\n' "$(date -u +%T)" "$1" "$name"
    (cd "$repo" && timeout --signal=INT --kill-after=120 "$left" bash -c "$cmd") >"$logs/$name.log" 2>&1
    rc=$?
    flock "$results.lock" printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$t0" "$SECONDS" >>"$results"
  done
}

for w in $(seq 1 "$workers"); do worker "$w" & done
wait
printf '\n%-26s %4s %8s   (seconds since the long suites began)\n' job rc seconds
sort -t$'\t' -k4,4n "$results" | awk -F'\t' -v s="$started" '{printf "%-26s %4s %8s   %5d-%d\n", $1, $2, $3, $4 - s, $5 - s}'
ran=$(wc -l <"$results")
((ran == queued)) || { echo "$((queued - ran)) of $queued jobs did not run"; exit 1; }
! awk -F'\t' '$2 != 0 {bad = 1} END {exit !bad}' "$results"
