package machine

import (
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
	"github.com/ferry-edge/ferry/peer/wire"
)

// Transitions of the peers' view (evView): fetching an offer, refusing
// one, a conflict between nodes, and the gate that moves a loaded node to
// cluster-ready.

// peersSeen acts on a fresh view of the peers.
func (m *Machine) peersSeen(v View) []Effect {
	old := m.view
	m.view = v
	for _, p := range m.peers {
		now, was := v.Statuses[p].Err, old.Statuses[p].Err
		if now != nil && (was == nil || was.Error() != now.Error()) {
			m.log.Warn("a peer cannot be asked", "peer", p, "err", now)
		} else if now == nil && was != nil {
			m.log.Info("a peer answers again", "peer", p)
		}
	}
	r := m.Active
	switch {
	case r == nil && m.Job == nil:
		return m.MaybeFetch(v)
	case r == nil:
	case r.Phase == PhaseExtracted && m.Job == nil:
		return m.next()
	case r.Phase.Loaded():
		return m.gate(r)
	}
	return nil
}

// runsAlready reports whether every other node (at least one) is done
// with the upgrade to r and keeps it as the release it runs: this node
// joined the cluster after that upgrade, or came back empty.
func (m *Machine) runsAlready(r *Record) bool {
	n := 0
	for _, st := range m.gatedStatuses() {
		if st.Err != nil || Phase(st.Phase) != PhaseUpgraded || st.Digest != r.Digest {
			return false
		}
		n++
	}
	return n > 0
}

// fresh are the offers this node may take: not a bundle it is done with
// (upgraded or cleaned up here), and not the release the peers run and
// keep (an upgraded peer's Digest) while another bundle is offered too.
// A peer whose status names another node than its certificate offers
// nothing here: a party that lies about who it is makes no conflict and
// no refusal on this node (issue 41); nor does a node the administrator
// excluded, which takes no part.
func (m *Machine) fresh(v View) []wire.PeerOffer {
	doneWith := map[digest.Digest]bool{}
	for _, r := range m.Records {
		if r.Phase == PhaseUpgraded || r.Phase == PhaseCleaned {
			doneWith[r.Digest] = true
		}
	}
	running := map[digest.Digest]bool{}
	for _, st := range v.Statuses {
		if st.Err == nil && Phase(st.Phase) == PhaseUpgraded && st.Digest != "" {
			running[st.Digest] = true
		}
	}
	var out, kept []wire.PeerOffer
	for _, o := range v.Offers {
		switch {
		case errors.Is(v.Statuses[o.Peer].Err, wire.ErrNodeMismatch), m.gateExcluded(o.Peer, peerNode(v.Statuses[o.Peer])):
		case doneWith[o.Digest]:
		case running[o.Digest]:
			kept = append(kept, o)
		default:
			out = append(out, o)
		}
	}
	if len(out) == 0 {
		return kept
	}
	return out
}

// maybeFetch starts fetching the bundle the peers offer, after the same
// checks a stick gets.
func (m *Machine) MaybeFetch(v View) []Effect {
	o, conflict := oneOffer(m.fresh(v))
	if conflict != "" {
		return m.reportConflict(conflict)
	}
	if o == nil {
		return nil
	}
	md, err := m.parseMeta(o.Metadata)
	for _, old := range m.Records {
		if old.Digest != o.Digest {
			continue
		}
		switch old.Phase {
		case PhaseCleaned, PhaseUpgraded:
			return nil // done with before: not again
		case PhaseRejected:
			// Refused for its bytes (it was fetched), or still by this
			// node's policy: not again. Refused by a policy since changed
			// to approve it (a restart with the engineer's key): fetch it.
			if old.Dir != "" || err != nil {
				return nil
			}
			if _, perr := m.approve(m.polFor(md), md, o.Digest, o.Signature); perr != nil {
				return nil
			}
		}
	}
	name := "bundle from " + o.Peer
	if md != nil {
		name = md.Name() + ".tar"
	}
	r := &Record{Digest: o.Digest, Name: name, Metadata: md, Origin: OriginPeer, Source: o.Peer, TarSize: o.Size}
	if md != nil {
		r.ID = m.newID(md.DirName())
	} else {
		r.ID = m.newID("peer")
	}
	if err == nil {
		r.Approval, err = m.approve(m.polFor(md), md, o.Digest, o.Signature)
		r.Signature = o.Signature
	}
	if err != nil {
		return m.refuseOffer(r, err)
	}
	r.Dir = join(m.cfg.ExtractDir, md.DirName())
	m.Active = r
	effs := m.Move(r, PhaseFetching, Condition{}, Progress{Unit: "bytes"})
	m.log.Info("fetching the bundle from the peers", "phase", string(PhaseFetching), "bundle", r.Name, "digest", r.Digest)
	return append(effs, m.fetch(r)...)
}

// Refused peer offers are kept, short, for a while: enough to say why
// and not to refuse the same offer at every poll, never enough that
// peers offering bundle after bundle grow the state or the status.
const (
	MaxRefusedOffers = 8
	RefusedOfferTTL  = 24 * time.Hour
	MaxRefusedReason = 300 // bytes
)

// refuseOffer records an offer this node's policy refuses: no metadata,
// no signature, a bounded reason; the oldest beyond maxRefusedOffers and
// any older than refusedOfferTTL are forgotten.
func (m *Machine) refuseOffer(r *Record, err error) []Effect {
	r.Metadata, r.Signature = nil, nil
	reason := err.Error()
	if len(reason) > MaxRefusedReason {
		reason = strings.ToValidUTF8(reason[:MaxRefusedReason], "") + "…"
	}
	effs := m.rejectAs(r, refusalReason(err), reason)
	return append(effs, m.PruneRefused()...)
}

// isRefusedOffer reports whether r is an offer refused before any byte
// of it was fetched.
func isRefusedOffer(r *Record) bool {
	return r.Origin == OriginPeer && r.Phase == PhaseRejected && r.Dir == ""
}

// pruneRefused forgets refused offers past their time or their number.
func (m *Machine) PruneRefused() []Effect {
	var refused []*Record
	for _, r := range m.Records {
		if isRefusedOffer(r) {
			refused = append(refused, r)
		}
	}
	slices.SortFunc(refused, func(a, b *Record) int { // newest first
		return b.Times[PhaseRejected].Compare(a.Times[PhaseRejected])
	})
	var effs []Effect
	for i, r := range refused {
		if i < MaxRefusedOffers && m.Now().Sub(r.Times[PhaseRejected]) < RefusedOfferTTL {
			continue
		}
		delete(m.Records, r.ID)
		if m.LastBad == r {
			m.LastBad = nil
		}
		effs = append(effs, EffForget{r.ID})
	}
	return effs
}

// fetch starts fetching r from the peers, extracting it as it arrives
// (cut-through) under the policy its extraction gets: approved by this
// node's own keys, the signature is verified over the bytes; approved by
// digest, that digest. A tree left by an interrupted run is not trusted.
func (m *Machine) fetch(r *Record) []Effect {
	pol := m.extractPolicy(r)
	return append(append(m.keepsDir(r.Dir), EffRemove{r.Dir}), m.startJob(EffStartJob{Kind: JobFetch, Rec: r, Policy: pol}, "")...)
}

// oneOffer is the one bundle the peers offer, or why there is a conflict.
func oneOffer(offers []wire.PeerOffer) (*wire.PeerOffer, string) {
	var one *wire.PeerOffer
	digests := map[digest.Digest]bool{}
	for i := range offers {
		if !digests[offers[i].Digest] {
			digests[offers[i].Digest] = true
			one = &offers[i]
		}
	}
	if len(digests) > 1 {
		return nil, "the peers hold different bundles (" + shortDigests(digests) + "): two sticks were plugged; remove one and run 'ferry cleanup' on the nodes that hold it"
	}
	return one, ""
}

// gate moves a loaded node to cluster-ready once every node is loaded with
// the same bundle, and runs the hook once where the stick was plugged.
func (m *Machine) gate(r *Record) []Effect {
	d := Decision{Verdict: Ready, Digest: r.Digest}
	if m.hasPeers() {
		for _, p := range m.peers {
			if _, heard := m.view.Statuses[p]; !heard && !m.gateExcluded(p, "") {
				return nil
			}
		}
		if r.Phase == PhaseLoaded && m.runsAlready(r) {
			m.log.Info("every other node runs this release already, upgraded: this node joins it", "bundle", r.Name, "digest", r.Digest)
			return m.upgraded(r)
		}
		d = Decide(m.standing(), m.gatedStatuses())
	}
	var effs []Effect
	switch d.Verdict {
	case Ready:
		if why := m.nodesWithoutFerry(); why != (Condition{}) && r.Upgrade == nil {
			if r.Condition == why {
				return nil
			}
			m.log.Warn("not every node runs ferry: the upgrade waits", "phase", string(r.Phase), "bundle", r.Name, "reason", why.Message)
			return m.Move(r, r.Phase, why, r.Progress)
		}
		switch {
		case r.Phase == PhaseLoaded:
			effs = m.Move(r, PhaseClusterReady, Condition{}, r.Progress)
			m.log.Info("every node holds the bundle, loaded and pinned: the upgrade may proceed", "phase", string(PhaseClusterReady), "bundle", r.Name, "digest", r.Digest)
		case r.Condition.Reason == ReasonNodesWithoutFerry:
			effs = m.Move(r, r.Phase, Condition{}, r.Progress) // ferry runs there now, or they are excluded
		case r.Condition.Reason == ReasonNodesWithoutCRIO:
			effs = m.Move(r, r.Phase, Condition{}, r.Progress)
		}
		if r.Plugged && m.schedule() == "Automatic" && m.policyRead() {
			effs = append(effs, m.proceed(r, false)...)
		}
	case Waiting:
		// A node with no CRI-O never loads: say so on the loaded node,
		// rather than wait as if it were still loading.
		switch why := WaitingFor(ReasonNodesWithoutCRIO, d.Message); {
		case len(d.WithoutCRIO) > 0 && r.Phase == PhaseLoaded && r.Condition != why:
			m.log.Warn("a node has no CRI-O: the cluster cannot upgrade", "phase", string(r.Phase), "bundle", r.Name, "reason", d.Message)
			effs = m.Move(r, r.Phase, why, r.Progress)
		case len(d.WithoutCRIO) == 0 && r.Condition.Reason == ReasonNodesWithoutCRIO:
			effs = m.Move(r, r.Phase, Condition{}, r.Progress)
		}
	case Conflict:
		effs = m.reportConflict(d.Message)
	}
	return effs
}

// nodesWithoutFerry is why the gate stays shut for nodes the machine
// config operator counts but no record names: ferry does not run there,
// so nothing says they hold the bundle, and after the upgrade their pods
// could not pull the new release. Names the administrator excluded that
// have no record stand for as many of them. The zero Condition when none
// is left (or the MCO's count is not known).
func (m *Machine) nodesWithoutFerry() Condition {
	left, excluded := m.unrecordedLeft()
	if left <= 0 {
		return Condition{}
	}
	counted := "the machine config operator counts " + itoa(len(m.Recorded)+m.Unrecorded) + " nodes, " + itoa(len(m.Recorded)) + " run ferry"
	if excluded > 0 {
		counted += " and spec.excludedNodes leaves out " + itoa(excluded) + " more"
	}
	return WaitingFor(ReasonNodesWithoutFerry, counted+": start ferry on the other "+itoa(left)+" (oc -n openshift-ferry get leases shows which run it: one Lease per node) or exclude them in the UpgradeBundle (spec.excludedNodes)")
}

// unrecordedLeft is how many nodes without a record the gate waits for,
// and how many it does not: the excluded names that have no record.
func (m *Machine) unrecordedLeft() (left, excluded int) {
	for n := range m.Excluded {
		if !slices.Contains(m.Recorded, n) {
			excluded++
		}
	}
	return max(m.Unrecorded-excluded, 0), excluded
}

func (m *Machine) reportConflict(reason string) []Effect {
	why := Fault(ReasonBundlesDiffer, reason)
	if b := m.LastBad; b != nil && b.Phase == PhaseConflict && b.Condition == why {
		return nil
	}
	m.log.Warn("conflict", "phase", string(PhaseConflict), "reason", reason)
	r := &Record{ID: m.newID("cluster"), Name: "cluster", Origin: OriginPeer}
	m.LastBad = r
	return m.Move(r, PhaseConflict, why, Progress{})
}

// peersDisagree is why not every peer holds the same bundle as r, which
// must hold before anything is pinned; the zero Condition when they do.
func (m *Machine) peersDisagree(r *Record) Condition {
	if !m.hasPeers() {
		return Condition{}
	}
	if m.view.At.IsZero() {
		return WaitingFor(ReasonPeersUnheard, "waiting to hear from the peers")
	}
	self := m.standing()
	var unheld []string
	for _, p := range m.peers {
		st, heard := m.view.Statuses[p]
		switch {
		case m.gateExcluded(p, peerNode(st)):
			continue
		case !heard:
			unheld = append(unheld, p+" (not heard from yet)")
		case st.Err != nil:
			unheld = append(unheld, unheardWhy(p, st))
		case conflicting(self, st.Status):
			return Fault(ReasonPeerHoldsOther, "conflict: node "+nodeName(p, st.Status)+" holds another bundle ("+st.Version+", "+sha256digest.Short(st.Digest)+"): remove the second stick and run 'ferry cleanup' there")
		case refuses(st.Status, r.Digest):
			return WaitingFor(ReasonPeerRefuses, "node "+nodeName(p, st.Status)+" refuses this bundle ("+st.Status.Error+"): every node must hold it before anything is pinned; approve it there (approved_digests or trusted_keys) or bring a bundle every node approves")
		case st.Digest != r.Digest:
			unheld = append(unheld, nodeName(p, st.Status))
		}
	}
	if len(unheld) > 0 {
		return WaitingFor(ReasonPeersNotHolding, "waiting for "+strings.Join(unheld, ", ")+" to hold the bundle")
	}
	return Condition{}
}
