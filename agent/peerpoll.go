package agent

import (
	"context"
	"slices"
	"sort"
	"time"

	"github.com/ferry-edge/ferry/agent/machine"
	"github.com/ferry-edge/ferry/peer"
)

// peerSampler is a peer set that can be asked in part (peer.Node).
type peerSampler interface {
	Peers() []string
	StatusesOf(ctx context.Context, peers []string) map[string]peer.PeerStatus
	DiscoverFrom(ctx context.Context, peers []string) ([]peer.PeerOffer, error)
}

// peerSample is how many peers one round of the poll asks at most, but
// for a round that asks them all for the gate: at N ≤ peerSample+1 every
// peer is asked every round, as before.
const peerSample = 8

// peerPoller keeps the last answer of every peer and asks a few of them
// each round (docs/design.md, "Peers"): first the peers not yet where the
// gate needs them (never heard, or not holding or not loaded with this
// node's bundle), then the others in turn. The view it gives the loop
// holds every peer's last answer. The gate rests on the peers' own
// answers, never on older ones: when the answers kept say the gate may
// open, every peer is asked again in that same round, and that view,
// all of it fresh, is the one the loop gets. Offers are asked only of
// the peers asked whose status names a bundle.
type peerPoller struct {
	sample   int
	statuses map[string]peer.PeerStatus
	offers   map[string][]peer.PeerOffer
	turn     int // where the rotation over the peers at the goal goes on
	// fulls counts the rounds in a row that asked every peer for the
	// gate (fullWait backs off with it).
	fulls int
}

func newPeerPoller(sample int) *peerPoller {
	return &peerPoller{sample: sample, statuses: map[string]peer.PeerStatus{}, offers: map[string][]peer.PeerOffer{}}
}

// goal tells, of a peer's answer, whether it stands where this node's
// gate needs it (nil: this node waits on no gate).
type goal func(peer.PeerStatus) bool

// gateGoal is where the gate of a node standing at self needs every peer
// but those excluded: holding its bundle before it pins it (extracted),
// loaded with it (or done with it) before the upgrade may go on
// (loaded). nil in every other phase: no view opens a gate then.
func gateGoal(self peer.Status, excluded map[string]string) goal {
	own := self.Digest
	if own == "" {
		return nil
	}
	out := func(st peer.PeerStatus) bool {
		_, ok := excluded[st.Verified]
		if !ok && st.Verified == "" {
			_, ok = excluded[st.Node]
		}
		return ok
	}
	switch machine.Phase(self.Phase) {
	case machine.PhaseExtracted:
		return func(st peer.PeerStatus) bool { return out(st) || st.Err == nil && st.Digest == own }
	case machine.PhaseLoaded:
		return func(st peer.PeerStatus) bool {
			p := machine.Phase(st.Phase)
			return out(st) || st.Err == nil && st.Digest == own && (p.Loaded() || p == machine.PhaseUpgraded)
		}
	}
	return nil
}

// round asks this round's peers and returns the view, and whether it
// asked every peer because the gate may open.
func (pp *peerPoller) round(ctx context.Context, s peerSampler, g goal) (machine.View, bool) {
	list := s.Peers()
	for p := range pp.statuses {
		if !slices.Contains(list, p) {
			delete(pp.statuses, p)
			delete(pp.offers, p)
		}
	}
	full := g != nil && pp.atGoal(list, g)
	ask := list
	if !full {
		ask = pp.plan(list, g)
	}
	pp.ask(ctx, s, ask)
	if !full && g != nil && len(ask) < len(list) && pp.atGoal(list, g) {
		// The answers kept, some from earlier rounds, say the gate may
		// open: it opens only on every peer's answer of now.
		pp.ask(ctx, s, slices.DeleteFunc(slices.Clone(list), func(p string) bool { return slices.Contains(ask, p) }))
		full = true
	}
	if full && len(list) > pp.sample {
		pp.fulls++
	} else {
		pp.fulls = 0 // a round asks every peer anyway: no back-off
	}
	v := machine.View{Statuses: map[string]peer.PeerStatus{}}
	for _, p := range list {
		if st, ok := pp.statuses[p]; ok {
			v.Statuses[p] = st
		}
		v.Offers = append(v.Offers, pp.offers[p]...)
	}
	sort.Slice(v.Offers, func(i, j int) bool {
		return v.Offers[i].Peer < v.Offers[j].Peer || v.Offers[i].Peer == v.Offers[j].Peer && v.Offers[i].Digest < v.Offers[j].Digest
	})
	return v, full
}

// fullWait is the wait after a round that asked every peer for the gate:
// none after the first (the gate opens on it, as a rule), then doubling
// up to fullWaitMax while the gate stays shut on answers that all agree.
func (pp *peerPoller) fullWait() time.Duration {
	if pp.fulls <= 1 {
		return 0
	}
	return min(movingPoll<<min(pp.fulls-1, 10), fullWaitMax)
}

// fullWaitMax bounds fullWait: a node whose gate waits on something else
// than its peers (nodes without ferry) asks them all this often.
const fullWaitMax = time.Minute

// ask asks peers for their status, and those whose status names a bundle
// for their offers; the answers replace the ones kept.
func (pp *peerPoller) ask(ctx context.Context, s peerSampler, peers []string) {
	if len(peers) == 0 {
		return
	}
	st := s.StatusesOf(ctx, peers)
	var offering []string
	for _, p := range peers {
		a, ok := st[p]
		if !ok {
			continue
		}
		pp.statuses[p] = a
		delete(pp.offers, p)
		if a.Err == nil && a.Digest != "" {
			offering = append(offering, p)
		}
	}
	if len(offering) == 0 {
		return
	}
	offers, _ := s.DiscoverFrom(ctx, offering)
	for _, o := range offers {
		pp.offers[o.Peer] = append(pp.offers[o.Peer], o)
	}
}

// atGoal tells whether every peer's kept answer stands at g.
func (pp *peerPoller) atGoal(list []string, g goal) bool {
	for _, p := range list {
		st, ok := pp.statuses[p]
		if !ok || !g(st) {
			return false
		}
	}
	return true
}

// plan is this round's sample: the peers not at the goal (all of them
// when there is none) first, then the others, each group in turn from
// where the last round left it, at most pp.sample.
func (pp *peerPoller) plan(list []string, g goal) []string {
	if len(list) <= pp.sample {
		return list
	}
	var behind, ahead []string
	for _, p := range list {
		if st, ok := pp.statuses[p]; g == nil || !ok || !g(st) {
			behind = append(behind, p)
		} else {
			ahead = append(ahead, p)
		}
	}
	pp.turn++
	take := func(from []string, n int) []string {
		if n <= 0 || len(from) == 0 {
			return nil
		}
		if n >= len(from) {
			return from
		}
		out := make([]string, 0, n)
		for i := range n {
			out = append(out, from[(pp.turn*n+i)%len(from)])
		}
		return out
	}
	ask := take(behind, pp.sample)
	return append(ask, take(ahead, pp.sample-len(ask))...)
}
