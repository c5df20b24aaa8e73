#!/usr/bin/env bash
# P3: ferry's load of a 180-image bundle into a real CRI-O (registry,
# drop-ins, reload, pulls, pin checks) against CRI-O's own floor measured
# in the same run: raw CRI pulls of the same images with 1, 2, 4 and 8
# workers, the fastest taken; also against one-by-one pulls (what
# upgrade-tool does). test/crio BenchmarkLoad prints the P3 line parsed
# here. P3_IMAGES (default 180), P3_ROUNDS (best of, default 2).
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
RESULTS=${RESULTS:-${BENCH_DIR:-/var/tmp/ferry-bench}/results.jsonl}
export FERRY_BENCH_IMAGES=${P3_IMAGES:-180} FERRY_BENCH_ROUNDS=${P3_ROUNDS:-2}
go_bench "P3 CRI-O load" ./test/crio Load -timeout 60m
# P3 (best of 2 rounds) load of 180 images (181 refs), 2 workers by default: ferry 12.34s; raw pulls
# 1:20.00s 2:13.00s 4:12.50s 8:12.60s (fastest 4 workers); ferry/fastest 0.987 (target ≤ 1.1); ferry/one-by-one 0.617
line=$(echo "$out" | grep -E '^P3 ' | tail -1 || true)
if [ -z "$line" ]; then
  row "P3 CRI-O load" FAILED "" "no P3 line (CRI-O missing? run test/setup/build-crio.sh)"
  exit 1
fi
field() { echo "$line" | sed -E "s#.*$1.*#\\1#"; }
images=$(field 'load of ([0-9]+) images'); refs=$(field '\(([0-9]+) refs\)')
workers=$(field '([0-9]+) workers by default'); ferry=$(field 'ferry ([0-9.]+)s;')
r1=$(field ' 1:([0-9.]+)s'); r2=$(field ' 2:([0-9.]+)s'); r4=$(field ' 4:([0-9.]+)s'); r8=$(field ' 8:([0-9.]+)s')
fw=$(field 'fastest ([0-9]+) workers'); rf=$(field 'ferry/fastest ([0-9.]+)'); r1x=$(field 'ferry/one-by-one ([0-9.]+)')
fastest=$(awk -v a="$r1" -v b="$r2" -v c="$r4" -v d="$r8" 'BEGIN{m=a; if(b<m)m=b; if(c<m)m=c; if(d<m)m=d; print m}')
row "P3 CRI-O load, $images images ($refs refs)" "${ferry}s" "$(printf %.2fx "$rf")" \
  "vs fastest raw CRI pulls ($fw workers, ${fastest}s); goal <= 1.1x"
row "P3 CRI-O load vs one by one" "${ferry}s" "$(printf %.2fx "$r1x")" \
  "vs raw pulls one by one (${r1}s); ferry used $workers workers"
printf '{"bench":"P3","images":%s,"refs":%s,"ferry_workers":%s,"ferry_s":%s,"raw1_s":%s,"raw2_s":%s,"raw4_s":%s,"raw8_s":%s,"fastest_workers":%s,"ratio_fastest":%s,"ratio_one_by_one":%s}\n' \
  "$images" "$refs" "$workers" "$ferry" "$r1" "$r2" "$r4" "$r8" "$fw" "$rf" "$r1x" >> "$RESULTS"
