package agent

import (
	"github.com/ferry-edge/ferry/agent/machine"
	"maps"
	"reflect"
	"sync"

	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/pull/pullspec"
)

// Status reports the node's state, as of the loop's last step.
func (a *Agent) Status() machine.Status { return a.snap.Load().status }

// snapshot is what the loop publishes after each step, read without locks.
type snapshot struct {
	status  machine.Status
	peer    peer.Status
	cluster machine.ClusterStatus
	// readNode: the follower reads the MCO's state of this node.
	readNode bool
	// bundle is this node's report on the active bundle's UpgradeBundle.
	bundle *machine.BundleReport
	// excluded are the nodes the gate leaves out (spec.excludedNodes),
	// for the peers' poll (pollPeers).
	excluded map[string]string
}

// publish makes the machine's state visible to readers.
func (a *Agent) publish() {
	s := a.m.NodeStatus()
	ps := a.m.StatusForPeers(s)
	a.holdingBack(&s)
	a.pulling(&s)
	snap := &snapshot{status: s, peer: ps, cluster: a.m.ClusterView(ps), readNode: a.m.ReadsNode(), bundle: a.m.ResourceReport(s), excluded: maps.Clone(a.m.Excluded)}
	if snap.bundle == nil {
		snap.bundle = pullReport(s)
	}
	snap.bundle = withPullRecord(snap.bundle, s.Pull)
	old := a.snap.Swap(snap)
	if a.deps.Published != nil {
		a.deps.Published(s)
	}
	if old == nil || !reflect.DeepEqual(old.followKey(), snap.followKey()) {
		a.followed.fire()
	}
	a.wantAnnotations(s)
}

// followKey is what the API's followers act on: the report on the
// bundle (its status line aside, which moves with progress), whether
// the Node is read, and the release and phase the upgrade is followed by.
func (s *snapshot) followKey() any {
	type key struct {
		bundle         machine.BundleReport
		readNode       bool
		release, phase string
	}
	k := key{readNode: s.readNode, release: s.status.Release, phase: s.status.Phase}
	if s.bundle != nil {
		k.bundle = *s.bundle
		k.bundle.Line = ""
	}
	return k
}

// signal wakes whoever waits on it: the channel c returns is closed at
// the next fire.
type signal struct {
	mu sync.Mutex
	ch chan struct{}
}

func (s *signal) c() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *signal) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}

// holdingBack adds to s why the bulk work is slowed, in the phases that
// have bulk work.
func (a *Agent) holdingBack(s *machine.Status) {
	if a.deps.Pacer == nil {
		return
	}
	switch machine.Phase(s.Phase) {
	case machine.PhaseDetected, machine.PhaseFetching, machine.PhaseLoading:
	default:
		return
	}
	if hb := a.deps.Pacer.HoldingBack(); hb != "" {
		s.HoldingBack = hb
		s.Line += " — holding back: " + hb
	}
}

// pulling shows the registry pull under way: the line is the pull's
// while no bundle is in flight, else the pull's follows the bundle's.
func (a *Agent) pulling(s *machine.Status) {
	if a.deps.Puller == nil {
		return
	}
	p := a.deps.Puller.Status()
	if p == nil {
		return
	}
	s.Pull = p
	if p.State == pullspec.StateDone {
		return
	}
	switch machine.Phase(s.Phase) {
	case machine.PhaseIdle, machine.PhaseUpgraded, machine.PhaseCleaned, machine.PhaseRejected, machine.PhaseFailed:
		s.Line = p.Line()
		s.Reason = machine.PullReasons[p.State]
	default:
		s.Line += " — " + p.Line()
	}
	s.Line = machine.SanitizeText(s.Line, machine.MaxLine)
}

// pullChanged reports whether the pull's status differs from the
// published one's (the loop then publishes again).
func (a *Agent) pullChanged() bool {
	if a.deps.Puller == nil {
		return false
	}
	p, old := a.deps.Puller.Status(), a.snap.Load().status.Pull
	return !reflect.DeepEqual(p, old)
}

// pacingChanged reports whether the pacer's reason differs from the
// published status's (the loop then publishes again).
func (a *Agent) pacingChanged() bool {
	if a.deps.Pacer == nil {
		return false
	}
	s := a.snap.Load().status
	switch machine.Phase(s.Phase) {
	case machine.PhaseDetected, machine.PhaseFetching, machine.PhaseLoading:
		return a.deps.Pacer.HoldingBack() != s.HoldingBack
	}
	return false
}
