package udevenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ReadCap is a cgroup whose members read one block device at a capped
// rate: a slow stick.
type ReadCap struct {
	t    testing.TB
	root string // the hierarchy's root cgroup
	dir  string
}

// CapReads makes a cgroup in which reads from dev (a device path) run at
// most rate bytes/s: with cgroup v2's io.max where the io controller is
// available, else with cgroup v1's blkio throttle (these machines mount
// cgroup v1 for blkio). It is removed when the test ends; stop what runs
// in it before then (a cleanup registered after this runs first).
func CapReads(t testing.TB, dev string, rate int64) *ReadCap {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		t.Fatalf("stat %s: %v", dev, err)
	}
	num := fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	root, file, line := "/sys/fs/cgroup/blkio", "blkio.throttle.read_bps_device", fmt.Sprintf("%s %d", num, rate)
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && strings.Contains(" "+string(b)+" ", " io ") {
		root, file, line = "/sys/fs/cgroup", "io.max", fmt.Sprintf("%s rbps=%d", num, rate)
		if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+io"), 0o644); err != nil {
			t.Fatalf("enable the io controller: %v", err)
		}
	}
	dir := filepath.Join(root, fmt.Sprintf("ferry-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		need(t, fmt.Sprintf("no cgroup to cap reads of %s (needs root and cgroup v2 io or v1 blkio): %v", dev, err))
	}
	t.Cleanup(func() { os.Remove(dir) })
	if err := os.WriteFile(filepath.Join(dir, file), []byte(line), 0o644); err != nil {
		t.Fatalf("cap reads of %s: %v", dev, err)
	}
	return &ReadCap{t: t, root: root, dir: dir}
}

// Add moves process pid into the cgroup; it goes back to the root cgroup
// when the test ends.
func (c *ReadCap) Add(pid int) {
	c.t.Helper()
	if err := os.WriteFile(filepath.Join(c.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		c.t.Fatalf("move %d into %s: %v", pid, c.dir, err)
	}
	c.t.Cleanup(func() { os.WriteFile(filepath.Join(c.root, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644) })
}

// Prefix is a command prefix that runs the command inside the cgroup from
// its first instruction.
func (c *ReadCap) Prefix() []string {
	return []string{"sh", "-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, c.dir}
}
