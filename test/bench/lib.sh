# Shared by the row scripts of make bench (sourced, not run).

# row prints one line of the table: name, value, ratio, baseline.
row() { printf '%-44s %10s %8s  %s\n' "$@"; }

# bench_metric OUT NAME UNIT prints the value reported with UNIT by Go
# benchmark NAME (its -GOMAXPROCS suffix ignored) in the output OUT:
#   BenchmarkFanOut/p2p/N=4-2  1  123 ns/op  1.23 x-link  6.6 s/fanout
bench_metric() {
  echo "$1" | awk -v name="$2" -v unit="$3" '
    $1 ~ "^"name"(-[0-9]+)?$" { for (i = 2; i < NF; i++) if ($(i+1) == unit) print $i }' | head -1
}

# go_bench LABEL PKG NAME ARGS... runs Go benchmark NAME of PKG once and
# keeps its output in $out (also on stderr, the row's log); when it fails,
# it prints a FAILED row named LABEL and exits.
go_bench() {
  local label=$1 pkg=$2 name=$3
  shift 3
  out=$(go test "$pkg" -run XXX -bench "$name" -benchtime 1x "$@" 2>&1) || {
    echo "$out" >&2
    row "$label" FAILED "" "go test $pkg -bench $name failed"
    exit 1
  }
  echo "$out" >&2
}
