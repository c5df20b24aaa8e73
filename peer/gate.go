package peer

import (
	"fmt"
	"sort"
	"strings"
)

// Phases the gate reads in Status.Phase. The agent owns the full list; the
// gate only needs to know which mean "loaded" and which hold no bundle.
const (
	PhaseLoaded       = "loaded"
	PhaseClusterReady = "cluster-ready"
	PhaseCleaned      = "cleaned"
	PhaseRejected     = "rejected"
	PhaseIdle         = "idle"
)

// PeerStatus is one peer's answer to /v1/status, or why there is none.
type PeerStatus struct {
	Status
	Err error
}

// Verdict is the gate's answer.
type Verdict string

const (
	// Ready: every node reports loaded with the same digest.
	Ready Verdict = "ready"
	// Waiting: not every node is loaded yet, or some cannot be reached.
	Waiting Verdict = "waiting"
	// Conflict: nodes hold different bundles; none may load.
	Conflict Verdict = "conflict"
)

// Decision is the gate's verdict and why.
type Decision struct {
	Verdict Verdict `json:"verdict"`
	// Digest is the bundle every node agrees on (Ready, or Waiting with
	// one digest seen).
	Digest string `json:"digest,omitempty"`
	// Reason is one line for a technician.
	Reason string `json:"reason"`
	// Waiting lists nodes not loaded or not reachable (Waiting).
	Waiting []string `json:"waiting,omitempty"`
	// Digests maps each bundle digest seen to the nodes holding it.
	Digests map[string][]string `json:"digests,omitempty"`
}

func holdsBundle(s Status) bool {
	switch s.Phase {
	case "", PhaseCleaned, PhaseRejected, PhaseIdle:
		return false
	}
	return s.Digest != ""
}

func loaded(s Status) bool { return s.Phase == PhaseLoaded || s.Phase == PhaseClusterReady }

// Decide applies the gate's rules to this node's status and its peers'
// (keyed by peer address), in this order:
//
//  1. Two nodes holding different bundle digests (nodes that are idle,
//     cleaned up or rejected hold none): Conflict, whatever else holds.
//  2. A peer that did not answer: Waiting (it might hold another bundle).
//  3. Every node (this one included) loaded or cluster-ready, with the
//     same digest: Ready.
//  4. Otherwise Waiting, naming the nodes not loaded yet.
func Decide(self Status, peers map[string]PeerStatus) Decision {
	name := func(addr string, s Status) string {
		if s.Node != "" && s.Node != addr {
			return s.Node + " (" + addr + ")"
		}
		return addr
	}
	selfName := self.Node
	if selfName == "" {
		selfName = "this node"
	}
	d := Decision{Digests: map[string][]string{}}
	all := map[string]Status{selfName: self}
	var unreachable []string
	for addr, ps := range peers {
		if ps.Err != nil {
			unreachable = append(unreachable, addr)
			continue
		}
		all[name(addr, ps.Status)] = ps.Status
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	sort.Strings(unreachable)
	for _, n := range names {
		if s := all[n]; holdsBundle(s) {
			d.Digests[s.Digest] = append(d.Digests[s.Digest], n)
		}
	}
	if len(d.Digests) > 1 {
		d.Verdict = Conflict
		var parts []string
		for dg, ns := range d.Digests {
			parts = append(parts, fmt.Sprintf("%s on %s", short(dg), strings.Join(ns, ", ")))
		}
		sort.Strings(parts)
		d.Reason = "different bundles in one cluster: " + strings.Join(parts, "; ") + "; remove the wrong stick's bundle (ferry status on each node) and plug one bundle only"
		return d
	}
	for dg := range d.Digests {
		d.Digest = dg
	}
	if len(d.Digests) == 0 {
		d.Digests = nil
	}
	if len(unreachable) > 0 {
		d.Verdict = Waiting
		d.Waiting = unreachable
		d.Reason = "cannot reach " + strings.Join(unreachable, ", ") + ": check that ferry runs there and the peer port is open"
		return d
	}
	for _, n := range names {
		if s := all[n]; !loaded(s) || s.Digest == "" {
			d.Waiting = append(d.Waiting, n)
		}
	}
	if len(d.Waiting) > 0 {
		d.Verdict = Waiting
		var parts []string
		for _, n := range d.Waiting {
			p := all[n].Phase
			if p == "" {
				p = "no bundle"
			}
			parts = append(parts, n+": "+p)
		}
		d.Reason = "not every node is loaded: " + strings.Join(parts, ", ")
		return d
	}
	d.Verdict = Ready
	d.Reason = fmt.Sprintf("all %d nodes loaded %s", len(names), short(d.Digest))
	return d
}

func short(d string) string {
	if len(d) > 19 {
		return d[:19] + "…"
	}
	return d
}
