package machine

import (
	"errors"
	"slices"
	"strings"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
	"github.com/ferry-edge/ferry/peer/wire"
)

// The cluster gate: what every node's status says together. peer carries
// the statuses; the rules are here, in one place.

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
	Digest digest.Digest `json:"digest,omitempty"`
	// Message is one line for a technician (the verdict is the machine word).
	Message string `json:"message"`
	// Waiting lists nodes not loaded or not reachable (Waiting).
	Waiting []string `json:"waiting,omitempty"`
	// WithoutCRIO lists the waited-for nodes that have no CRI-O and so
	// never load (Waiting): the cluster cannot upgrade until they are
	// excluded.
	WithoutCRIO []string `json:"withoutCRIO,omitempty"`
	// Digests maps each bundle digest seen to the nodes holding it.
	Digests map[digest.Digest][]string `json:"digests,omitempty"`
}

// holds is the one rule for "this node holds a bundle": a digest, in a
// phase that holds the node (a refused, cleaned or upgraded bundle does
// not; a failed or conflicting one still does, so the others see it).
func holds(s wire.Status) bool {
	switch Phase(s.Phase) {
	case "", PhaseIdle, PhaseCleaned, PhaseRejected, PhaseUpgraded:
		return false
	}
	return s.Digest != ""
}

// refuses tells whether a node refused the bundle digest (its policy
// does not approve it, or it found it bad).
func refuses(s wire.Status, digest digest.Digest) bool {
	return Phase(s.Phase) == PhaseRejected && s.Digest == digest
}

// conflicting is the one conflict rule: two nodes that both hold a bundle,
// and not the same one.
func conflicting(a, b wire.Status) bool { return holds(a) && holds(b) && a.Digest != b.Digest }

func shortDigests(set map[digest.Digest]bool) string {
	var ds []string
	for d := range set {
		ds = append(ds, sha256digest.Short(d))
	}
	slices.Sort(ds)
	return strings.Join(ds, ", ")
}

// nodeName is how a technician knows a peer: its node name, else its
// address.
func nodeName(addr string, s wire.Status) string {
	if s.Node != "" {
		return s.Node
	}
	return addr
}

// peerNode is the node a peer is: the one its certificate names (node
// identities), else the one its status says.
func peerNode(s wire.PeerStatus) string {
	if s.Verified != "" {
		return s.Verified
	}
	return s.Node
}

// unheardWhy names a peer whose status the gate cannot take, and why.
// One whose status names another node than its certificate is not
// unreachable: it holds the gate until the administrator excludes it
// (docs/security.md, "A lying peer").
func unheardWhy(addr string, s wire.PeerStatus) string {
	if errors.Is(s.Err, wire.ErrNodeMismatch) {
		return addr + " (its certificate names node " + s.Verified + ", its status another node: refused; if " + s.Verified + " is not to take part, add it to the UpgradeBundle's spec.excludedNodes)"
	}
	return addr + " (unreachable)"
}

// label tells peers apart in the gate's lists: the node name and address.
func label(addr string, s wire.Status) string {
	if s.Node != "" && s.Node != addr {
		return s.Node + " (" + addr + ")"
	}
	return addr
}

// Decide applies the gate's rules to this node's status and its peers'
// (keyed by peer address), in this order:
//
//  1. Two nodes holding different bundles: Conflict, whatever else holds.
//  2. A peer that did not answer: Waiting (it might hold another bundle).
//  3. Every node (this one included) loaded, with the same digest: Ready.
//  4. Otherwise Waiting, naming the nodes not loaded yet; a node with no
//     CRI-O never loads, so then the reason says the cluster cannot
//     upgrade until it is excluded.
func Decide(self wire.Status, peers map[string]wire.PeerStatus) Decision {
	selfName := self.Node
	if selfName == "" {
		selfName = "this node"
	}
	d := Decision{Digests: map[digest.Digest][]string{}}
	all := map[string]wire.Status{selfName: self}
	var unreachable, refused []string
	for addr, ps := range peers {
		if errors.Is(ps.Err, wire.ErrNodeMismatch) {
			refused = append(refused, unheardWhy(addr, ps))
		}
		if ps.Err != nil {
			unreachable = append(unreachable, addr)
			continue
		}
		all[label(addr, ps.Status)] = ps.Status
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	slices.Sort(names)
	slices.Sort(unreachable)
	for _, n := range names {
		if s := all[n]; holds(s) {
			d.Digests[s.Digest] = append(d.Digests[s.Digest], n)
		}
	}
	if len(d.Digests) > 1 {
		d.Verdict = Conflict
		var parts []string
		for dg, ns := range d.Digests {
			parts = append(parts, sha256digest.Short(dg)+" on "+strings.Join(ns, ", "))
		}
		slices.Sort(parts)
		d.Message = "different bundles in one cluster: " + strings.Join(parts, "; ") + "; remove the wrong stick's bundle (ferry status on each node) and plug one bundle only"
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
		d.Message = "cannot reach " + strings.Join(unreachable, ", ") + ": check that ferry runs there and the peer port is open"
		if len(refused) > 0 {
			slices.Sort(refused)
			d.Message = "waiting for " + strings.Join(refused, ", ")
			if len(refused) < len(unreachable) {
				d.Message += "; cannot reach others of " + strings.Join(unreachable, ", ")
			}
		}
		return d
	}
	for _, n := range names {
		if s := all[n]; !Phase(s.Phase).Loaded() || !holds(s) {
			d.Waiting = append(d.Waiting, n)
		}
	}
	if len(d.Waiting) > 0 {
		d.Verdict = Waiting
		if none := withoutCRIO(all, d.Waiting); len(none) > 0 {
			d.WithoutCRIO = none
			d.Message = "the cluster cannot upgrade: " + strings.Join(none, ", ") + " has no CRI-O (crio.socket = \"\") and never loads the bundle; list it in the UpgradeBundle's spec.excludedNodes, or set crio.socket there"
			return d
		}
		var parts []string
		for _, n := range d.Waiting {
			p := all[n].Phase
			if p == "" {
				p = "no bundle"
			}
			parts = append(parts, n+": "+p)
		}
		d.Message = "not every node is loaded: " + strings.Join(parts, ", ")
		return d
	}
	d.Verdict = Ready
	d.Message = "all " + itoa(len(names)) + " nodes loaded " + sha256digest.Short(d.Digest)
	return d
}

// withoutCRIO names the waiting nodes that will never load: no CRI-O.
func withoutCRIO(all map[string]wire.Status, waiting []string) []string {
	var none []string
	for _, n := range waiting {
		if all[n].LoadsNothing {
			none = append(none, n)
		}
	}
	return none
}
