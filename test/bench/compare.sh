#!/usr/bin/env bash
# make bench-compare: the rows of BENCH_ONLY (default "p2 p2c") measured
# for an earlier commit (BENCH_BASE, default HEAD~1) and for this tree in
# one run, each row of the base right before the same row of this tree so
# that both see the same machine, then each value of this tree as a ratio
# to the base's. A restructuring that must not change speed shows ~1.00x.
set -uo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
base=$(git rev-parse --short "${BENCH_BASE:-HEAD~1}") || exit 1
only=${BENCH_ONLY:-p2 p2c}
export BENCH_DIR=${BENCH_DIR:-/var/tmp/ferry-bench}
mkdir -p "$BENCH_DIR"
tree=$(mktemp -d "$BENCH_DIR/base-XXXXXX")
trap 'git worktree remove --force "$tree" >/dev/null 2>&1; rm -rf "$tree"' EXIT
git worktree add --detach "$tree" "$base" >/dev/null || exit 1
(cd "$tree" && make build >/dev/null) || { echo "cannot build $base" >&2; exit 1; }

# rows DIR NAME prints row NAME's lines as measured by the tree in DIR.
rows() {
  (cd "$1" && BENCH_ONLY=$2 RESULTS=$BENCH_DIR/compare-$2.jsonl bash test/bench/run.sh 2>&1 |
    grep -v "^benchmark \|^raw numbers\|^failed rows" | tee -a "$BENCH_DIR/compare.log" /dev/stderr)
}

# squeeze TEXT prints TEXT with its runs of blanks made one space.
squeeze() { tr -s ' ' <<<"$1" | sed 's/^ //'; }

# seconds "12.3s" prints 12.3 (nothing for a value that is not seconds).
seconds() { sed -n 's/^\([0-9.]*\)s$/\1/p' <<<"$1"; }

status=0
row "benchmark (this tree vs $base)" "this" "ratio" "base"
for name in $only; do
  old=$(rows "$tree" "$name") new=$(rows . "$name")
  while IFS= read -r line; do
    label=${line:0:44} value=$(awk '{print $1}' <<<"${line:45}")
    label=${label%"${label##*[! ]}"}
    was=$(grep -F -- "$label " <<<"$old" | head -1)
    was=$(awk '{print $1}' <<<"${was:45}")
    a=$(seconds "$value") b=$(seconds "$was")
    if [ -z "$a" ] || [ -z "$b" ]; then
      [[ "$line$was" == *FAILED* ]] && status=1
      row "$label" "" "" "this: $(squeeze "${line:45}"); base: $(squeeze "$(grep -F -- "$label " <<<"$old" | head -1 | cut -c46-)")"
      continue
    fi
    row "$label" "$value" "$(awk "BEGIN{printf \"%.3fx\", $a/$b}")" "base: $was"
  done <<<"$new"
done
exit $status
