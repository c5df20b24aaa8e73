#!/usr/bin/env bash
# P7: registry mode (issue 36). N nodes, each with a real CRI-O in its own
# network namespace (test/netns), get a release and an extra image from
# the site's registry through one throttled link (all nodes together):
# ferry's registry mode (one node pulls, the peers share, every node loads;
# the real API server, an UpgradeBundle with spec.source) against every
# node's CRI-O pulling every image itself (the PinnedImageSet way), both
# measured in the same run, each through a fresh link of the same rate.
# Rows: bytes over the link in copies of the bundle (goal <= 1.05x, against
# N x), and the time until every node has every image as a ratio to 1/N of
# the per-node pulls' (goal <= 1.2). Then, at the first N, the nodes'
# CRI-Os splitting one copy between them against one node pulling it all.
# P7_NODES (default 3,8), P7_RATE_MB (MB/s, default 2.5: the 20 Mbit/s of the issue's site), P7_SIZE_MIB
# (default 64), P7_IMAGES (payload images, default 16), P7_WORKERS (pulls
# in flight per node, default 5: the MCO's), P7_SPLIT (default 1; 0 skips
# the split rows).
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
NODES=${P7_NODES:-3,8}
RATE=${P7_RATE_MB:-2.5}
SIZE_MIB=${P7_SIZE_MIB:-64}
IMAGES=${P7_IMAGES:-16}
WORKERS=${P7_WORKERS:-5}
RESULTS=${RESULTS:-${BENCH_DIR:-/var/tmp/ferry-bench}/results.jsonl}
flags=(-timeout 60m -regmode.rate "$RATE" -regmode.size "$SIZE_MIB" -regmode.images "$IMAGES" -regmode.workers "$WORKERS")
go_bench "P7 registry mode" ./test/netns RegistryMode "${flags[@]}" -regmode.nodes "$NODES" -regmode.modes ferry,per-node
# BenchmarkRegistryMode/N=3/ferry-2  1  123 ns/op  1.000 x-copy  20.1 s/all-images ...
metric() { bench_metric "$out" "BenchmarkRegistryMode/N=$2/$1" "$3"; } # mode n unit
status=0
for n in ${NODES//,/ }; do
  fs=$(metric ferry "$n" s/all-images) fx=$(metric ferry "$n" x-copy) fl=$(metric ferry "$n" x-linktime)
  ps=$(metric per-node "$n" s/all-images) px=$(metric per-node "$n" x-copy) pl=$(metric per-node "$n" x-linktime)
  if [ -z "$fs" ] || [ -z "$fx" ] || [ -z "$ps" ] || [ -z "$px" ]; then
    row "P7 registry mode N=$n" FAILED "" "no result in the benchmark output"
    status=1; continue
  fi
  fs=$(printf %.1f "$fs") ps=$(printf %.1f "$ps")
  row "P7 registry mode N=$n, ${SIZE_MIB} MiB, ${RATE} MB/s: link bytes" "$(printf %.3fx "$fx")" \
    "$(awk "BEGIN{printf \"%.2fx\", $fx/$px}")" "copies of the bundle vs per-node CRI-O pulls ($(printf %.2fx "$px")); goal <= 1.05x"
  row "P7 registry mode N=$n: all images everywhere" "${fs}s" \
    "$(awk "BEGIN{printf \"%.2f\", $fs/($ps/$n)}")" "vs 1/N of per-node pulls (${ps}s/$n); goal <= 1.2; time/link time: ferry $(printf %.2f "$fl"), per-node $(printf %.2f "$pl")"
  printf '{"bench":"P7","nodes":%s,"size_mib":%s,"images":%s,"rate_mb_s":%s,"workers":%s,"ferry_s":%s,"ferry_copies":%s,"ferry_x_linktime":%s,"per_node_s":%s,"per_node_copies":%s,"per_node_x_linktime":%s,"copy_bytes":%s}\n' \
    "$n" "$SIZE_MIB" "$IMAGES" "$RATE" "$WORKERS" "$fs" "$fx" "$fl" "$ps" "$px" "$pl" "$(metric ferry "$n" copy-B)" >> "$RESULTS"
done
[ "${P7_SPLIT:-1}" = 0 ] && exit $status
n=${NODES%%,*}
go_bench "P7 split" ./test/netns RegistryMode "${flags[@]}" -regmode.nodes "$n" -regmode.modes one,split
one=$(metric one "$n" s/all-images) split=$(metric split "$n" s/all-images)
if [ -z "$one" ] || [ -z "$split" ]; then
  row "P7 split N=$n" FAILED "" "no result in the benchmark output"
  exit 1
fi
row "P7 one copy split over N=$n nodes' CRI-Os" "$(printf %.1fs "$split")" \
  "$(awk "BEGIN{printf \"%.2fx\", $split/$one}")" "vs one node's CRI-O pulling it all ($(printf %.1fs "$one")), same link"
printf '{"bench":"P7-split","nodes":%s,"size_mib":%s,"rate_mb_s":%s,"workers":%s,"one_s":%s,"split_s":%s}\n' \
  "$n" "$SIZE_MIB" "$RATE" "$WORKERS" "$one" "$split" >> "$RESULTS"
exit $status
