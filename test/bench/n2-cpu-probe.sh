#!/usr/bin/env bash
# N2: a workload's CPU under ferry. A CPU-bound probe on every core
# (`openssl speed -multi <cores> sha256`) alone, then while
# `ferry bundle extract --sync` runs again and again under the unit's CPU
# and IO settings (as N1). Goal: >= 80% of alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
SIZE_MIB=${N2_SIZE_MIB:-2048}
SECS=${N2_SECONDS:-8}
WORK=${BENCH_DIR:-/var/tmp/ferry-bench}
RESULTS=${RESULTS:-$WORK/results.jsonl}
mkdir -p "$WORK"
[ -x bin/ferry ] || make build >&2
tarfile=$(mkbig -size-mib "$SIZE_MIB" -out "$WORK")
dest=$WORK/n2-extract
unit_cgroup_setup
loop="" fpid=""
stop_loop() {
  [ -n "$loop" ] || return 0
  kill "$loop" 2>/dev/null || true
  wait "$loop" 2>/dev/null || true
  fpid=$(cat "$WORK/n2-ferry.pid" 2>/dev/null || true)
  [ -n "$fpid" ] && { kill "$fpid" 2>/dev/null || true; while kill -0 "$fpid" 2>/dev/null; do sleep 0.1; done; }
  loop=""
}
trap 'stop_loop; rm -rf "$dest" "$WORK/.staging-n2-extract" || true; unit_cgroup_cleanup' EXIT
cores=$(nproc)

# probe prints the probe's bytes/s.
probe() { openssl speed -mr -multi "$cores" -seconds "$SECS" -bytes 16384 sha256 2>/dev/null | awk -F: '/^\+F:/ { print $4 }'; }

cat "$tarfile" > /dev/null
alone=$(probe)
rm -f "$WORK/n2-count"
( while true; do
    rm -rf "$dest" "$WORK/.staging-n2-extract"
    (exec_as_unit bin/ferry bundle extract "$tarfile" --dest "$dest" --quiet --sync >/dev/null 2>>"$WORK/n2-extract.err") &
    echo $! > "$WORK/n2-ferry.pid"
    echo x >> "$WORK/n2-count"
    wait $! || true
  done ) & loop=$!
sleep 2
during=$(probe)
stop_loop
n=$(wc -l < "$WORK/n2-count")
alone2=$(probe) # the node may have changed meanwhile: alone again, best of both
best=$(awk "BEGIN{print ($alone > $alone2) ? $alone : $alone2}")
ratio=$(awk "BEGIN{printf \"%.2f\", $during/$best}")
mb() { awk "BEGIN{printf \"%.0f\", $1/1e6}"; }
row "N2 CPU probe while ferry extracts" "$(mb "$during") MB/s" "${ratio}x" "vs alone $(mb "$best") MB/s (openssl sha256 on $cores cores, ${SECS}s; $n extractions begun); goal >= 0.8x"
printf '{"bench":"N2","probe_alone_Bps":%s,"probe_alone_again_Bps":%s,"probe_during_Bps":%s,"ratio":%s,"extractions":%s}\n' "$alone" "$alone2" "$during" "$ratio" "$n" >> "$RESULTS"
