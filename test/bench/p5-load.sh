#!/usr/bin/env bash
# P5: load test of the two servers on loopback (test/load): 64 concurrent
# clients for 20 s against the peer server (ranged reads of random pieces,
# every byte checked) and against the embedded registry (manifest and blob
# GETs over TLS, every digest checked). Zero errors and a peak RSS under
# 256 MiB are asserted by the test; requests/s and the peak are printed.
# P5_SECONDS (default 20), P5_CLIENTS (default 64).
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
RESULTS=${RESULTS:-${BENCH_DIR:-/var/tmp/ferry-bench}/results.jsonl}
export FERRY_LOAD_SECONDS=${P5_SECONDS:-20} FERRY_LOAD_CLIENTS=${P5_CLIENTS:-64}
status=0
for what in peer registry; do
  case $what in
    peer) run=TestLoad_PeerServerRangedReads label="P5 peer server, ranged reads" ;;
    registry) run=TestLoad_RegistryManifestsAndBlobs label="P5 embedded registry, manifests+blobs" ;;
  esac
  # One test per process: each measures its own process's peak RSS.
  rc=0
  out=$(go test ./test/load -run "^$run\$" -count=1 -v -timeout 10m 2>&1) || rc=1
  [ $rc -eq 0 ] || status=1
  echo "$out" >&2
  line=$(echo "$out" | grep -E "^LOAD $what:" | tail -1 || true)
  if [ -z "$line" ]; then
    row "$label" FAILED "" "no LOAD line: see the log"
    status=1; continue
  fi
  kv() { echo "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
  verdict=""; [ $rc -eq 0 ] || verdict=" FAILED"
  row "$label" "$(kv rps) rps" "" \
    "$(kv clients) clients, $(kv seconds)s, $(kv mib_s) MiB/s; errors $(kv errors) (goal 0); server peak RSS $(kv peak_rss_mib) MiB (goal < 256)$verdict"
  printf '{"bench":"P5-%s","clients":%s,"seconds":%s,"requests":%s,"rps":%s,"mib_s":%s,"errors":%s,"peak_rss_mib":%s}\n' \
    "$what" "$(kv clients)" "$(kv seconds)" "$(kv requests)" "$(kv rps)" "$(kv mib_s)" "$(kv errors)" "$(kv peak_rss_mib)" >> "$RESULTS"
done
exit $status
