#!/usr/bin/env bash
# K2: a cluster at work (issue 43). For each N of K2_NODES (default
# 10,50,100), N real agents against the real kube-apiserver through the
# whole flow of one bundle (test/clusterbench, BenchmarkClusterAtWork:
# offered by node 0, fetched by the others, approved, loaded into a CRI-O
# stand-in, desiredUpdate, Completed, the MCO done, the mirror retired).
# Rows per N, from the API server's own metrics: per node and per minute
# of the flow, requests, response bytes and watch-event bytes (ratio: to
# the first N's; goal <= 1.25x at the largest), idle requests per node per
# minute after it (goal <= 2), and the time from the administrator's
# approval until every node saw it (goal <= 2 s). Each N runs on its own
# API server; one that fails prints a FAILED row saying where the flow
# stopped, and the larger ones still run. The whole report of each N
# (where the requests, bytes and CPU went, the timeline) is in
# $BENCH_DIR/k2-cluster.txt. K2_PULL_DELAY (default 2s) is each stand-in
# pull's time, K2_IDLE (default 2m) the quiet window after the flow.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
BENCH_DIR=${BENCH_DIR:-/var/tmp/ferry-bench}
RESULTS=${RESULTS:-$BENCH_DIR/results.jsonl}
REPORT=$BENCH_DIR/k2-cluster.txt
mkdir -p "$BENCH_DIR"
: > "$REPORT"
export FERRY_BENCH_PULL_DELAY=${K2_PULL_DELAY:-2s} FERRY_BENCH_IDLE=${K2_IDLE:-2m} FERRY_BENCH_REPORT=$REPORT
NODES=${K2_NODES:-10,50,100}
status=0
first=""
declare -A base
for n in ${NODES//,/ }; do
  out=$(FERRY_BENCH_NODES=$n go test ./test/clusterbench -run XXX -bench BenchmarkClusterAtWork -benchtime 1x -timeout 3h -v 2>&1)
  rc=$?
  echo "$out" >&2
  name="BenchmarkClusterAtWork/N=$n"
  req=$(bench_metric "$out" "$name" req/node/min) resp=$(bench_metric "$out" "$name" resp-kB/node/min)
  watch=$(bench_metric "$out" "$name" watch-kB/node/min) idle=$(bench_metric "$out" "$name" idle-req/node/min)
  seen=$(bench_metric "$out" "$name" approval-seen-s) flow=$(bench_metric "$out" "$name" flow-s)
  if [ $rc -ne 0 ] || [ -z "$req" ]; then
    why=$(echo "$out" | grep -m1 -E 'timed out|never|exited|FAIL:|nodes saw' | sed 's/^ *//' | cut -c1-160)
    row "K2 cluster at work N=$n" FAILED "" "${why:-see the log}"
    printf '{"bench":"K2","nodes":%s,"failed":true}\n' "$n" >> "$RESULTS"
    status=1
    continue
  fi
  if [ -z "$first" ]; then
    first=$n base[req]=$req base[resp]=$resp base[watch]=$watch
  fi
  ratio() { awk "BEGIN{ if ($2 > 0) printf \"%.2fx\", $1/$2; else print \"-\" }"; }
  row "K2 N=$n requests/node/min of the flow" "$(printf %.1f "$req")" "$(ratio "$req" "${base[req]}")" "vs N=$first; goal <= 1.25x; the flow ${flow%.*} s"
  row "K2 N=$n response kB/node/min" "$(printf %.1f "$resp")" "$(ratio "$resp" "${base[resp]}")" "vs N=$first (reads: the server measures no write's response)"
  row "K2 N=$n watch-event kB/node/min" "$(printf %.1f "$watch")" "$(ratio "$watch" "${base[watch]}")" "vs N=$first; goal <= 1.25x"
  row "K2 N=$n idle requests/node/min" "$(printf %.2f "$idle")" "" "goal <= 2"
  row "K2 N=$n approval seen by every node" "$(printf %.2fs "$seen")" "" "goal <= 2 s"
  printf '{"bench":"K2","nodes":%s,"req_node_min":%s,"resp_kb_node_min":%s,"watch_kb_node_min":%s,"idle_req_node_min":%s,"approval_seen_s":%s,"flow_s":%s}\n' \
    "$n" "$req" "$resp" "$watch" "$idle" "$seen" "$flow" >> "$RESULTS"
done
echo "the whole report of each N: $REPORT" >&2
exit $status
