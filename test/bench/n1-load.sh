#!/usr/bin/env bash
# N1, second half: etcd's WAL fsync latency during a load. fio's etcd job
# idle, then while a real agent, run under the unit's CPU and IO settings,
# loads P6's release-sized bundle into a real CRI-O (the job starts once
# the agent pulls), pacing on (etcd-safe) and off (test/release
# BenchmarkEtcdFsyncDuringLoad). Goal: p99 <= 1.5x idle, p99.9 <= 2x.
# Makes P6's bundle first if it is not kept yet (~5 min); ~5 min a run.
# N1_FIO_SIZE (22m) and N1_FIO_RATE_IOPS (none) shape the job, as for N1's
# extraction half.
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
RESULTS=${RESULTS:-${BENCH_DIR:-/var/tmp/ferry-bench}/results.jsonl}
command -v fio >/dev/null || { row "N1 etcd fsync during a load" FAILED "" "no fio: test/setup/install-deps.sh"; exit 1; }
unit_cgroup_setup
trap unit_cgroup_cleanup EXIT
export FERRY_UNIT_CGROUP=$unit_cg FERRY_UNIT_NICE=$(unit_setting Nice) FERRY_UNIT_IOPRIO=$(unit_setting IOSchedulingPriority)
export FERRY_P6_MIB=${P6_MIB:-3960} FERRY_N1_FIO_SIZE=${N1_FIO_SIZE:-22m} FERRY_N1_FIO_RATE_IOPS=${N1_FIO_RATE_IOPS:-}
go_bench "N1 etcd fsync during a load" ./test/release EtcdFsyncDuringLoad -timeout 120m
# N1L pacing etcd-safe: idle p50 0.30 p99 0.50 p99.9 1.00 ms; during the load p50 0.40 p99 0.70 p99.9 1.90 ms; p99 1.40x, p99.9 1.90x (goal ≤ 1.5x, ≤ 2x); unit prefix true
n=0
while read -r line; do
  n=$((n + 1))
  f() { echo "$line" | sed -nE "s#.*$1.*#\\1#p"; }
  pacing=$(f 'pacing ([a-z-]+):'); i99=$(f 'idle p50 [0-9.]+ p99 ([0-9.]+)'); i999=$(f 'idle p50 [0-9.]+ p99 [0-9.]+ p99.9 ([0-9.]+)')
  d50=$(f 'load p50 ([0-9.]+)'); d99=$(f 'load p50 [0-9.]+ p99 ([0-9.]+)'); d999=$(f 'load p50 [0-9.]+ p99 [0-9.]+ p99.9 ([0-9.]+)')
  r99=$(f 'p99 ([0-9.]+)x'); r999=$(f 'p99.9 ([0-9.]+)x'); note=$(f '(\(the load ended[^)]*\))')
  row "N1 p99 during a load, pacing $pacing" "${d99}ms" "${r99}x" "vs idle p99 ${i99} ms; goal <= 1.5x; p50 ${d50} ms $note"
  row "N1 p99.9 during a load, pacing $pacing" "${d999}ms" "${r999}x" "vs idle p99.9 ${i999} ms; goal <= 2x; $unit_io_note"
  printf '{"bench":"N1-load","pacing":"%s","idle_ms":[%s,%s],"during_ms":[%s,%s,%s],"unit":"%s"}\n' \
    "$pacing" "$i99" "$i999" "$d50" "$d99" "$d999" "$unit_io_note" >> "$RESULTS"
done < <(echo "$out" | grep -E '^N1L ')
[ "$n" -gt 0 ] || { row "N1 etcd fsync during a load" FAILED "" "no N1L line"; exit 1; }
