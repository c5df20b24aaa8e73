// Package netns is a test harness that builds a small network of nodes in
// Linux network namespaces and runs processes in them.
//
// A Lab is one bridge namespace and N node namespaces, all named
// ferry-<random>-…; each node is joined to the bridge by a veth pair whose
// ends are created directly in those namespaces, and gets 10.77.<x>.<n>/24
// on its end. Nothing is added to, or changed in, the host's own network
// namespace: the host cannot reach the nodes, so processes report through
// files. A link may be capped by tc (tbf, egress on both ends of the veth:
// the node's upload and its download). Cleanup kills every process the lab
// started (by pid) and deletes its namespaces, on success or failure.
//
// It needs root and iproute2 (ip, tc).
package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Require stops the test unless it can build namespaces: it fails when
// CI=true (CI must run these), and skips with a reason otherwise.
func Require(t testing.TB) {
	t.Helper()
	why := ""
	switch {
	case os.Geteuid() != 0:
		why = "needs root (network namespaces)"
	default:
		for _, b := range []string{"ip", "tc"} {
			if _, err := exec.LookPath(b); err != nil {
				why = b + " not found: run test/setup/install-deps.sh (iproute2)"
			}
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("netns: %s", why)
	}
	t.Skipf("netns: %s", why)
}

// Options shape a lab.
type Options struct {
	// Nodes is how many node namespaces to make.
	Nodes int
	// RateBytes caps each node's link, in bytes per second, in each
	// direction; 0 leaves links uncapped.
	RateBytes int64
}

// Lab is a bridge and its nodes.
type Lab struct {
	t      testing.TB
	prefix string // ferry-<rand>
	bridge string // bridge namespace
	subnet int
	Dir    string // scratch directory shared by the test and its processes
	nodes  []*Node

	mu    sync.Mutex
	procs []*Proc
}

// Node is one namespace with an address on the lab's bridge.
type Node struct {
	lab  *Lab
	Name string // node0, node1, …
	NS   string // its namespace
	IP   string
	Dir  string // scratch directory of its own
}

// New builds a lab of opts.Nodes nodes; t.Cleanup tears it down.
func New(t testing.TB, opts Options) *Lab {
	t.Helper()
	Require(t)
	var rb [3]byte
	_, _ = rand.Read(rb[:])
	l := &Lab{
		t:      t,
		prefix: "ferry-" + hex.EncodeToString(rb[:]),
		subnet: 1 + int(rb[0])%250,
		Dir:    t.TempDir(),
	}
	l.bridge = l.prefix + "-br"
	t.Cleanup(l.close)
	l.ip("netns", "add", l.bridge)
	l.ip("-n", l.bridge, "link", "set", "lo", "up")
	l.ip("-n", l.bridge, "link", "add", "br0", "type", "bridge")
	l.ip("-n", l.bridge, "link", "set", "br0", "up")
	for i := 0; i < opts.Nodes; i++ {
		n := &Node{
			lab:  l,
			Name: "node" + strconv.Itoa(i),
			NS:   l.prefix + "-" + strconv.Itoa(i),
			IP:   fmt.Sprintf("10.77.%d.%d", l.subnet, i+1),
			Dir:  filepath.Join(l.Dir, "node"+strconv.Itoa(i)),
		}
		if err := os.MkdirAll(n.Dir, 0o755); err != nil {
			t.Fatal(err)
		}
		veth := "v" + strconv.Itoa(i)
		l.ip("netns", "add", n.NS)
		l.nodes = append(l.nodes, n)
		l.ip("-n", n.NS, "link", "set", "lo", "up")
		// What binds port 0 in a node (CRI-O's stream server, ferry's
		// registry) takes a port below the host's ephemeral range, where
		// the host's servers that forwardPort brings into the node live:
		// the two never meet on one port.
		l.run("ip", "netns", "exec", n.NS, "sysctl", "-q", "-w", "net.ipv4.ip_local_port_range=20000 29999")
		// Both ends are created inside the lab's namespaces: the host's
		// namespace never sees them.
		l.ip("-n", l.bridge, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", n.NS)
		l.ip("-n", l.bridge, "link", "set", veth, "master", "br0", "up")
		l.ip("-n", n.NS, "addr", "add", n.IP+"/24", "dev", "eth0")
		l.ip("-n", n.NS, "link", "set", "eth0", "up")
		if opts.RateBytes > 0 {
			l.rate(n.NS, "eth0", opts.RateBytes)   // upload
			l.rate(l.bridge, veth, opts.RateBytes) // download
		}
	}
	return l
}

// Nodes are the lab's nodes, in order.
func (l *Lab) Nodes() []*Node { return l.nodes }

// rate caps dev's egress in ns with a token bucket.
func (l *Lab) rate(ns, dev string, bytesPerSec int64) {
	bits := strconv.FormatInt(bytesPerSec*8, 10) + "bit"
	// burst: ~4 ms at the rate but at least two 64 KiB GSO segments;
	// queue: up to 50 ms of backlog.
	burst := strconv.FormatInt(max(bytesPerSec/250, 128<<10), 10)
	l.run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", bits, "burst", burst, "latency", "50ms")
}

func (l *Lab) ip(args ...string) { l.run("ip", args...) }

func (l *Lab) run(name string, args ...string) {
	l.t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		l.t.Fatalf("netns: %s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

func (l *Lab) close() {
	l.mu.Lock()
	procs := l.procs
	l.mu.Unlock()
	for _, p := range procs {
		p.Kill()
	}
	for _, n := range l.nodes {
		if out, err := exec.Command("ip", "netns", "del", n.NS).CombinedOutput(); err != nil {
			l.t.Errorf("netns: delete %s: %v: %s", n.NS, err, out)
		}
	}
	if out, err := exec.Command("ip", "netns", "del", l.bridge).CombinedOutput(); err != nil {
		l.t.Errorf("netns: delete %s: %v: %s", l.bridge, err, out)
	}
	if l.t.Failed() {
		for _, p := range procs {
			b, _ := os.ReadFile(p.LogPath)
			if len(b) > 4000 {
				b = append([]byte("…"), b[len(b)-4000:]...)
			}
			l.t.Logf("--- %s log (%s):\n%s", p.Name, p.LogPath, b)
		}
	}
}

// Addr is host:port of the node's address.
func (n *Node) Addr(port int) string { return n.IP + ":" + strconv.Itoa(port) }

// Exec runs a short command in the node's namespace and returns its output.
func (n *Node) Exec(ctx context.Context, argv ...string) ([]byte, error) {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.NS}, argv...)...).CombinedOutput()
}

// Proc is a process running in a node.
type Proc struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
}

// Start runs argv in the node's namespace, its output going to a log file
// in the node's directory. It dies with the test binary (PDEATHSIG) and is
// killed at cleanup.
func (n *Node) Start(name string, argv ...string) *Proc {
	t := n.lab.t
	t.Helper()
	p := &Proc{Name: n.Name + "/" + name, LogPath: filepath.Join(n.Dir, name+".log"), done: make(chan struct{})}
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	// ip netns exec execs argv in place: the pid is the process's own.
	p.cmd = exec.Command("ip", append([]string{"netns", "exec", n.NS}, argv...)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.Dir = n.Dir
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("netns: start %s: %v", p.Name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	n.lab.mu.Lock()
	n.lab.procs = append(n.lab.procs, p)
	n.lab.mu.Unlock()
	return p
}

// Kill sends SIGKILL to the process (by pid) and waits for it.
func (p *Proc) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Stop sends SIGTERM and waits, killing it after grace.
func (p *Proc) Stop(grace time.Duration) error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
	return p.err
}

// Exited reports whether the process ended, and its error.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Log is the process's output so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(bytes.TrimSpace(b))
}
