package agent

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/ferry-edge/ferry/agent/machine"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/peer"
)

// sampledPeers is a peer set of n peers that answers whatever their
// status is set to, stamping each answer with the round that asked, and
// counts what it is asked.
type sampledPeers struct {
	mu       sync.Mutex
	list     []string
	status   map[string]peer.Status
	round    int
	asked    map[string]int // statuses asked of each peer
	perRound []int          // statuses asked in each round
	offers   int
}

func newSampledPeers(n int) *sampledPeers {
	s := &sampledPeers{status: map[string]peer.Status{}, asked: map[string]int{}}
	for i := range n {
		p := fmt.Sprintf("10.0.0.%d:8090", i+1)
		s.list = append(s.list, p)
		s.status[p] = peer.Status{Node: fmt.Sprintf("node-%d", i+1), Phase: string(machine.PhaseIdle)}
	}
	return s
}

func (s *sampledPeers) Peers() []string { return slices.Clone(s.list) }

func (s *sampledPeers) StatusesOf(_ context.Context, peers []string) map[string]peer.PeerStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]peer.PeerStatus{}
	for _, p := range peers {
		st := s.status[p]
		st.Progress = fmt.Sprint(s.round)
		out[p] = peer.PeerStatus{Status: st, Verified: st.Node}
		s.asked[p]++
		s.perRound[len(s.perRound)-1]++
	}
	return out
}

func (s *sampledPeers) DiscoverFrom(_ context.Context, peers []string) ([]peer.PeerOffer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []peer.PeerOffer
	for _, p := range peers {
		s.offers++
		if st := s.status[p]; st.Digest != "" {
			out = append(out, peer.PeerOffer{Peer: p, Offer: peer.Offer{Digest: st.Digest, Size: 1}})
		}
	}
	return out, nil
}

// next starts a round.
func (s *sampledPeers) next() {
	s.round++
	s.perRound = append(s.perRound, 0)
}

func (s *sampledPeers) set(p string, phase machine.Phase, d digest.Digest) {
	st := s.status[p]
	st.Phase, st.Digest = string(phase), d
	s.status[p] = st
}

// TestPeerPoller_AsksABoundedSampleEachRoundAndEveryPeerInTurn: 40 peers,
// idle: a round asks at most peerSample of them, and every peer is asked
// within ceil(40/peerSample) rounds; offers are asked only of peers whose
// status names a bundle.
func TestPeerPoller_AsksABoundedSampleEachRoundAndEveryPeerInTurn(t *testing.T) {
	s := newSampledPeers(40)
	s.set(s.list[7], machine.PhaseExtracted, "sha256:aa")
	pp := newPeerPoller(peerSample)
	rounds := (40 + peerSample - 1) / peerSample
	var v machine.View
	for range rounds {
		s.next()
		v, _ = pp.round(t.Context(), s, gateGoal(peer.Status{Phase: string(machine.PhaseIdle)}, nil))
	}
	for i, n := range s.perRound {
		if n > peerSample {
			t.Fatalf("round %d asked %d peers, want at most %d", i, n, peerSample)
		}
	}
	for _, p := range s.list {
		if s.asked[p] == 0 {
			t.Fatalf("%s not asked in %d rounds", p, rounds)
		}
	}
	if len(v.Statuses) != 40 {
		t.Fatalf("the view holds %d statuses, want every peer's 40", len(v.Statuses))
	}
	if len(v.Offers) != 1 || v.Offers[0].Peer != s.list[7] || s.offers != 1 {
		t.Fatalf("offers %+v, asked of %d peers; want the one peer naming a bundle, asked once", v.Offers, s.offers)
	}
}

// TestPeerPoller_TheGateOpensOnlyOnEveryPeersAnswerOfThatRound: this node
// is loaded with D; 39 of its 40 peers are too, the last still loading.
// Rounds ask the one behind first and a few others; the round in which
// the last one says loaded asks every peer again, and that view, the
// first in which every peer stands loaded with D, holds only answers of
// that round. The next rounds back off (fullWait) while the gate stays
// shut.
func TestPeerPoller_TheGateOpensOnlyOnEveryPeersAnswerOfThatRound(t *testing.T) {
	const d = digest.Digest("sha256:dd")
	s := newSampledPeers(40)
	for _, p := range s.list {
		s.set(p, machine.PhaseLoaded, d)
	}
	last := s.list[23]
	s.set(last, machine.PhaseLoading, d)
	self := peer.Status{Node: "self", Phase: string(machine.PhaseLoaded), Digest: d}
	g := gateGoal(self, nil)
	pp := newPeerPoller(peerSample)
	atGoal := func(v machine.View) bool {
		for _, p := range s.list {
			if st, ok := v.Statuses[p]; !ok || !g(st) {
				return false
			}
		}
		return true
	}
	for r := range 20 {
		if r == 12 {
			s.set(last, machine.PhaseLoaded, d)
		}
		s.next()
		v, full := pp.round(t.Context(), s, g)
		if r < 12 {
			if atGoal(v) || full {
				t.Fatalf("round %d: a view at the gate's goal (full %v) while %s still loads", r, full, last)
			}
			if r > 5 && s.perRound[r] > peerSample {
				t.Fatalf("round %d asked %d peers", r, s.perRound[r])
			}
			continue
		}
		if r == 12 {
			if !full || !atGoal(v) {
				t.Fatalf("round 12: full %v, at the goal %v; want every peer asked, all loaded", full, atGoal(v))
			}
			for p, st := range v.Statuses {
				if st.Progress != fmt.Sprint(s.round) {
					t.Fatalf("round 12's view holds %s's answer of round %s", p, st.Progress)
				}
			}
		}
	}
	if w := pp.fullWait(); w < fullWaitMax/2 {
		t.Fatalf("after 8 full rounds with the gate shut the wait is %s, want it backed off towards %s", w, fullWaitMax)
	}
}

// TestPeerPoller_ExcludedNodesAreNotWaitedFor: an excluded node that is
// idle does not keep the others from the goal.
func TestPeerPoller_ExcludedNodesAreNotWaitedFor(t *testing.T) {
	const d = digest.Digest("sha256:dd")
	s := newSampledPeers(12)
	for _, p := range s.list[1:] {
		s.set(p, machine.PhaseLoaded, d)
	}
	g := gateGoal(peer.Status{Phase: string(machine.PhaseLoaded), Digest: d}, map[string]string{"node-1": "listed in spec.excludedNodes"})
	pp := newPeerPoller(peerSample)
	for r := range 3 {
		s.next()
		if _, full := pp.round(t.Context(), s, g); full {
			return
		} else if r == 2 {
			t.Fatal("never a full round with every peer but the excluded one loaded")
		}
	}
}
