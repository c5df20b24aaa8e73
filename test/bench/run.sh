#!/usr/bin/env bash
# make bench: one table of ratios, each against a baseline measured in the
# same run; raw numbers in $RESULTS (JSON lines).
#
# Rows come from test/bench/p1.sh, every test/bench/p[2-9]*.sh, then the
# good-neighbour rows test/bench/n[0-9]*.sh, run in
# order; each prints its own rows (stdout) and logs to $BENCH_DIR/<row>.log.
# A row script that fails prints a FAILED row and the run goes on; the run
# then exits non-zero. BENCH_ONLY="p1 p3" runs only those rows.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
export BENCH_DIR=${BENCH_DIR:-/var/tmp/ferry-bench}
export RESULTS=${RESULTS:-$BENCH_DIR/results-$(date +%Y%m%dT%H%M%S).jsonl}
mkdir -p "$BENCH_DIR"
failed=()
row benchmark value ratio baseline
for s in test/bench/p1.sh test/bench/p[2-9]*.sh test/bench/n[0-9]*.sh; do
  [ -f "$s" ] || continue
  name=$(basename "$s" .sh)
  if [ -n "${BENCH_ONLY:-}" ] && ! [[ " $BENCH_ONLY " == *" ${name%%-*} "* ]]; then
    continue
  fi
  log=$BENCH_DIR/$name.log
  start=$(date +%s)
  rc=0
  rows=$(bash "$s" 2>"$log") || rc=$?
  [ -n "$rows" ] && echo "$rows"
  if [ $rc -ne 0 ]; then
    if ! grep -q FAILED <<<"$rows"; then
      row "$name" FAILED "" "after $(( $(date +%s) - start ))s; see $log"
    fi
    printf '{"bench":"%s","failed":true,"log":"%s"}\n' "$name" "$log" >> "$RESULTS"
    failed+=("$name")
  fi
done
echo "raw numbers: $RESULTS; logs: $BENCH_DIR/<row>.log"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed rows: ${failed[*]}"
  exit 1
fi
