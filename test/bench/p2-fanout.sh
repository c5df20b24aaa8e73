#!/usr/bin/env bash
# P2: peer-to-peer fan-out. With each node's link capped by tc (network
# namespaces, test/netns), the time for every node to hold the bundle, as a
# ratio to one link's time (size / cap) and to the naive star (every node
# fetching from the source only), both measured in the same run.
# P2_SIZE_MIB (default 256; issue 5 asks 1024), P2_NODES (default 4,8),
# P2_RATE_MB (MB/s per link, default 50).
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
SIZE_MIB=${P2_SIZE_MIB:-256}
NODES=${P2_NODES:-4,8}
RATE=${P2_RATE_MB:-50}
RESULTS=${RESULTS:-${BENCH_DIR:-/var/tmp/ferry-bench}/results.jsonl}
go_bench "P2 fan-out" ./test/netns FanOut -timeout 60m \
  -fanout.size "$SIZE_MIB" -fanout.nodes "$NODES" -fanout.rate "$RATE" -fanout.modes p2p,star
link=$(awk "BEGIN{printf \"%.1f\", $SIZE_MIB*1048576/($RATE*1000000)}")
# BenchmarkFanOut/p2p/N=4  1  123 ns/op  1.23 x-link  6.6 s/fanout
metric() { bench_metric "$out" "BenchmarkFanOut/$1/N=$2" "$3"; } # mode n unit
status=0
for n in ${NODES//,/ }; do
  p2p=$(metric p2p "$n" s/fanout); star=$(metric star "$n" s/fanout)
  [ -n "$p2p" ] && p2p=$(printf %.1f "$p2p")
  [ -n "$star" ] && star=$(printf %.1f "$star")
  if [ -z "$p2p" ] || [ -z "$star" ]; then
    row "P2 fan-out N=$n" FAILED "" "no result in the benchmark output"
    status=1; continue
  fi
  goal=""; [ "$n" -ge 8 ] && goal="; goal <= 1.3x"
  row "P2 fan-out N=$n, ${SIZE_MIB} MiB, ${RATE} MB/s links" "${p2p}s" \
    "$(awk "BEGIN{printf \"%.2fx\", $p2p/$link}")" "vs one link's time (size/cap ${link}s)$goal"
  row "P2 fan-out N=$n vs star" "${p2p}s" \
    "$(awk "BEGIN{printf \"%.2fx\", $p2p/$star}")" "vs star: all fetch from the source (${star}s)"
  printf '{"bench":"P2","nodes":%s,"size_mib":%s,"rate_mb_s":%s,"p2p_s":%s,"star_s":%s,"link_s":%s}\n' \
    "$n" "$SIZE_MIB" "$RATE" "$p2p" "$star" "$link" >> "$RESULTS"
done
exit $status
