package machine

import (
	"time"

	"github.com/ferry-edge/ferry/peer/wire"
)

// view is one poll of the peers.
type View struct {
	Offers   []wire.PeerOffer
	Statuses map[string]wire.PeerStatus
	At       time.Time
}

// standing is where this node stands for the gate and its peers, decided
// from the machine's state: the phase its status shows, and its digest
// while a bundle holds it (a held one in conflict too, so that the peers
// see the conflict), or while it shows a bundle it refused, so that the
// peers do not pin one that this node will never hold.
func (m *Machine) standing() wire.Status {
	st := wire.Status{Node: m.cfg.NodeName, Phase: string(PhaseIdle)}
	switch {
	case m.Active != nil:
		st.Phase, st.Digest, st.Source = string(m.Active.Phase), m.Active.Digest, m.Active.Plugged
		st.LoadsNothing = !m.hasLoader
	case m.LastBad != nil:
		st.Phase = string(m.LastBad.Phase)
		if m.LastBad.Phase == PhaseRejected {
			st.Digest = m.LastBad.Digest
		}
	case m.done != nil:
		st.Phase = string(m.done.Phase)
		if m.done.Retained {
			// The release it runs and keeps: a node that joins later
			// fetches it (fresh, runsAlready).
			st.Digest = m.done.Digest
		}
	}
	return st
}

// StatusForPeers is what this node tells its peers: its standing, in the
// words of s, its status as published.
func (m *Machine) StatusForPeers(s Status) wire.Status {
	st := m.standing()
	st.Version, st.Release, st.Error, st.Progress = s.Version, s.Release, SanitizeReason(s.Error), progressText(s)
	return st
}

// ClusterStatus is `ferry status --cluster`.
type ClusterStatus struct {
	Self     wire.Status            `json:"self"`
	Peers    map[string]ClusterNode `json:"peers"`
	Decision Decision               `json:"decision"`
}

// ClusterNode is one peer as last polled.
type ClusterNode struct {
	wire.Status
	Unreachable string `json:"unreachable,omitempty"`
}

// ClusterView is every node's phase as last polled, this one's (self)
// included.
func (m *Machine) ClusterView(self wire.Status) ClusterStatus {
	cs := ClusterStatus{Self: self, Peers: map[string]ClusterNode{}, Decision: Decide(self, m.gatedStatuses())}
	if why := m.nodesWithoutFerry(); cs.Decision.Verdict == Ready && why != (Condition{}) {
		// Every node that answers is loaded; the gate waits for those
		// without ferry, which no peer status shows.
		cs.Decision.Verdict, cs.Decision.Message = Waiting, why.Message
	}
	for addr, st := range m.view.Statuses {
		n := ClusterNode{Status: st.Status}
		if st.Err != nil {
			n.Unreachable = st.Err.Error()
		}
		cs.Peers[addr] = n
	}
	return cs
}
