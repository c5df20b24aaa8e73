package netns

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// peerPort is where every node's peer server listens.
const peerPort = 8090

var (
	buildOnce sync.Once
	binDir    string
	binErr    error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// peernode builds cmd/peernode once per test binary.
func peernode(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "ferry-peernode-")
		if binErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", binDir, "./cmd/peernode").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build ./cmd/peernode: %v: %s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, "peernode")
}

// makeBundle writes size random bytes (a stand-in for a bundle tar: the
// transfer layer only cares about the whole-file digest) and returns its
// path and digest.
func makeBundle(t testing.TB, dir string, size int64) (string, string) {
	t.Helper()
	path := filepath.Join(dir, "bundle.tar")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var seed [32]byte
	copy(seed[:], fmt.Sprint(size))
	r := rand.NewChaCha8(seed)
	h := sha256.New()
	buf := make([]byte, 1<<20)
	for left := size; left > 0; left -= int64(len(buf)) {
		b := buf[:min(int64(len(buf)), left)]
		_, _ = r.Read(b)
		h.Write(b)
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	return path, "sha256:" + hex.EncodeToString(h.Sum(nil))
}

func fileDigest(t testing.TB, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// report mirrors cmd/peernode's status file.
type report struct {
	Node        string   `json:"node"`
	Phase       string   `json:"phase"`
	Digest      string   `json:"digest"`
	Done        int64    `json:"done"`
	Total       int64    `json:"total"`
	Pieces      int      `json:"pieces"`
	StartPieces int      `json:"startPieces"`
	Dropped     []string `json:"dropped"`
	Seconds     float64  `json:"seconds"`
	Error       string   `json:"error"`
}

// cluster runs peernode processes on a lab's nodes.
type cluster struct {
	t      testing.TB
	lab    *Lab
	bin    string
	bundle string
	digest string
	size   int64
	flags  []string // extra flags for every process
}

func newCluster(t testing.TB, nodes int, rate, size int64) *cluster {
	t.Helper()
	lab := New(t, Options{Nodes: nodes, RateBytes: rate})
	// 1 MiB pieces: 64 of them in the test bundle, enough for the nodes
	// to share.
	c := &cluster{t: t, lab: lab, bin: peernode(t), size: size, flags: []string{"-piece-size", "1048576"}}
	c.bundle, c.digest = makeBundle(t, lab.Dir, size)
	return c
}

func (c *cluster) statusPath(n *Node) string { return filepath.Join(n.Dir, "status.json") }
func (c *cluster) dest(n *Node) string       { return filepath.Join(n.Dir, "incoming.tar") }

func (c *cluster) report(n *Node) report {
	var r report
	b, err := os.ReadFile(c.statusPath(n))
	if err == nil {
		_ = json.Unmarshal(b, &r)
	}
	return r
}

// hold starts n serving the bundle whole.
func (c *cluster) hold(n *Node, extra ...string) *Proc {
	os.Remove(c.statusPath(n))
	args := []string{c.bin, "-node", n.Name, "-listen", n.Addr(peerPort), "-status", c.statusPath(n), "-hold", c.bundle}
	return n.Start("peernode", append(append(args, c.flags...), extra...)...)
}

// fetch starts n fetching the bundle from peers.
func (c *cluster) fetch(n *Node, peers []string, extra ...string) *Proc {
	os.Remove(c.statusPath(n))
	args := []string{c.bin, "-node", n.Name, "-listen", n.Addr(peerPort), "-status", c.statusPath(n),
		"-fetch", c.digest, "-dest", c.dest(n), "-peers", strings.Join(peers, ",")}
	return n.Start("peernode", append(append(args, c.flags...), extra...)...)
}

// others are the peer addresses of every node but n.
func (c *cluster) others(n *Node) []string {
	var out []string
	for _, m := range c.lab.Nodes() {
		if m != n {
			out = append(out, m.Addr(peerPort))
		}
	}
	return out
}

// waitFor polls cond until it holds, failing after timeout with what.
func (c *cluster) waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			c.t.Fatalf("timed out after %s waiting for %s", timeout, what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitPhase waits for n to report phase (or fails early on "error").
func (c *cluster) waitPhase(ctx context.Context, n *Node, p *Proc, phase string) report {
	c.t.Helper()
	var r report
	c.waitFor(ctx, 5*time.Minute, n.Name+" to be "+phase, func() bool {
		r = c.report(n)
		if r.Phase == "error" && phase != "error" {
			c.t.Fatalf("%s: %s", n.Name, r.Error)
		}
		if done, err := p.Exited(); done && r.Phase != phase {
			c.t.Fatalf("%s exited (%v) while waiting for %s: %s", n.Name, err, phase, p.Log())
		}
		return r.Phase == phase
	})
	return r
}

// checkHolds checks n's fetched file is the bundle.
func (c *cluster) checkHolds(n *Node) {
	c.t.Helper()
	if got := fileDigest(c.t, c.dest(n)); got != c.digest {
		c.t.Fatalf("%s holds %s, want %s", n.Name, got, c.digest)
	}
}

const (
	testSize = 64 << 20
	testRate = 25 << 20 // bytes/s per link and direction: ~2.5 s per copy
)

// fanOut makes the first node the source and starts every other one
// fetching from all the rest.
func (c *cluster) fanOut(t *testing.T, nodes []*Node) (*Proc, map[*Node]*Proc) {
	src := c.hold(nodes[0])
	c.waitPhase(t.Context(), nodes[0], src, "ready")
	procs := map[*Node]*Proc{}
	for _, n := range nodes[1:] {
		procs[n] = c.fetch(n, c.others(n))
	}
	return src, procs
}

// TestFanOut_AllNodesEndWithTheBundle: one source, three nodes fetching
// from every other node; all end with the same verified file, and the
// source did not send three whole copies.
func TestFanOut_AllNodesEndWithTheBundle(t *testing.T) {
	c := newCluster(t, 4, testRate, testSize)
	nodes := c.lab.Nodes()
	_, procs := c.fanOut(t, nodes)
	for _, n := range nodes[1:] {
		r := c.waitPhase(t.Context(), n, procs[n], "ready")
		c.checkHolds(n)
		if len(r.Dropped) != 0 {
			t.Errorf("%s dropped honest peers %v", n.Name, r.Dropped)
		}
	}
	// How much the source sent, from its namespace's interface counters.
	out, err := nodes[0].Exec(t.Context(), "cat", "/sys/class/net/eth0/statistics/tx_bytes")
	if err != nil {
		t.Fatalf("read tx_bytes: %v: %s", err, out)
	}
	var sent int64
	fmt.Sscan(string(out), &sent)
	t.Logf("source sent %.2f copies of the bundle to 3 nodes", float64(sent)/float64(c.size))
	if sent >= 3*c.size {
		t.Errorf("source sent %d bytes, %.2f copies: the nodes did not share pieces", sent, float64(sent)/float64(c.size))
	}
}

// TestFanOut_PeerKilledMidTransfer: a fetching node dies; the others still
// end with the bundle.
func TestFanOut_PeerKilledMidTransfer(t *testing.T) {
	c := newCluster(t, 4, testRate, testSize)
	nodes := c.lab.Nodes()
	_, procs := c.fanOut(t, nodes)
	victim := nodes[2]
	c.waitFor(t.Context(), 2*time.Minute, victim.Name+" a quarter through", func() bool {
		return c.report(victim).Done >= c.size/4
	})
	procs[victim].Kill()
	if r := c.report(victim); r.Phase == "ready" {
		t.Fatalf("%s finished before it could be killed; make the test bundle larger", victim.Name)
	}
	for _, n := range []*Node{nodes[1], nodes[3]} {
		c.waitPhase(t.Context(), n, procs[n], "ready")
		c.checkHolds(n)
	}
}

// TestFanOut_FlippingPeerIsDropped: a node holding the bundle sits behind a
// proxy that flips a byte of every piece; the fetchers drop it and still
// end with the bundle from the others.
func TestFanOut_FlippingPeerIsDropped(t *testing.T) {
	c := newCluster(t, 4, testRate, testSize)
	nodes := c.lab.Nodes()
	src := c.hold(nodes[0])
	liar := nodes[3]
	lp := c.hold(liar, "-listen", "127.0.0.1:8091") // later -listen wins
	c.waitPhase(t.Context(), nodes[0], src, "ready")
	c.waitPhase(t.Context(), liar, lp, "ready")
	liar.Start("flipproxy", c.bin, "-node", "proxy", "-proxy", "127.0.0.1:8091", "-listen", liar.Addr(peerPort))
	procs := map[*Node]*Proc{}
	for _, n := range nodes[1:3] {
		procs[n] = c.fetch(n, c.others(n))
	}
	for _, n := range nodes[1:3] {
		r := c.waitPhase(t.Context(), n, procs[n], "ready")
		c.checkHolds(n)
		if strings.Join(r.Dropped, ",") != liar.Addr(peerPort) {
			t.Errorf("%s dropped %v, want only the flipping peer %s", n.Name, r.Dropped, liar.Addr(peerPort))
		}
	}
}

// TestFanOut_Restarts: the source restarts mid-transfer and the fetchers
// carry on; a fetching node restarts mid-transfer and resumes from its
// record instead of starting over.
func TestFanOut_Restarts(t *testing.T) {
	c := newCluster(t, 3, testRate, testSize)
	nodes := c.lab.Nodes()
	src, procs := c.fanOut(t, nodes)
	c.waitFor(t.Context(), 2*time.Minute, "a third of the bundle fetched", func() bool {
		return c.report(nodes[1]).Done >= c.size/3
	})
	src.Kill()
	if c.report(nodes[1]).Phase == "ready" || c.report(nodes[2]).Phase == "ready" {
		t.Fatal("fetch finished before the source was killed; make the test bundle larger")
	}
	src = c.hold(nodes[0])

	resumed := nodes[2]
	c.waitFor(t.Context(), 2*time.Minute, resumed.Name+" half through", func() bool {
		return c.report(resumed).Done >= c.size/2
	})
	if err := procs[resumed].Stop(10 * time.Second); err != nil {
		t.Logf("%s stopped: %v", resumed.Name, err)
	}
	held := c.report(resumed).Pieces
	if held == 0 {
		t.Fatal("the stopped node held no piece")
	}
	procs[resumed] = c.fetch(resumed, c.others(resumed))
	for _, n := range nodes[1:] {
		c.waitPhase(t.Context(), n, procs[n], "ready")
		c.checkHolds(n)
	}
	if r := c.report(resumed); r.StartPieces < held {
		t.Fatalf("%s restarted with %d pieces, it held %d before: it did not resume", resumed.Name, r.StartPieces, held)
	}
}

// TestFanOut_TokenMismatchRefused: a node with the wrong token gets
// nothing; one with the right token gets the bundle.
func TestFanOut_TokenMismatchRefused(t *testing.T) {
	c := newCluster(t, 3, 0, 8<<20)
	nodes := c.lab.Nodes()
	src := c.hold(nodes[0], "-token", "right")
	c.waitPhase(t.Context(), nodes[0], src, "ready")
	good := c.fetch(nodes[1], []string{nodes[0].Addr(peerPort)}, "-token", "right")
	bad := c.fetch(nodes[2], []string{nodes[0].Addr(peerPort)}, "-token", "wrong")
	r := c.waitPhase(t.Context(), nodes[2], bad, "error")
	if !strings.Contains(r.Error, "token") {
		t.Errorf("error with a wrong token does not say so: %s", r.Error)
	}
	c.waitPhase(t.Context(), nodes[1], good, "ready")
	c.checkHolds(nodes[1])
	if _, err := os.Stat(c.dest(nodes[2])); err == nil && fileDigest(t, c.dest(nodes[2])) == c.digest {
		t.Fatal("the node with the wrong token got the bundle")
	}
}
