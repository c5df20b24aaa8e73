package netns

// Issue 5's "must show" with real `ferry agent` processes: each node of a
// lab runs the agent built from this checkout (and, where the test loads
// images, its own real CRI-O) inside the node's network namespace; the
// agents find each other through [peer] listen/peers and nothing else.

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/test/bigbundle"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/fixture"
)

const (
	// agentBound bounds every wait on an agent: generous, these machines
	// are shared and slow.
	agentBound = 3 * time.Minute
	// bigSize is the bundle for the mid-transfer cases: at bigRate it
	// takes ~5 s to cross one link, long enough to kill things in.
	bigSize, bigBlob = 256 << 20, 8 << 20
	bigRate          = 50 * 1000 * 1000
)

// fleet is a lab whose nodes run real agents.
type fleet struct {
	t     testing.TB
	lab   *Lab
	nodes []*anode
}

// anode is one node's agent (and CRI-O, when the fleet loads images).
type anode struct {
	*Node
	Cfg  agent.Config
	A    *ferryenv.Agent
	CRIO *crioenv.CRIO
	// Hook is the file the on_ready hook appends the release to.
	Hook string
}

// fleetOptions shape a fleet.
type fleetOptions struct {
	Nodes int
	Rate  int64 // per-link cap, bytes/s; 0: none
	// CRIO gives every node a real CRI-O, so that bundles load and the
	// cluster gate can open; without it nodes stop at "extracted".
	CRIO bool
	// Token per node index ("" for none); a missing entry is "cluster".
	Tokens map[int]string
	// Listen overrides a node's [peer] listen (e.g. behind a proxy).
	Listen map[int]string
	// Setup, when set, adjusts each node's config before its agent starts.
	Setup func(n *Node, cfg *agent.Config)
}

// newFleet builds the lab and starts an agent (and CRI-O) on every node,
// each with the others as its peers, and waits for them to be idle.
func newFleet(t testing.TB, o fleetOptions) *fleet {
	t.Helper()
	start := time.Now()
	lab := New(t, Options{Nodes: o.Nodes, RateBytes: o.Rate})
	f := &fleet{t: t, lab: lab}
	for i, n := range lab.Nodes() {
		an := &anode{Node: n, Hook: filepath.Join(n.Dir, "hook.out")}
		cfg := ferryenv.Config(filepath.Join(n.Dir, "root"))
		cfg.NodeName = n.Name
		// The nodes share this one kernel, so its pressure stall
		// information is every node's: paced, each agent would take the
		// others' work for its node's and hold back, as no real node does.
		cfg.Pacing.Enabled = false
		cfg.Peer.Listen = n.Addr(peerPort)
		if l := o.Listen[i]; l != "" {
			cfg.Peer.Listen = l
		}
		for _, m := range lab.Nodes() {
			if m != n {
				cfg.Peer.Peers = append(cfg.Peer.Peers, m.Addr(peerPort))
			}
		}
		tok, ok := o.Tokens[i]
		if !ok {
			tok = "cluster"
		}
		if tok != "" {
			cfg.Peer.TokenFile = filepath.Join(n.Dir, "token")
			if err := os.WriteFile(cfg.Peer.TokenFile, []byte(tok+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		cfg.Cluster.OnReady = []string{"/bin/sh", "-c", `echo "$FERRY_RELEASE" >> ` + an.Hook}
		if o.CRIO {
			// nsenter --net execs CRI-O in place (its pid is the pid
			// file's, for SIGHUP) in the node's network namespace, where
			// the agent's embedded registry listens on 127.0.0.1.
			c := crioenv.StartIn(t, []string{"nsenter", "--net=/run/netns/" + n.NS})
			an.CRIO = c
			c.Configure(&cfg)
		}
		if o.Setup != nil {
			o.Setup(n, &cfg)
		}
		an.Cfg = cfg
		an.A = ferryenv.StartIn(t, []string{"ip", "netns", "exec", n.NS}, cfg)
		f.nodes = append(f.nodes, an)
	}
	for _, an := range f.nodes {
		an.A.WaitPhase(agentBound, "idle")
	}
	t.Logf("%d nodes up (CRI-O: %v) in %s", o.Nodes, o.CRIO, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			for _, an := range f.nodes {
				t.Logf("--- %s agent log (tail):\n%s", an.Name, tail(an.A.Logs(), 60))
			}
		}
	})
	return f
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// load gives n the bundle file, as a plugged stick would.
func (an *anode) load(t testing.TB, tarPath string) {
	t.Helper()
	if out, err := an.A.Ferry("load", tarPath); err != nil {
		t.Fatalf("%s: ferry load %s: %v\n%s", an.Name, tarPath, err, out)
	}
}

// loadOrFetching is load for a node that may already be fetching the
// same bundle from a peer that offered it while reading its own copy
// (cut-through): then the load is refused as busy, and the node comes to
// hold the bundle all the same.
func (an *anode) loadOrFetching(t testing.TB, tarPath, digest string) {
	t.Helper()
	out, err := an.A.Ferry("load", tarPath)
	if err == nil {
		return
	}
	if s, serr := an.A.Status(context.Background()); serr == nil && s.Phase == string(agent.PhaseFetching) && string(s.Digest) == digest {
		t.Logf("%s was already fetching %s from a peer when it was given the tar", an.Name, digest)
		return
	}
	t.Fatalf("%s: ferry load %s: %v\n%s", an.Name, tarPath, err, out)
}

// waitHolds waits for n to hold digest in phase p (a node holds a bundle
// fetched from peers in "fetching" until it is extracted).
func (an *anode) waitHolds(t testing.TB, p agent.Phase, digest string) agent.Status {
	t.Helper()
	s := an.A.WaitPhase(agentBound, p)
	if string(s.Digest) != digest {
		t.Fatalf("%s is %s with %s, want %s", an.Name, p, s.Digest, digest)
	}
	return s
}

// fetchState is the fetcher's resume record on n for digest: present
// exactly while a fetch is unfinished.
func (an *anode) fetchState(digest string) string {
	m, _ := filepath.Glob(filepath.Join(an.Cfg.Paths.StateDir, "incoming", strings.TrimPrefix(digest, "sha256:"), "*.tar"))
	if len(m) == 0 {
		return peer.StatePath(filepath.Join(an.Cfg.Paths.StateDir, "incoming", strings.TrimPrefix(digest, "sha256:"), "none.tar"))
	}
	return peer.StatePath(m[0])
}

// resumeBytes reads n's resume record for digest (after n was killed):
// the bytes of verified pieces it kept. It fails the test when there is no
// record (the fetch was not in progress) or it keeps nothing.
func (an *anode) resumeBytes(t *testing.T, digest string) int64 {
	t.Helper()
	b, err := os.ReadFile(an.fetchState(digest))
	if err != nil {
		t.Fatalf("%s's fetch was not in progress when it was killed (%v): the transfer is too fast for this test; make the bundle bigger or the links slower", an.Name, err)
	}
	var st struct {
		Pieces peer.PieceList `json:"pieceList"`
		Have   peer.Have      `json:"have"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("%s's resume record: %v", an.Name, err)
	}
	var held int64
	for i := range st.Pieces.Pieces {
		if st.Have.Has(i) {
			held += min(st.Pieces.PieceSize, st.Pieces.Size-int64(i)*st.Pieces.PieceSize)
		}
	}
	if held == 0 || held == st.Pieces.Size {
		t.Fatalf("%s's resume record holds %d of %d bytes: nothing to resume from", an.Name, held, st.Pieces.Size)
	}
	return held
}

// rxBytes is what n's interface received so far.
func (an *anode) rxBytes(t *testing.T) int64 {
	t.Helper()
	out, err := an.Exec(t.Context(), "cat", "/sys/class/net/eth0/statistics/rx_bytes")
	if err != nil {
		t.Fatalf("%s: rx_bytes: %v: %s", an.Name, err, out)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// cluster runs `ferry status --cluster -o json` on n.
func (an *anode) cluster(t *testing.T) (agent.ClusterStatus, error) {
	t.Helper()
	var cs agent.ClusterStatus
	out, err := an.A.Ferry("status", "--cluster", "-o", "json")
	// The JSON, then (on a conflict) the error line: read the first value.
	if jerr := json.NewDecoder(strings.NewReader(out)).Decode(&cs); jerr != nil {
		t.Fatalf("%s: status --cluster -o json: %v (%v): %s", an.Name, jerr, err, out)
	}
	return cs, err
}

// waitFor polls cond every 100 ms until it holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(agentBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", agentBound, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// setLink takes n's link down or up (a cable pulled).
func (f *fleet) setLink(n *anode, up bool) {
	f.t.Helper()
	state := "down"
	if up {
		state = "up"
	}
	f.lab.ip("-n", n.NS, "link", "set", "eth0", state)
}

// bigBundle is the cached 256 MiB bundle and its digest.
func bigBundle(t *testing.T) (string, string) {
	t.Helper()
	tarPath, err := bigbundle.Make(bigSize, bigBlob, filepath.Join(os.TempDir(), "ferry-test-bundles"))
	if err != nil {
		t.Fatal(err)
	}
	return tarPath, sidecarDigest(t, tarPath)
}

func sidecarDigest(t testing.TB, tarPath string) string {
	t.Helper()
	b, err := os.ReadFile(strings.TrimSuffix(tarPath, ".tar") + ".sha256")
	if err != nil {
		t.Fatal(err)
	}
	return "sha256:" + strings.Fields(string(b))[0]
}

// checkBigTree checks n's extracted copy of the big bundle blob by blob.
func (an *anode) checkBigTree(t testing.TB) {
	t.Helper()
	dir := filepath.Join(an.Cfg.Paths.ExtractDir, "0.1.256-x86_64")
	if err := bigbundle.CheckTree(dir, bigSize, bigBlob); err != nil {
		t.Fatalf("%s: %v", an.Name, err)
	}
}

// realBundle makes, with `ferry bundle create`, a bundle of a small
// release of real images that CRI-O can pull.
func realBundle(t *testing.T, reg *fixture.Registry, version string, seed uint64, extra ...string) (string, *bundle.Metadata, string) {
	t.Helper()
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: version, PayloadImages: 3, Seed: seed})
	out := t.TempDir()
	cmd := exec.Command(ferryenv.Binary(t), append([]string{"bundle", "create", "--release", release,
		"--mirror", reg.Mirror(), "--cert-dir", reg.CertsDir, "--output", out}, extra...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("ferry bundle create: %v\n%s", err, b)
	}
	tarPath := filepath.Join(out, "upgrade-"+version+"-x86_64.tar")
	meta, err := bundle.InspectFile(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	return tarPath, meta, sidecarDigest(t, tarPath)
}

// checkPinned checks every image of meta is present and pinned in n's
// CRI-O, or that none is pinned (want false).
func (an *anode) checkPinned(t testing.TB, meta *bundle.Metadata, want bool) {
	t.Helper()
	cl := an.CRIO.Client(t)
	for _, ref := range bundle.PullRefs(meta.AllImages()) {
		present, pinned, err := cl.Status(t.Context(), ref)
		if err != nil {
			t.Fatalf("%s: image status %s: %v", an.Name, ref, err)
		}
		if want && (!present || !pinned) {
			t.Errorf("%s: %s present=%v pinned=%v", an.Name, ref, present, pinned)
		}
		if !want && (present || pinned) {
			t.Errorf("%s: %s present=%v pinned=%v, want neither", an.Name, ref, present, pinned)
		}
	}
}

// rss is the VmRSS of the process in pidFile, for the log.
func rss(pidFile string) string {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return "?"
	}
	st, err := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/status")
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

func hookLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(b), "\n"), "\n")
}

// TestAgents_StickOnOneNodeEveryNodeLoadsThenHookRunsOnceThere: the bundle
// is given to A only; B and C fetch it from the peers; every node loads it
// into its own CRI-O; the gate opens on all three; the on_ready hook runs
// once, on A only, and not again after A restarts; `ferry status
// --cluster` on B shows all three nodes.
func TestAgents_StickOnOneNodeEveryNodeLoadsThenHookRunsOnceThere(t *testing.T) {
	f := newFleet(t, fleetOptions{Nodes: 3, CRIO: true})
	reg := fixture.NewRegistry(t)
	tarPath, meta, digest := realBundle(t, reg, "4.13.7", 0)
	a, b, c := f.nodes[0], f.nodes[1], f.nodes[2]

	start := time.Now()
	a.load(t, tarPath)
	for _, n := range f.nodes {
		n.waitHolds(t, agent.PhaseClusterReady, digest)
	}
	t.Logf("stick on A → every node cluster-ready: %s", time.Since(start).Round(time.Millisecond))
	for _, n := range f.nodes {
		n.checkPinned(t, meta, true)
		t.Logf("%s: CRI-O RSS %s after the load", n.Name, rss(n.CRIO.PidFile))
	}

	// The hook: once, on A, with the release reference.
	hookDone := func() bool {
		s, err := a.A.Status(t.Context())
		if err != nil {
			return false
		}
		for _, r := range s.Bundles {
			if string(r.Digest) == digest && r.Hook != nil && !r.Hook.Finished.IsZero() {
				if r.Hook.Exit != 0 || r.Hook.Error != "" {
					t.Fatalf("the hook failed on A: exit %d: %s", r.Hook.Exit, r.Hook.Error)
				}
				return true
			}
		}
		return false
	}
	waitFor(t, "A's on_ready hook to finish", hookDone)
	if got := hookLines(t, a.Hook); len(got) != 1 || got[0] != meta.Release {
		t.Fatalf("A's hook output %q, want one line %q", got, meta.Release)
	}
	for _, n := range []*anode{b, c} {
		if got := hookLines(t, n.Hook); got != nil {
			t.Errorf("the hook ran on %s (only the stick's node may run it): %q", n.Name, got)
		}
	}

	// B's view of the cluster (polled every 2 s): every node, the gate open.
	waitFor(t, "B to see every node cluster-ready", func() bool {
		cs, err := b.cluster(t)
		if err != nil || cs.Decision.Verdict != agent.Ready || len(cs.Peers) != 2 {
			return false
		}
		for _, p := range cs.Peers {
			if p.Phase != string(agent.PhaseClusterReady) || string(p.Digest) != digest {
				return false
			}
		}
		return true
	})
	out, err := b.A.Ferry("status", "--cluster")
	if err != nil {
		t.Fatalf("B: ferry status --cluster: %v\n%s", err, out)
	}
	for _, n := range f.nodes {
		if !strings.Contains(out, n.Name) {
			t.Errorf("B's ferry status --cluster does not list %s:\n%s", n.Name, out)
		}
	}
	if !strings.Contains(out, "cluster: ready") {
		t.Errorf("B's ferry status --cluster does not say ready:\n%s", out)
	}
	t.Logf("B: ferry status --cluster:\n%s", out)

	// A restarted after the hook ran does not run it again.
	a.A.Stop()
	a.A.Restart()
	a.waitHolds(t, agent.PhaseClusterReady, digest)
	waitFor(t, "A's gate to be open again after its restart", func() bool {
		cs, err := a.cluster(t)
		return err == nil && cs.Decision.Verdict == agent.Ready
	})
	// Several peer polls (every 2 s) go by; the hook must stay at one run.
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if got := hookLines(t, a.Hook); len(got) != 1 {
			t.Fatalf("after A's restart the hook output is %q: it ran again", got)
		}
	}
}

// TestAgents_PeerKilledMidTransferOthersCompleteItResumes: B is killed (-9)
// while fetching; C still completes; B restarted resumes from what it held
// and completes.
func TestAgents_PeerKilledMidTransferOthersCompleteItResumes(t *testing.T) {
	tarPath, digest := bigBundle(t)
	f := newFleet(t, fleetOptions{Nodes: 3, Rate: bigRate})
	a, b, c := f.nodes[0], f.nodes[1], f.nodes[2]

	a.load(t, tarPath)
	b.A.Wait(agentBound, "B half through the fetch", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseFetching) && s.Progress != nil && s.Progress.Done >= bigSize/2
	})
	b.A.Kill()
	// The resume record says what B kept: it exists only while a fetch is
	// unfinished, so it also proves the kill came mid-transfer.
	held := b.resumeBytes(t, digest)
	rx := b.rxBytes(t)

	c.waitHolds(t, agent.PhaseExtracted, digest)
	c.checkBigTree(t)

	b.A.Restart()
	b.waitHolds(t, agent.PhaseExtracted, digest)
	b.checkBigTree(t)
	// What is left to fetch, plus headers and the peers' status polls.
	got, left := b.rxBytes(t)-rx, bigSize-held
	t.Logf("B kept %.0f%% of the bundle through the kill and received %.0f%% of it after its restart",
		100*float64(held)/bigSize, 100*float64(got)/bigSize)
	if float64(got) > 1.06*float64(left)+2<<20 {
		t.Fatalf("B received %d bytes after its restart for the %d it lacked: it did not resume from its record", got, left)
	}
	if !strings.Contains(b.A.Logs(), "peer fetch: resuming") {
		t.Errorf("B's log does not say it resumed:\n%s", tail(b.A.Logs(), 30))
	}
	a.waitHolds(t, agent.PhaseExtracted, digest)
}

// TestAgents_FlippingPeerDroppedFetchCompletesFromOthers: B holds the
// bundle too, but its peer port is a proxy that flips a byte of every tar
// body; C drops B and gets the bundle from A.
func TestAgents_FlippingPeerDroppedFetchCompletesFromOthers(t *testing.T) {
	tarPath, digest := bigBundle(t)
	f := newFleet(t, fleetOptions{Nodes: 3, Rate: bigRate, Listen: map[int]string{1: "127.0.0.1:8091"}})
	a, b, c := f.nodes[0], f.nodes[1], f.nodes[2]
	b.Start("flipproxy", peernode(t), "-node", "proxy", "-proxy", "127.0.0.1:8091", "-listen", b.Addr(peerPort))

	a.load(t, tarPath)
	b.loadOrFetching(t, tarPath, digest)
	c.waitHolds(t, agent.PhaseExtracted, digest)
	c.checkBigTree(t)
	want := "peer dropped for this bundle"
	dropped := ""
	for _, l := range strings.Split(c.A.Logs(), "\n") {
		if strings.Contains(l, want) {
			dropped += l + "\n"
		}
	}
	if !strings.Contains(dropped, "peer="+b.Addr(peerPort)) {
		t.Fatalf("C did not drop the flipping peer %s; its drops:\n%s", b.Addr(peerPort), dropped)
	}
	if strings.Contains(dropped, "peer="+a.Addr(peerPort)) {
		t.Fatalf("C dropped the honest peer A:\n%s", dropped)
	}
}

// TestAgents_SourceRestartedMidTransfer: A, the only node that held the
// bundle, is killed (-9) while B and C fetch, then restarted; B and C
// complete.
func TestAgents_SourceRestartedMidTransfer(t *testing.T) {
	tarPath, digest := bigBundle(t)
	f := newFleet(t, fleetOptions{Nodes: 3, Rate: bigRate})
	a, b, c := f.nodes[0], f.nodes[1], f.nodes[2]

	a.load(t, tarPath)
	b.A.Wait(agentBound, "B a third through the fetch", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseFetching) && s.Progress != nil && s.Progress.Done >= bigSize/3
	})
	a.A.Kill()
	for _, n := range []*anode{b, c} {
		if _, err := os.Stat(n.fetchState(digest)); err != nil {
			t.Fatalf("%s's fetch was not in progress when A was killed (%v): the transfer is too fast for this test", n.Name, err)
		}
	}
	a.A.Restart()
	for _, n := range f.nodes {
		n.waitHolds(t, agent.PhaseExtracted, digest)
	}
	for _, n := range []*anode{b, c} {
		n.checkBigTree(t)
	}
}

// TestAgents_TwoBundlesInOneClusterConflictNothingLoaded: A gets bundle X,
// B (cut off at that moment) bundle Y; C fetches X. Once B is back every
// node reports the conflict and none loads anything.
func TestAgents_TwoBundlesInOneClusterConflictNothingLoaded(t *testing.T) {
	f := newFleet(t, fleetOptions{Nodes: 3, CRIO: true})
	reg := fixture.NewRegistry(t)
	tarX, metaX, digestX := realBundle(t, reg, "4.13.7", 1)
	tarY, metaY, digestY := realBundle(t, reg, "4.13.8", 2)
	a, b, c := f.nodes[0], f.nodes[1], f.nodes[2]

	// B is cut off while the sticks go in, so it cannot fetch X first.
	f.setLink(b, false)
	a.load(t, tarX)
	b.load(t, tarY)
	a.waitHolds(t, agent.PhaseExtracted, digestX)
	b.waitHolds(t, agent.PhaseExtracted, digestY)
	c.waitHolds(t, agent.PhaseExtracted, digestX)
	f.setLink(b, true)

	for _, n := range f.nodes {
		n.A.Wait(agentBound, n.Name+" to report the conflict", func(s agent.Status) bool {
			return s.Reason == agent.ReasonPeerHoldsOther
		})
		if out, err := n.A.Ferry("status"); err == nil {
			t.Errorf("%s: ferry status must fail on a conflict:\n%s", n.Name, out)
		}
		if st, err := n.A.StatusCommand(t.Context()); err != nil || st.Reason != agent.ReasonPeerHoldsOther {
			t.Errorf("%s: ferry status -o json must say %s: %s, %v", n.Name, agent.ReasonPeerHoldsOther, st.Reason, err)
		}
		cs, err := n.cluster(t)
		if err == nil || cs.Decision.Verdict != agent.Conflict {
			t.Errorf("%s: ferry status --cluster must fail with a conflict: %v: %+v", n.Name, err, cs.Decision)
		}
		if len(cs.Decision.Digests) != 2 || cs.Decision.Digests[digest.Digest(digestX)] == nil || cs.Decision.Digests[digest.Digest(digestY)] == nil {
			t.Errorf("%s: the conflict does not name both bundles: %+v", n.Name, cs.Decision.Digests)
		}
	}
	// A few peer polls later still nothing has started loading anywhere.
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		for _, n := range f.nodes {
			s, err := n.A.Status(t.Context())
			if err != nil {
				continue
			}
			for _, p := range []agent.Phase{agent.PhaseLoading, agent.PhaseLoaded, agent.PhaseClusterReady} {
				if _, ok := s.Times[p]; ok {
					t.Fatalf("%s went %s despite the conflict: %s", n.Name, p, s.Line)
				}
			}
		}
	}
	for _, n := range f.nodes {
		n.checkPinned(t, metaX, false)
		n.checkPinned(t, metaY, false)
		if _, err := os.Stat(filepath.Join(n.Cfg.Paths.CRIOConfDir, crio.DropinName)); !os.IsNotExist(err) {
			t.Errorf("%s: ferry's CRI-O drop-in exists despite the conflict (%v)", n.Name, err)
		}
		if got := hookLines(t, n.Hook); got != nil {
			t.Errorf("the hook ran on %s despite the conflict: %q", n.Name, got)
		}
	}
}

// TestAgents_TokenMismatchRefused: B's token differs from the cluster's. A
// refuses B (401) and says so in its log; B never fetches and its cluster
// status says why; C, with the right token, gets the bundle.
func TestAgents_TokenMismatchRefused(t *testing.T) {
	f := newFleet(t, fleetOptions{Nodes: 3, Tokens: map[int]string{1: "not-the-cluster-token"}})
	a, b, c := f.nodes[0], f.nodes[1], f.nodes[2]
	tarPath, digest := smallBundle(t)

	a.load(t, tarPath)
	c.waitHolds(t, agent.PhaseExtracted, digest)
	waitFor(t, "A to log that it refused B", func() bool {
		for _, l := range strings.Split(a.A.Logs(), "\n") {
			if strings.Contains(l, "peer request refused") && strings.Contains(l, "remote="+b.IP+":") {
				return true
			}
		}
		return false
	})
	var cs agent.ClusterStatus
	waitFor(t, "B's cluster status to show A refusing it", func() bool {
		cs, _ = b.cluster(t)
		p, ok := cs.Peers[a.Addr(peerPort)]
		return ok && strings.Contains(p.Unreachable, "401") && strings.Contains(p.Unreachable, "token")
	})
	out, _ := b.A.Ferry("status", "--cluster")
	if !strings.Contains(out, "401") {
		t.Errorf("B's ferry status --cluster does not show the refusal:\n%s", out)
	}
	s, err := b.A.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if s.Phase != "idle" || len(s.Bundles) != 0 {
		t.Fatalf("B with the wrong token got somewhere: %s (%d records)", s.Line, len(s.Bundles))
	}
	if s.Healthy || s.Reason != agent.ReasonPeerRefusesNode {
		t.Errorf("B's own status does not say its token is refused: %s", s.Line)
	}
	if _, err := os.Stat(filepath.Join(b.Cfg.Paths.StateDir, "incoming")); !os.IsNotExist(err) {
		t.Fatalf("B with the wrong token started a fetch (%v)", err)
	}
}

// smallBundle is a small valid bundle (not loadable: its images are not
// real) for cases that only move bytes.
func smallBundle(t *testing.T) (string, string) {
	t.Helper()
	tarPath, err := bigbundle.Make(16<<20, 4<<20, filepath.Join(os.TempDir(), "ferry-test-bundles"))
	if err != nil {
		t.Fatal(err)
	}
	return tarPath, sidecarDigest(t, tarPath)
}

// TestAgents_NoTokenServesNothingUnlessOpen: closed by default — nodes
// with peers and no token serve no bundle (401), and say why; the same
// fleet with peer.open = true shares the bundle.
func TestAgents_NoTokenServesNothingUnlessOpen(t *testing.T) {
	noTokens := map[int]string{0: "", 1: ""}
	tarPath, digest := smallBundle(t)

	f := newFleet(t, fleetOptions{Nodes: 2, Tokens: noTokens})
	a, b := f.nodes[0], f.nodes[1]
	a.load(t, tarPath)
	a.waitHolds(t, agent.PhaseExtracted, digest)
	waitFor(t, "B to see A refuse it (401)", func() bool {
		cs, _ := b.cluster(t)
		p, ok := cs.Peers[a.Addr(peerPort)]
		return ok && strings.Contains(p.Unreachable, "401")
	})
	for _, n := range []*anode{a, b} {
		s, err := n.A.Status(t.Context())
		if err != nil || s.Healthy || s.Reason != agent.ReasonPeerTokenMissing {
			t.Errorf("%s: status does not say the token is missing: %+v, %v", n.Name, s, err)
		}
	}
	if s, _ := b.A.Status(t.Context()); s.Phase != "idle" {
		t.Fatalf("B got the bundle from a closed node: %s", s.Line)
	}

	open := newFleet(t, fleetOptions{Nodes: 2, Tokens: noTokens, Setup: func(_ *Node, cfg *agent.Config) { cfg.Peer.Open = true }})
	open.nodes[0].load(t, tarPath)
	open.nodes[1].waitHolds(t, agent.PhaseExtracted, digest)
}
