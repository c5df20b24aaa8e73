package machine

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
	"github.com/ferry-edge/ferry/peer/wire"
)

func TestDecide(t *testing.T) {
	const d1, d2 = "sha256:1111111111111111111111111111111111111111111111111111111111111111", "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	st := func(node, phase string, digest digest.Digest) wire.Status {
		return wire.Status{Node: node, Phase: phase, Digest: digest}
	}
	ok := func(s wire.Status) wire.PeerStatus { return wire.PeerStatus{Status: s} }
	down := wire.PeerStatus{Err: errors.New("connection refused")}
	tests := []struct {
		name    string
		self    wire.Status
		peers   map[string]wire.PeerStatus
		want    Verdict
		digest  string
		waiting []string
	}{
		{name: "every node loaded with one digest is ready", self: st("a", "loaded", d1),
			peers: map[string]wire.PeerStatus{"b:1": ok(st("b", "loaded", d1)), "c:1": ok(st("c", "cluster-ready", d1))}, want: Ready, digest: d1},
		{name: "a single node with no peers is ready once loaded", self: st("a", "loaded", d1), want: Ready, digest: d1},
		{name: "a node still loading is waited for", self: st("a", "loaded", d1),
			peers: map[string]wire.PeerStatus{"b:1": ok(st("b", "loading", d1))}, want: Waiting, digest: d1, waiting: []string{"b (b:1)"}},
		{name: "this node not loaded is waited for", self: st("a", "fetching", d1),
			peers: map[string]wire.PeerStatus{"b:1": ok(st("b", "loaded", d1))}, want: Waiting, waiting: []string{"a"}},
		{name: "a node with no bundle yet is waited for", self: st("a", "loaded", d1),
			peers: map[string]wire.PeerStatus{"b:1": ok(st("b", "idle", ""))}, want: Waiting, waiting: []string{"b (b:1)"}},
		{name: "an unreachable peer is not ready", self: st("a", "loaded", d1),
			peers: map[string]wire.PeerStatus{"b:1": ok(st("b", "loaded", d1)), "c:1": down}, want: Waiting, waiting: []string{"c:1"}},
		{name: "two digests are a conflict", self: st("a", "loaded", d1),
			peers: map[string]wire.PeerStatus{"b:1": ok(st("b", "loaded", d2))}, want: Conflict},
		{name: "two digests are a conflict before anything loads", self: st("a", "extracted", d1),
			peers: map[string]wire.PeerStatus{"b:1": ok(st("b", "detected", d2))}, want: Conflict},
		{name: "a conflict wins over an unreachable peer", self: st("a", "loaded", d1),
			peers: map[string]wire.PeerStatus{"b:1": ok(st("b", "failed", d2)), "c:1": down}, want: Conflict},
		{name: "an old cleaned-up bundle is no conflict", self: st("a", "loaded", d1),
			peers: map[string]wire.PeerStatus{"b:1": ok(st("b", "cleaned", d2))}, want: Waiting, waiting: []string{"b (b:1)"}},
		{name: "a rejected bundle is no conflict", self: st("a", "loaded", d1),
			peers: map[string]wire.PeerStatus{"b:1": ok(st("b", "rejected", d2))}, want: Waiting, waiting: []string{"b (b:1)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.self, tc.peers)
			if d.Verdict != tc.want {
				t.Fatalf("verdict %s (%s), want %s", d.Verdict, d.Message, tc.want)
			}
			if tc.digest != "" && string(d.Digest) != tc.digest {
				t.Fatalf("digest %s, want %s", d.Digest, tc.digest)
			}
			if tc.waiting != nil && !slices.Equal(d.Waiting, tc.waiting) {
				t.Fatalf("waiting %v, want %v", d.Waiting, tc.waiting)
			}
			if d.Message == "" {
				t.Fatal("no reason given")
			}
			if tc.want == Conflict && (!strings.Contains(d.Message, sha256digest.Short(d1)) || !strings.Contains(d.Message, sha256digest.Short(d2)) || len(d.Digests) != 2) {
				t.Fatalf("conflict reason %q / digests %v does not name both bundles", d.Message, d.Digests)
			}
		})
	}
}

// A peer whose status names another node than its certificate (a node
// lying about who it is) holds the gate, named for what it is and with
// the administrator's lever, not as unreachable; excluded by the node
// its certificate names, it holds nothing.
func TestGate_ALyingPeerWaitsForTheAdministratorThenIsLeftOut(t *testing.T) {
	const d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	liar := wire.PeerStatus{Verified: "node-x", Err: fmt.Errorf("peer 10.0.0.9:8090: %w: it says %q, its certificate names %q", wire.ErrNodeMismatch, "node-a", "node-x")}
	peers := map[string]wire.PeerStatus{"10.0.0.2:8090": {Status: wire.Status{Node: "b", Phase: "loaded", Digest: d1}}, "10.0.0.9:8090": liar}
	d := Decide(wire.Status{Node: "a", Phase: "loaded", Digest: d1}, peers)
	if d.Verdict != Waiting || !strings.Contains(d.Message, "certificate names node node-x") || !strings.Contains(d.Message, "spec.excludedNodes") || strings.Contains(d.Message, "cannot reach") {
		t.Fatalf("the gate on a lying peer: %s: %q, want waiting, naming node-x and spec.excludedNodes", d.Verdict, d.Message)
	}

	m := machineIn(t, PhaseIdle)
	m.peersOn, m.peers = true, []string{"10.0.0.2:8090", "10.0.0.9:8090"}
	m.view = View{Statuses: peers, At: m.Now()}
	r := &Record{Digest: d1}
	if why := m.peersDisagree(r); why.Reason != ReasonPeersNotHolding || !strings.Contains(why.Message, "certificate names node node-x") {
		t.Fatalf("before loading, a lying peer: %+v, want waiting for it, named", why)
	}
	m.Excluded = map[string]string{"node-x": "listed in spec.excludedNodes"}
	if why := m.peersDisagree(r); why != (Condition{}) {
		t.Fatalf("the lying peer excluded by the node its certificate names: %+v, want nothing to wait for", why)
	}
	if g := m.gatedStatuses(); len(g) != 1 {
		t.Fatalf("the gate weighs %v, want only b", g)
	}
}

// TestDecide_ANodeWithoutCRIOSaysTheClusterCannotUpgrade: a node with no
// CRI-O (crio.socket = "") stays extracted for good; the gate says the
// cluster cannot upgrade and how to go on, rather than waiting on it as
// if it were still loading.
func TestDecide_ANodeWithoutCRIOSaysTheClusterCannotUpgrade(t *testing.T) {
	const d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	self := wire.Status{Node: "a", Phase: "loaded", Digest: d1}
	none := wire.Status{Node: "b", Phase: "extracted", Digest: d1, LoadsNothing: true}
	d := Decide(self, map[string]wire.PeerStatus{"b:1": {Status: none}})
	if d.Verdict != Waiting || !slices.Equal(d.Waiting, []string{"b (b:1)"}) {
		t.Fatalf("verdict %s, waiting %v", d.Verdict, d.Waiting)
	}
	for _, want := range []string{"the cluster cannot upgrade", "b (b:1) has no CRI-O", "spec.excludedNodes"} {
		if !strings.Contains(d.Message, want) {
			t.Errorf("reason %q does not say %q", d.Message, want)
		}
	}
	// The same node still loading (it has CRI-O) is only waited for.
	none.LoadsNothing = false
	if d := Decide(self, map[string]wire.PeerStatus{"b:1": {Status: none}}); strings.Contains(d.Message, "cannot upgrade") {
		t.Errorf("a node with CRI-O: %q", d.Message)
	}
}

// TestHostOf_SplitsAsTheNetPackageDoes: the host the gate matches an
// excluded node's address by is net.SplitHostPort's, or the address whole.
func TestHostOf_SplitsAsTheNetPackageDoes(t *testing.T) {
	for _, addr := range []string{"10.0.0.1:8090", "node-a:8090", "[fd00::1]:8090", "node-a", "fd00::1", "[fd00::1]", "a:b:c", "[a]b:1", "host:", ":8090", "[a:1", "a]:1", "[[a]]:1", "a:[1]"} {
		want := addr
		if h, _, err := net.SplitHostPort(addr); err == nil {
			want = h
		}
		if got := hostOf(addr); got != want {
			t.Errorf("hostOf(%q) = %q, want %q", addr, got, want)
		}
	}
}
