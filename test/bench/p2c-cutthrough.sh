#!/usr/bin/env bash
# P2c: cut-through. Plug to every node extracted, real agents in network
# namespaces (test/netns), the stick's reads capped at R_stick (cgroup
# io.max / blkio on a loop device) and every link capped at R_link (tc),
# as a ratio to the floor max(S/R_stick, S/R_link) and to the goal, 1.2 x
# that floor + the stick's node's own plug-to-extracted time alone (measured
# first, in the same run); today's serial figure
# (peer.serial: the stick's node extracts, then the others fetch the whole
# tar, then extract) measured beside it in the same run; and each fetching
# node's peak disk use over the bundle size (the worst node).
# P2C_SIZE_MIB (default 1024), P2C_NODES (default 4,8), P2C_STICK_MIB
# (MiB/s, default 100), P2C_RATE_MB (MB/s per link, default 50),
# P2C_MODES (default cut,serial).
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
SIZE_MIB=${P2C_SIZE_MIB:-1024}
NODES=${P2C_NODES:-4,8}
STICK=${P2C_STICK_MIB:-100}
RATE=${P2C_RATE_MB:-50}
MODES=${P2C_MODES:-cut,serial}
RESULTS=${RESULTS:-${BENCH_DIR:-/var/tmp/ferry-bench}/results.jsonl}
mkdir -p "$(dirname "$RESULTS")"
go_bench "P2c cut-through" ./test/netns CutThrough -timeout 90m \
  -cut.size "$SIZE_MIB" -cut.nodes "$NODES" -cut.stick "$STICK" -cut.rate "$RATE" -cut.modes "$MODES"
floor=$(awk "BEGIN{s=$SIZE_MIB*1048576; a=s/($STICK*1048576); b=s/($RATE*1000000); printf \"%.1f\", (a>b?a:b)}")
# BenchmarkCutThrough/cut/N=4  1  123 ns/op  11.0 s/all  1.05 x-disk  1.10 x-floor
metric() { bench_metric "$out" "BenchmarkCutThrough/$1/N=$2" "$3"; } # mode n unit
alone=$(metric alone 1 s/all)
if [ -z "$alone" ]; then
  row "P2c stick's node alone" FAILED "" "no result in the benchmark output"
  exit 1
fi
alone=$(printf %.1f "$alone")
goal=$(awk "BEGIN{printf \"%.1f\", 1.2*$floor + $alone}")
row "P2c stick's node alone, ${SIZE_MIB} MiB" "${alone}s" "" "plug to extracted, no peers: its own extraction floor"
status=0
for n in ${NODES//,/ }; do
  cut=$(metric cut "$n" s/all); serial=$(metric serial "$n" s/all)
  disk=$(metric cut "$n" x-disk); sdisk=$(metric serial "$n" x-disk)
  if [ -z "$cut" ]; then
    row "P2c cut-through N=$n" FAILED "" "no result in the benchmark output"
    status=1; continue
  fi
  cut=$(printf %.1f "$cut")
  row "P2c cut-through N=$n, ${SIZE_MIB} MiB" "${cut}s" \
    "$(awk "BEGIN{printf \"%.2fx\", $cut/$floor}")" "vs max(S/R_stick ${STICK} MiB/s, S/R_link ${RATE} MB/s) = ${floor}s; goal: 1.2 x ${floor}s + ${alone}s alone = ${goal}s, here $(awk "BEGIN{printf \"%.2f\", $cut/$goal}")x of it"
  if [ -n "$serial" ]; then
    serial=$(printf %.1f "$serial")
    row "P2c serial (peer.serial) N=$n" "${serial}s" \
      "$(awk "BEGIN{printf \"%.2fx\", $serial/$floor}")" "today's serial figure, same run; cut-through is $(awk "BEGIN{printf \"%.2f\", $cut/$serial}")x of it"
  fi
  row "P2c fetchers' peak disk N=$n" "" "$(printf %.3fx "$disk")" \
    "worst fetching node's peak over the bundle size; goal <= 1.1x${sdisk:+ (serial: $(printf %.3fx "$sdisk"))}"
  printf '{"bench":"P2c","nodes":%s,"size_mib":%s,"stick_mib_s":%s,"rate_mb_s":%s,"cut_s":%s,"serial_s":%s,"floor_s":%s,"alone_s":%s,"goal_s":%s,"disk_x":%s,"serial_disk_x":%s}\n' \
    "$n" "$SIZE_MIB" "$STICK" "$RATE" "$cut" "${serial:-null}" "$floor" "$alone" "$goal" "$disk" "${sdisk:-null}" >> "$RESULTS"
done
exit $status
