#!/usr/bin/env bash
# N3: ferry's speed when the node is quiet. `ferry bundle extract --sync`
# (synced as the agent extracts: its own writeback waits and the kernel's
# journal commits show in the node's IO pressure) with pacing (the
# default, etcd-safe) and with --pacing off, alternated, best of N each,
# under the unit's settings. Goal: pacing on >= 0.95x the speed
# of off. The host's own IO pressure during the paced runs is printed: on a
# node that is not quiet, pacing is right to hold back.
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
SIZE_MIB=${N3_SIZE_MIB:-2048}
RUNS=${N3_RUNS:-3}
WORK=${BENCH_DIR:-/var/tmp/ferry-bench}
RESULTS=${RESULTS:-$WORK/results.jsonl}
mkdir -p "$WORK"
[ -x bin/ferry ] || make build >&2
tarfile=$(mkbig -size-mib "$SIZE_MIB" -out "$WORK")
dest=$WORK/n3-extract
unit_cgroup_setup
trap 'rm -rf "$dest" "$WORK/.staging-n3-extract" || true; unit_cgroup_cleanup' EXIT
cat "$tarfile" > /dev/null

declare -A best iop
for _ in $(seq "$RUNS"); do
  for pacing in etcd-safe off; do
    rm -rf "$dest"; sync
    io0=$(io_pressure_total) t0=$(date +%s%N)
    as_unit bin/ferry bundle extract "$tarfile" --dest "$dest" --quiet --sync --pacing "$pacing" >/dev/null
    t1=$(date +%s%N) io1=$(io_pressure_total)
    t=$(awk "BEGIN{printf \"%.3f\", ($t1-$t0)/1e9}")
    p=$(awk "BEGIN{printf \"%.0f\", 100*($io1-$io0)/(($t1-$t0)/1000)}")
    echo "pacing $pacing: ${t}s, io pressure ${p}%" >&2
    if [ -z "${best[$pacing]:-}" ] || awk "BEGIN{exit !($t < ${best[$pacing]})}"; then best[$pacing]=$t iop[$pacing]=$p; fi
  done
done
rm -rf "$dest"
ratio=$(awk "BEGIN{printf \"%.2f\", ${best[off]}/${best[etcd-safe]}}")
row "N3 extract ${SIZE_MIB} MiB, pacing on vs off" "${best[etcd-safe]}s" "${ratio}x" "speed vs --pacing off (${best[off]}s), best of $RUNS; io pressure ${iop[etcd-safe]}% in the best paced run; goal >= 0.95x"
printf '{"bench":"N3","size_mib":%s,"paced_s":%s,"off_s":%s,"ratio":%s,"io_pressure_pct":%s}\n' "$SIZE_MIB" "${best[etcd-safe]}" "${best[off]}" "$ratio" "${iop[etcd-safe]}" >> "$RESULTS"
