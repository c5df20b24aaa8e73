#!/usr/bin/env bash
# P1: `ferry bundle extract` of a bundle in the page cache against
# `openssl dgst -sha256` (the fastest hash here) and against what people do
# by hand (`sha256sum -c && tar -xf`), measured side by side, best of N.
# Prints one table row per figure and appends JSON lines to $RESULTS.
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
SIZE_MIB=${P1_SIZE_MIB:-2048}
RUNS=${P1_RUNS:-3}
WORK=${BENCH_DIR:-/var/tmp/ferry-bench}
RESULTS=${RESULTS:-$WORK/results.jsonl}
mkdir -p "$WORK"
tarfile=$(mkbig -size-mib "$SIZE_MIB" -out "$WORK")
shafile=${tarfile%.tar}.sha256
dest=$WORK/extract
cat "$tarfile" > /dev/null # into the page cache

# best TIME, peak RSS (KiB) and fewest CPU-seconds (user+sys) of a
# command over RUNS runs
measure() {
  local best="" rss=0 cpu="" out
  for _ in $(seq "$RUNS"); do
    rm -rf "$dest" "$WORK"/.staging-extract "$WORK/cp-floor.tar"; mkdir -p "$WORK/by-hand"
    sync; /usr/bin/time -o "$WORK/time.out" -f '%e %M %U %S' "$@" >/dev/null
    read -r t m u sy < <(tail -1 "$WORK/time.out")
    local c
    c=$(awk "BEGIN{printf \"%.2f\", $u+$sy}")
    if [ -z "$best" ] || awk "BEGIN{exit !($t < $best)}"; then best=$t; fi
    if [ -z "$cpu" ] || awk "BEGIN{exit !($c < $cpu)}"; then cpu=$c; fi
    [ "$m" -gt "$rss" ] && rss=$m
  done
  rm -f "$WORK/cp-floor.tar"
  echo "$best $rss $cpu"
}

read -r t_ossl _ c_ossl < <(measure openssl dgst -sha256 "$tarfile")
read -r _ _ c_cp < <(measure cp "$tarfile" "$WORK/cp-floor.tar")
read -r t_ferry rss_ferry c_ferry < <(measure bin/ferry bundle extract "$tarfile" --dest "$dest" --quiet)
# The work's floor in CPU-seconds: the tar's hash and every blob's (two
# openssl passes) and one copy into the page cache (cp).
c_floor=$(awk "BEGIN{printf \"%.2f\", 2*$c_ossl+$c_cp}")
read -r t_hand _ < <(measure bash -c "cd '$(dirname "$tarfile")' && sha256sum -c --quiet '$(basename "$shafile")' && rm -rf '$WORK/by-hand' && mkdir -p '$WORK/by-hand' && tar -xf '$tarfile' -C '$WORK/by-hand'")
rm -rf "$dest" "$WORK/by-hand"

# What hashing every blob against its path costs (DESIGN.md §3.5): the
# same extraction with it off, which only this benchmark can do (a Go
# benchmark: left out on a machine without Go).
ns_on=null ns_off=null
if command -v go >/dev/null; then
  bench=$(go test -run '^$' -bench 'BenchmarkExtract_BlobHashing' -benchtime "${RUNS}x" ./bundle/ 2>&1)
  ns_on=$(awk '/hashing=true/ {print $3}' <<<"$bench")
  ns_off=$(awk '/hashing=false/ {print $3}' <<<"$bench")
  [ -n "$ns_on" ] && [ -n "$ns_off" ] || { echo "$bench" >&2; exit 1; }
fi

ratio() { awk "BEGIN{printf \"%.2f\", $1/$2}"; }
row "P1 extract ${SIZE_MIB} MiB, CPU-seconds" "${c_ferry}s" "$(ratio "$c_ferry" "$c_floor")x" "vs the floor ${c_floor}s (2 x openssl dgst -sha256 ${c_ossl}s + cp ${c_cp}s, user+sys); goal <= 1.25x"
row "P1 extract ${SIZE_MIB} MiB (page cache), wall" "${t_ferry}s" "$(ratio "$t_ferry" "$t_ossl")x" "vs openssl dgst -sha256 (${t_ossl}s); for information"
row "P1 extract vs by hand" "${t_ferry}s" "$(ratio "$t_ferry" "$t_hand")x" "vs sha256sum -c && tar -xf (${t_hand}s)"
[ "$ns_on" = null ] || row "P1 blob hashing on vs off (512 MiB, Go)" "$(awk "BEGIN{printf \"%.2fs\", $ns_on/1e9}")" "$(ratio "$ns_on" "$ns_off")x" "vs the same extraction without it ($(awk "BEGIN{printf \"%.2fs\", $ns_off/1e9}")); the row above has it on"
row "P1 extract peak RSS" "$((rss_ferry/1024)) MiB" "" "goal <= 64 MiB"
printf '{"bench":"P1","size_mib":%s,"ferry_cpu_s":%s,"floor_cpu_s":%s,"openssl_cpu_s":%s,"cp_cpu_s":%s,"ferry_s":%s,"openssl_s":%s,"by_hand_s":%s,"ratio_openssl":%s,"ratio_by_hand":%s,"peak_rss_kib":%s,"blob_hash_on_ns":%s,"blob_hash_off_ns":%s}\n' \
  "$SIZE_MIB" "$c_ferry" "$c_floor" "$c_ossl" "$c_cp" "$t_ferry" "$t_ossl" "$t_hand" "$(ratio "$t_ferry" "$t_ossl")" "$(ratio "$t_ferry" "$t_hand")" "$rss_ferry" "$ns_on" "$ns_off" >> "$RESULTS"
