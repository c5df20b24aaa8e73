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

# unit_setting KEY [FILE] prints KEY's last value in packaging/ferry.service
# (or packaging/FILE: ferry.slice holds the weights).
unit_setting() { awk -F= -v k="$1" '$1 == k { v = $2 } END { print v }' "packaging/${2:-ferry.service}"; }

# unit_cgroup_setup makes a cgroup at the top of the tree as ferry.slice's
# settings would give it (these hosts have no systemd as PID 1; see
# TESTING.md "Pressure and priority"). On cgroup v2 (RHCOS): cpu.weight
# and io.weight as the slice's CPUWeight and IOWeight. On cgroup v1: a cpu
# group with cpu.shares by systemd's mapping (weight × 1024 / 100), and
# blkio's BFQ weight from IOWeight (× 500 / 100, systemd's IOWeight to
# BlockIOWeight) only where the disk's scheduler is BFQ. Sets $unit_cg and
# $unit_io_note; call unit_cgroup_cleanup at the end.
unit_cgroup_setup() {
  local w iow sched cpu
  w=$(unit_setting CPUWeight ferry.slice) iow=$(unit_setting IOWeight ferry.slice)
  sched=$(cat /sys/block/"$(disk_of "${BENCH_DIR:-/var/tmp}")"/queue/scheduler 2>/dev/null | tr -d '\n')
  unit_blkio=""
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    unit_cg=/sys/fs/cgroup/ferry-bench-$$
    echo +cpu > /sys/fs/cgroup/cgroup.subtree_control
    echo +io > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    mkdir -p "$unit_cg"
    echo "$w" > "$unit_cg/cpu.weight"
    if echo "default $iow" > "$unit_cg/io.weight" 2>/dev/null; then
      # only BFQ or the io.cost controller act on it
      if [[ $sched == *"[bfq]"* ]] || grep -q "enable=1" /sys/fs/cgroup/io.cost.qos 2>/dev/null; then
        unit_io_note="io.weight $iow (scheduler $sched)"
      else
        unit_io_note="io.weight $iow inert: scheduler $sched, no io.cost"
      fi
    else
      unit_io_note="io.weight not settable (scheduler $sched)"
    fi
    cpu="cpu.weight $(cat "$unit_cg/cpu.weight")"
  else
    unit_cg=/sys/fs/cgroup/cpu/ferry-bench-$$
    mkdir -p "$unit_cg"
    echo $(( w * 1024 / 100 )) > "$unit_cg/cpu.shares"
    if [ -f /sys/fs/cgroup/blkio/blkio.bfq.weight ]; then
      unit_blkio=/sys/fs/cgroup/blkio/ferry-bench-$$
      mkdir -p "$unit_blkio"
      echo $(( iow * 500 / 100 )) > "$unit_blkio/blkio.bfq.weight"
      unit_io_note="blkio.bfq.weight $(( iow * 500 / 100 ))"
    else
      unit_io_note="IOWeight inert: scheduler $sched"
    fi
    cpu="cpu.shares $(cat "$unit_cg/cpu.shares")"
  fi
  echo "as the unit: $cpu, nice $(unit_setting Nice), ionice -c2 -n$(unit_setting IOSchedulingPriority), $unit_io_note" >&2
}

unit_cgroup_cleanup() {
  [ -n "${unit_cg:-}" ] && rmdir "$unit_cg" 2>/dev/null
  [ -n "${unit_blkio:-}" ] && rmdir "$unit_blkio" 2>/dev/null
  true
}

# pods_cgroup_setup: on cgroup v2, etcd's stand-in job runs in
# kubepods.slice, where the kubelet puts etcd's static pod on a
# control-plane node, so that ferry paces by the pods' pressure
# (pacing.watch's default there, as on RHCOS) and not the node's, which
# counts ferry's own waits too. Made for the bench where absent, removed by
# pods_cgroup_cleanup. Sets $pods_cg ("" on cgroup v1) and $pods_note.
pods_cgroup_setup() {
  pods_cg="" pods_made="" pods_note="ferry paced by the node's pressure (cgroup v1)"
  [ -f /sys/fs/cgroup/cgroup.controllers ] || return 0
  pods_cg=/sys/fs/cgroup/kubepods.slice
  [ -d "$pods_cg" ] || { mkdir "$pods_cg"; pods_made=1; }
  pods_note="etcd's job in kubepods.slice, ferry paced by its pressure"
}

pods_cgroup_cleanup() {
  [ -n "${pods_made:-}" ] && rmdir "$pods_cg" 2>/dev/null
  true
}

# in_pods CMD... runs CMD in $pods_cg where there is one.
in_pods() {
  if [ -n "${pods_cg:-}" ]; then
    bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' _ "$pods_cg" "$@"
  else
    "$@"
  fi
}

# mkbig ARGS... makes the benches' bundle (test/bench/mkbig) and prints its
# path; FERRY_MKBIG names a built one for a machine without Go.
mkbig() {
  if [ -n "${FERRY_MKBIG:-}" ]; then "$FERRY_MKBIG" "$@"; else go run ./test/bench/mkbig "$@"; fi
}

# as_unit CMD... runs CMD in the unit's cgroup with its nice and ionice.
# In the background, start it as `(exec_as_unit CMD...) &`: then $! is
# CMD's own pid (each step execs), to kill it by.
as_unit() { (exec_as_unit "$@"); }
exec_as_unit() {
  local n p
  n=$(unit_setting Nice) p=$(unit_setting IOSchedulingPriority)
  exec bash -c 'echo $$ > "$1/cgroup.procs"; [ -n "$2" ] && echo $$ > "$2/cgroup.procs"; shift 2; exec "$@"' _ \
    "$unit_cg" "${unit_blkio:-}" nice -n "$n" ionice -c2 -n"$p" "$@"
}

# disk_of DIR prints the block device name (vda) that holds DIR.
disk_of() {
  local src
  src=$(df --output=source "$1" | tail -1)
  src=${src#/dev/}
  echo "${src%%[0-9]*}" | sed 's/p$//'
}

# io_pressure_total prints /proc/pressure/io's "some" total (µs stalled).
io_pressure_total() { awk '/^some/ { sub("total=", "", $5); print $5 }' /proc/pressure/io; }
