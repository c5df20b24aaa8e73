#!/usr/bin/env bash
# VM: plug-to-loaded. With BENCH_VM=1, test/vm's single-node scenario runs
# (a VM with systemd, udev and CRI-O; a FAT stick hot-plugged) and prints
# the time from the plug to every image loaded and pinned, against its
# floor measured in the same guest: reading the stick plus crictl pulls of
# the same images, 4 at a time, from a stand-in registry. Without
# BENCH_VM=1 the row says how to run it (it takes ~10 min under TCG).
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
RESULTS=${RESULTS:-${BENCH_DIR:-/var/tmp/ferry-bench}/results.jsonl}
if [ "${BENCH_VM:-}" != 1 ]; then
  row "VM plug-to-loaded" skipped "" "run with BENCH_VM=1 (boots a VM, ~10 min)"
  exit 0
fi
out=$(go test ./test/vm -run '^TestSingleNode_VFATStickLoadsAndPinsEveryImage$' -count=1 -v -timeout 45m 2>&1) || {
  echo "$out" >&2
  row "VM plug-to-loaded" FAILED "" "go test ./test/vm failed"
  exit 1
}
echo "$out" >&2
# TIMING single node, vfat stick: 30 images, 12.3 MiB: plug-to-loaded 45.6s; floor 40.1s (read 1.2s + crictl pull x4 38.9s); ratio 1.14 (goal <= 1.3)
line=$(echo "$out" | grep -E '^TIMING single node' | tail -1 || true)
field() { echo "$line" | sed -nE "s#.*$1.*#\\1#p"; }
took=$(field 'plug-to-loaded ([0-9.]+)s'); floor=$(field 'floor ([0-9.]+)s'); what=$(field ': ([0-9]+ images, [0-9.]+ MiB)')
if [ -z "$took" ]; then
  row "VM plug-to-loaded" FAILED "" "no TIMING line in the output"
  exit 1
fi
if [ -n "$floor" ]; then
  row "VM plug-to-loaded ($what)" "${took}s" "$(awk "BEGIN{printf \"%.2fx\", $took/$floor}")" \
    "vs floor: read the stick + crictl pull x4 (${floor}s); goal <= 1.3x"
else
  floor=null
  row "VM plug-to-loaded ($what)" "${took}s" "" "floor not measured (see the log)"
fi
printf '{"bench":"VM","plug_to_loaded_s":%s,"floor_s":%s}\n' "$took" "$floor" >> "$RESULTS"
