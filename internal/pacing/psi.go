// Package pacing slows ferry's bulk work (extraction's writes, peer
// fetches and serving, the load's pulls) while the node's other work
// stalls, by the kernel's pressure stall information, and lets it run at
// full speed when the node is quiet (docs/design.md, "Pacing").
package pacing

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// Pressure is the kernel's pressure stall information, as shares of the
// time since the last sample (0–1) in which some task waited for a CPU or
// for IO.
type Pressure interface {
	Sample() (cpu, io float64, err error)
}

// DefaultPSIDir is where Linux (4.20+, CONFIG_PSI) publishes the node's
// pressure.
const DefaultPSIDir = "/proc/pressure"

// KubePodsDir is the kubelet's cgroup of every pod (systemd driver,
// cgroup v2): etcd's and the API server's static pods are in it; ferry
// and CRI-O, system services, are not.
const KubePodsDir = "/sys/fs/cgroup/kubepods.slice"

var kubePods = KubePodsDir // a variable for the tests

// WatchDir is the pressure to pace by (pacing.watch): dir when given;
// else the pods' (KubePodsDir) where the node publishes it (cgroup v2),
// since the node's own pressure also counts ferry's stalls and CRI-O's
// pulls for it, which pacing then holds back against; else the node's.
func WatchDir(dir string) string {
	if dir != "" {
		return dir
	}
	if _, err := os.Stat(filepath.Join(kubePods, "io.pressure")); err == nil {
		return kubePods
	}
	return DefaultPSIDir
}

// PSI reads the pressure files in a directory: /proc/pressure (the whole
// node) or a cgroup v2 directory (its cpu.pressure and io.pressure). Each
// Sample is the growth of the "some" line's total (microseconds stalled)
// over the wall time since the previous Sample: no averaging window to
// lag behind, unlike avg10.
type PSI struct {
	cpuPath, ioPath string
	now             func() time.Time
	node            bool // the whole node's: ferry's own stalls are in it

	mu          sync.Mutex
	last        time.Time
	cpuUs, ioUs uint64
}

var _ Pressure = (*PSI)(nil)

// NewPSI reads the pressure under dir; "" is DefaultPSIDir. The first
// Sample reports 0 (no interval yet).
func NewPSI(dir string) *PSI {
	if dir == "" {
		dir = DefaultPSIDir
	}
	p := &PSI{cpuPath: filepath.Join(dir, "cpu"), ioPath: filepath.Join(dir, "io"), now: time.Now, node: filepath.Clean(dir) == DefaultPSIDir}
	if _, err := os.Stat(p.ioPath); err != nil {
		// a cgroup v2 directory names them cpu.pressure and io.pressure
		if _, err2 := os.Stat(filepath.Join(dir, "io.pressure")); err2 == nil {
			p.cpuPath, p.ioPath = filepath.Join(dir, "cpu.pressure"), filepath.Join(dir, "io.pressure")
		}
	}
	return p
}

// CountsSelf says whether ferry's own stalls are in this pressure: the
// node's counts them, a cgroup ferry is not in (the pods') does not.
func (p *PSI) CountsSelf() bool { return p.node }

// Sample returns the share of time since the last Sample in which some
// task stalled on CPU and on IO.
func (p *PSI) Sample() (cpu, io float64, err error) {
	c, err := readSomeTotal(p.cpuPath)
	if err != nil {
		return 0, 0, err
	}
	i, err := readSomeTotal(p.ioPath)
	if err != nil {
		return 0, 0, err
	}
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.last.IsZero() {
		if us := float64(now.Sub(p.last).Microseconds()); us > 0 {
			cpu = clamp01(float64(c-min(c, p.cpuUs)) / us)
			io = clamp01(float64(i-min(i, p.ioUs)) / us)
		}
	}
	p.last, p.cpuUs, p.ioUs = now, c, i
	return cpu, io, nil
}

// readSomeTotal reads total= of the "some" line of a pressure file:
//
//	some avg10=0.00 avg60=0.00 avg300=0.00 total=12345
func readSomeTotal(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("pressure: %w (a kernel without PSI: boot with psi=1, or set pacing.enabled = false)", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) == 0 || string(f[0]) != "some" {
			continue
		}
		for _, kv := range f[1:] {
			if v, ok := bytes.CutPrefix(kv, []byte("total=")); ok {
				return strconv.ParseUint(string(v), 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("pressure: %s has no \"some ... total=\" line", path)
}

func clamp01(x float64) float64 { return max(0, min(1, x)) }
