#!/usr/bin/env bash
# make bench: one table of ratios, each against a baseline measured in the
# same run; raw numbers in $RESULTS (JSON lines).
set -euo pipefail
cd "$(dirname "$0")/../.."
export BENCH_DIR=${BENCH_DIR:-/var/tmp/ferry-bench}
export RESULTS=${RESULTS:-$BENCH_DIR/results-$(date +%Y%m%dT%H%M%S).jsonl}
mkdir -p "$BENCH_DIR"
echo "benchmark                                        value    ratio  baseline"
bash test/bench/p1.sh
for s in test/bench/p[2-9]*.sh; do
  [ -f "$s" ] && bash "$s"
done
echo "raw numbers: $RESULTS"
