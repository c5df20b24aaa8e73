#!/usr/bin/env bash
# P6: a release-sized load on the host (test/release): a ~4 GiB bundle of
# 180 images (many of a few MiB, a few of hundreds), made once by `ferry
# bundle create` and kept in $BENCH_DIR, loaded by a real `ferry agent`
# into a real CRI-O with `ferry load` until every image is pinned; against
# the floor measured in the same run: `ferry bundle extract --sync` (the
# agent's extraction is synced) of the same bundle alone plus CRI-O's fastest raw pulls of the same references (2,
# 4, 8 workers), as issue 24 restates it; sha256 + raw pulls for
# information. Prints the
# ratio (goal <= 1.1x) and the agent's peak RSS over the load (goal <= 64
# MiB) and idle RSS (goal <= 32 MiB). P6_MIB (default 3960) scales the
# bundle, P6_WORKERS (default "2 4 8") the raw pull configurations,
# FERRY_P6_PACING=off runs the agent without pacing. Takes
# ~10 min on 2 cores, ~15 the first time (the bundle is made).
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
RESULTS=${RESULTS:-${BENCH_DIR:-/var/tmp/ferry-bench}/results.jsonl}
export FERRY_P6_MIB=${P6_MIB:-3960} FERRY_P6_WORKERS=${P6_WORKERS:-2 4 8}
go_bench "P6 release-sized load" ./test/release ReleaseLoad -timeout 120m
# P6 release-sized load of 180 images (180 refs), 3.87 GiB: ferry 95.12s (extract 20.1s, load 75.0s); floor 98.01s (bundle extract 17.80s + raw pulls 80.21s, 4 workers; 2:85.00s 4:80.21s 8:81.00s);
#   ferry/floor 0.970 (goal ≤ 1.1); vs sha256 9.80s + raw pulls 1.057; agent peak RSS 41 MiB (goal ≤ 64), idle 18 MiB (goal ≤ 32)
line=$(echo "$out" | grep -E '^P6 ' | tail -1 || true)
if [ -z "$line" ]; then
  row "P6 release-sized load" FAILED "" "no P6 line (CRI-O missing? run test/setup/build-crio.sh)"
  exit 1
fi
field() { echo "$line" | sed -nE "s#.*$1.*#\\1#p"; }
images=$(field 'load of ([0-9]+) images'); refs=$(field '\(([0-9]+) refs\)'); gib=$(field ', ([0-9.]+) GiB:')
ferry=$(field 'ferry ([0-9.]+)s '); extract=$(field 'extract ([0-9.]+)s,'); load=$(field ', load ([0-9.]+)s\)'); floor=$(field 'floor ([0-9.]+)s \('); alone=$(field 'bundle extract ([0-9.]+)s'); hash=$(field 'vs sha256 ([0-9.]+)s'); old=$(field 'raw pulls ([0-9.]+);')
pulls=$(field 'raw pulls ([0-9.]+)s'); fw=$(field ', ([0-9]+) workers;'); ratio=$(field 'ferry/floor ([0-9.]+)')
peak=$(field 'peak RSS ([0-9]+) MiB'); idle=$(field 'idle ([0-9]+) MiB'); unsynced=$(field 'unsynced extract ([0-9.]+)s')
row "P6 release-sized load, $images images, ${gib} GiB" "${ferry}s" "$(printf %.2fx "$ratio")" \
  "vs bundle extract --sync alone ${alone}s (unsynced ${unsynced}s) + fastest raw CRI pulls ${pulls}s ($fw workers) = ${floor}s; goal <= 1.1x; ferry: extract ${extract}s, load ${load}s; vs sha256 ${hash}s + pulls: ${old}x"
row "P6 agent peak RSS, release-sized load" "$peak MiB" "" "goal <= 64 MiB; idle $idle MiB (goal <= 32 MiB)"
printf '{"bench":"P6","images":%s,"refs":%s,"gib":%s,"ferry_s":%s,"extract_s":%s,"load_s":%s,"floor_s":%s,"sha256_s":%s,"extract_alone_s":%s,"raw_pulls_s":%s,"fastest_workers":%s,"ratio":%s,"peak_rss_mib":%s,"idle_rss_mib":%s}\n' \
  "$images" "$refs" "$gib" "$ferry" "$extract" "$load" "$floor" "$hash" "$alone" "$pulls" "$fw" "$ratio" "$peak" "$idle" >> "$RESULTS"
