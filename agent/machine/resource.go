package machine

import (
	"slices"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/bundle/meta"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
	"github.com/ferry-edge/ferry/peer/wire"
)

// ResourceName is the UpgradeBundle's name for a bundle: <version>-<arch>
// as a Kubernetes name allows it (lower case, "_" and "+" as "-"), e.g.
// 4.13.7-x86-64.
func ResourceName(version, arch string) string {
	b := []byte(strings.ToLower(version + "-" + arch))
	for i, c := range b {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '-') {
			b[i] = '-'
		}
	}
	return strings.Trim(string(b), "-.")
}

// bundleReport is this node's part of the active bundle's resource, as
// the loop last published it.
type BundleReport struct {
	Name    string // <version>-<arch>: the resource's name
	Sum     cluster.BundleSummary
	Entry   cluster.BundleNodeEntry
	Line    string // the status line, for Events
	Healthy bool
	Phases  []phaseAt // every phase reached, for Events
	// unrecorded: nodes the machine config operator counts, with no
	// record and not excluded; the summary's nodesReady counts them.
	Unrecorded int
}

// PolicyRead: the administrator's policy for bundle name, and the
// nodes the gate leaves out (node name → why; their peer addresses too).
type PolicyRead struct {
	Name   string
	Policy cluster.BundlePolicy
	// Generation is the spec's (metadata.generation): spec.proceed
	// written after a path stopped resumes it.
	Generation int64
	Excluded   map[string]string
	Hosts      map[string]string // node name → InternalIP
}

// resourceReport is this node's report on the active bundle, nil when
// there is none to report.
func (m *Machine) ResourceReport(s Status) *BundleReport {
	r := m.Active
	if r == nil {
		r = m.LastBad // a refusal is reported too
	}
	if r == nil {
		r = m.cleaned // a cleanup (ferry cleanup, spec.cleanup)
	}
	if r == nil {
		r = m.done // and the end: upgraded, cleaned up
	}
	if r == nil || r.Metadata == nil {
		return nil
	}
	md := r.Metadata
	rep := &BundleReport{Name: ResourceName(md.Version, md.Arch), Line: eventLine(s.Line), Healthy: s.Healthy, Phases: reached(r)}
	var strays []string // said as long as they stand, approved or not
	if s := StrayApprovals(m.clusterApproved, rep.Name, r.Digest); len(s) > 0 {
		strays = []string{StrayMessage(strings.Join(s, ", "), rep.Name, r.Digest)}
	}
	// The node's standing warnings (approval off, a TLS check skipped)
	// are said once, here, not in every Event and condition.
	var standing []string
	if s.ApprovalOff {
		standing = append(standing, ApprovalOffWarning)
	}
	standing = append(standing, s.Warnings...)
	rep.Unrecorded, _ = m.unrecordedLeft()
	rep.Sum = cluster.BundleSummary{Version: md.Version, Arch: md.Arch, Release: SanitizeReason(md.Release), Digest: r.Digest, Size: SanitizeText(md.Size, maxSummarySize),
		Images: len(md.AllImages()), Approved: string(r.Approval), Warnings: BoundList(slices.Concat(strays, r.Warnings, r.SignaturePolicy, standing), MaxSummaryWarnings)}
	pathSummary(r, &rep.Sum)
	rep.Entry = cluster.BundleNodeEntry{Phase: string(r.Phase), Digest: r.Digest, Reason: ReasonOf(r.Phase, r.Condition),
		Message: SanitizeReason(strings.TrimPrefix(r.Condition.Message+HeldBack(s.HoldingBack), " — ")), Conditions: conditions(r)}
	return rep
}

// eventLine is the status line as an Event says it: without the node's
// standing warnings, which the summary's warnings say once.
func eventLine(line string) string {
	for _, w := range []string{" — " + ApprovalOffWarning, " — WARNING: "} {
		if i := strings.Index(line, w); i >= 0 {
			line = line[:i]
		}
	}
	return line
}

// heldBack says in the node's entry that pacing holds its bulk work
// back, and for what ("io pressure"), without the measure, which moves
// with every reading and would rewrite the entry each time.
func HeldBack(why string) string {
	if why = strings.TrimRight(why, "0123456789.% "); why == "" {
		return ""
	}
	return " — holding back for " + why + ": the node's other work stalls (pacing)"
}

// What the resource's CRD (packaging/upgradebundle-crd.yaml) bounds, and
// ferry's own writes fit: a list of warnings or excluded nodes, and the
// size string (from metadata.json).
const (
	MaxSummaryWarnings = 16
	MaxSummaryExcluded = 256
	maxSummarySize     = 64
	maxSummaryBehind   = 1024
)

// boundList is l, each item SanitizeReason'd, at most max items: the last
// one says how many more there are.
func BoundList(l []string, max int) []string {
	var out []string
	for i, s := range l {
		if i == max-1 && len(l) > max {
			out = append(out, "… and "+itoa(len(l)-i)+" more (ferry status on the node)")
			break
		}
		out = append(out, SanitizeReason(s))
	}
	return out
}

// conditions are the Extracted, Loaded and Updated conditions of r.
func conditions(r *Record) []cluster.BundleCondition {
	p := r.Phase
	at := func(ps ...Phase) time.Time {
		for _, q := range ps {
			if t, ok := r.Times[q]; ok {
				return t
			}
		}
		return time.Time{}
	}
	cond := func(t string, ok bool, okSince time.Time) cluster.BundleCondition {
		c := cluster.BundleCondition{Type: t, Status: "False", Reason: PhaseReason(p), Message: SanitizeReason(r.Condition.Message), Since: at(p)}
		if ok {
			c = cluster.BundleCondition{Type: t, Status: "True", Reason: PhaseReason(p), Since: okSince}
		}
		return c
	}
	past := func(ps ...Phase) bool { return slices.Contains(ps, p) }
	return []cluster.BundleCondition{
		cond("Extracted", past(PhaseExtracted, PhaseLoading, PhaseLoaded, PhaseClusterReady, PhaseUpgrading, PhaseUpgraded), at(PhaseExtracted)),
		cond("Loaded", past(PhaseLoaded, PhaseClusterReady, PhaseUpgrading, PhaseUpgraded), at(PhaseLoaded)),
		cond("Updated", p == PhaseUpgraded, at(PhaseUpgraded)),
	}
}

// phaseReason is a phase as a condition or Event reason (CamelCase).
func PhaseReason(p Phase) string {
	var b strings.Builder
	for _, w := range strings.Split(string(p), "-") {
		if w != "" {
			b.WriteString(strings.ToUpper(w[:1]) + w[1:])
		}
	}
	return b.String()
}

// phaseRank orders the phases a bundle moves through, for the cluster's
// phase (the least advanced node's); refusals rank first.
func phaseRank(p string) int {
	order := []Phase{PhaseRejected, PhaseFailed, PhaseConflict, PhaseIdle, PhaseDetected, PhaseFetching, PhaseExtracted, PhaseLoading,
		PhaseLoaded, PhaseClusterReady, PhaseUpgrading, PhaseUpgraded}
	if i := slices.Index(order, Phase(p)); i >= 0 {
		return i
	}
	return len(order)
}

// summarizeGated is summarize, with the entries of the nodes the gate
// waits for (the resource's conditions are decided from them).
func SummarizeGated(rep *BundleReport, view cluster.BundleView, self string, nodes []string, excluded map[string]string) (cluster.BundleSummary, map[string]cluster.BundleNodeEntry) {
	sum := rep.Sum
	entries := map[string]cluster.BundleNodeEntry{}
	for n, e := range view.Nodes {
		entries[n] = e
	}
	entries[self] = rep.Entry
	// Every entry's digest still counts for a disagreement: saying it
	// loudly is safe, and the admission policy weighs every entry too.
	disagree := disagreement(entries)
	if nodes != nil {
		for n := range entries {
			if n != self && !slices.Contains(nodes, n) {
				delete(entries, n)
			}
		}
	}
	for _, n := range nodes {
		if _, ok := entries[n]; !ok {
			entries[n] = cluster.BundleNodeEntry{Phase: string(PhaseIdle)}
		}
	}
	waited, ready, phase := 0, 0, ""
	var behind []string
	for n, e := range entries {
		if _, out := excluded[n]; out {
			delete(entries, n)
			continue
		}
		waited++
		if p := Phase(e.Phase); (p.Loaded() || p == PhaseUpgraded) && e.Digest == rep.Entry.Digest {
			ready++
		} else {
			behind = append(behind, n)
		}
		if phase == "" || phaseRank(e.Phase) < phaseRank(phase) {
			phase = e.Phase
		}
	}
	waited += rep.Unrecorded
	sum.Phase, sum.NodesReady = phase, itoa(ready)+"/"+itoa(waited)
	slices.Sort(behind)
	if rep.Unrecorded > 0 {
		behind = append(behind, itoa(rep.Unrecorded)+" without ferry")
	}
	sum.Behind = SanitizeText(strings.Join(behind, ", "), maxSummaryBehind)
	for n, why := range excluded {
		sum.Excluded = append(sum.Excluded, n+": "+why)
	}
	slices.Sort(sum.Excluded)
	sum.Excluded = BoundList(sum.Excluded, MaxSummaryExcluded)
	if sum.Approved == "" || sum.Approved == string(meta.ApprovalNone) {
		sum.Approved = ApprovedWaiting
	}
	if disagree != "" {
		// Said loudly, where oc get shows it; the admission policy
		// refuses a summary that names a digest some entry contradicts.
		sum.Digest, sum.Approved = "", ApprovedDisagree
		sum.Warnings = BoundList(slices.Concat([]string{disagree}, sum.Warnings), MaxSummaryWarnings)
	}
	return sum, entries
}

// The summary's approved when the nodes' entries name different digests
// for one bundle (ApprovedDisagree), and when nothing approves it yet.
const (
	ApprovedDisagree = "digests disagree"
	ApprovedWaiting  = "waiting for approval"
)

// disagreement says which nodes name which digest when the entries name
// more than one ("" when they agree).
func disagreement(entries map[string]cluster.BundleNodeEntry) string {
	by := map[digest.Digest][]string{}
	for n, e := range entries {
		if e.Digest != "" {
			by[e.Digest] = append(by[e.Digest], n)
		}
	}
	if len(by) < 2 {
		return ""
	}
	var parts []string
	for d, ns := range by {
		slices.Sort(ns)
		parts = append(parts, string(d)+": "+strings.Join(ns, ", "))
	}
	slices.Sort(parts)
	return "the nodes read different digests for this bundle (" + strings.Join(parts, "; ") +
		"): approve only the digest the engineer gave you (the bundle's .sha256 file), and find out why a node reads another"
}

// phaseAt is a phase a record reached, and when.
type phaseAt struct {
	Phase Phase
	At    time.Time
}

// reached lists the phases r reached, oldest first.
func reached(r *Record) []phaseAt {
	var out []phaseAt
	for p, at := range r.Times {
		out = append(out, phaseAt{p, at})
	}
	slices.SortFunc(out, func(a, b phaseAt) int {
		if c := a.At.Compare(b.At); c != 0 {
			return c
		}
		return phaseRank(string(a.Phase)) - phaseRank(string(b.Phase))
	})
	return out
}

// gateExcluded tells whether the peer at addr (status s, when heard) is
// left out of the gate by the administrator's policy.
func (m *Machine) gateExcluded(addr, node string) bool {
	if len(m.Excluded) == 0 {
		return false
	}
	if _, ok := m.Excluded[node]; ok && node != "" {
		return true
	}
	return m.excludedHosts[hostOf(addr)]
}

// hostOf is addr's host as net.SplitHostPort splits "host:port" and
// "[v6]:port"; addr itself when it is neither (the machine links no
// network package for one split).
func hostOf(addr string) string {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return addr
	}
	if strings.HasPrefix(addr, "[") {
		end := strings.IndexByte(addr, ']')
		if end != i-1 || strings.ContainsAny(addr[1:end], "[]") || strings.ContainsAny(addr[i+1:], "[]") {
			return addr
		}
		return addr[1:end]
	}
	host := addr[:i]
	if strings.ContainsAny(host, ":[]") || strings.ContainsAny(addr[i+1:], "[]") {
		return addr
	}
	return host
}

// gatedStatuses are the peers' statuses the gate weighs: the excluded
// nodes' left out.
func (m *Machine) gatedStatuses() map[string]wire.PeerStatus {
	if len(m.Excluded) == 0 {
		return m.view.Statuses
	}
	out := map[string]wire.PeerStatus{}
	for addr, st := range m.view.Statuses {
		if !m.gateExcluded(addr, peerNode(st)) {
			out[addr] = st
		}
	}
	return out
}

// schedule is the administrator's schedule for the active bundle, else
// the node's config's.
func (m *Machine) schedule() string {
	if p := m.bundlePolicy; p != nil && p.Schedule != "" && m.activeResource() == m.bundleName {
		return p.Schedule
	}
	return m.cfg.Schedule
}

// bundlePolicySeen takes the administrator's newest word on a bundle: who
// the gate leaves out, the schedule, and proceed (Manual).
func (m *Machine) bundlePolicySeen(ev PolicyRead) []Effect {
	changed := m.bundleName != ev.Name || m.bundlePolicy == nil || !m.bundlePolicy.Equal(ev.Policy) ||
		!sameMap(m.Excluded, ev.Excluded) || m.bundleGeneration != ev.Generation
	if !changed {
		return nil
	}
	p := ev.Policy
	m.bundleName, m.bundlePolicy, m.Excluded, m.bundleGeneration = ev.Name, &p, ev.Excluded, ev.Generation
	m.excludedHosts = map[string]bool{}
	for n := range ev.Excluded {
		if ip := ev.Hosts[n]; ip != "" {
			m.excludedHosts[ip] = true
		}
	}
	if len(ev.Excluded) > 0 {
		m.log.Info("the gate leaves nodes out", "bundle", ev.Name, "excluded", mapText(ev.Excluded))
	}
	r := m.Active
	if m.activeResource() != ev.Name {
		return nil
	}
	if p.Cleanup {
		return m.cleanupAskedByCluster(r)
	}
	var effs []Effect
	if p.Proceed && m.schedule() == "Manual" && r.Phase == PhaseClusterReady && r.Plugged {
		effs = append(effs, m.proceed(r, false)...)
	}
	if p.Proceed && pathStopped(r) && ev.Generation > r.Upgrade.StoppedAt {
		effs = append(effs, m.proceed(r, true)...) // written after the path stopped: resume it
	}
	switch r.Phase {
	case PhaseLoaded, PhaseClusterReady:
		effs = append(effs, m.gate(r)...)
	case PhaseExtracted:
		effs = append(effs, m.next()...) // an excluded peer no longer holds the load back
	}
	return effs
}

// cleanupAskedByCluster takes r out because the administrator set the
// UpgradeBundle's spec.cleanup: what 'ferry cleanup' does on the node,
// asked once.
func (m *Machine) cleanupAskedByCluster(r *Record) []Effect {
	if m.cleanupAsked || r.Retirement >= RetirementStarted || r.Phase == PhaseCleaned || r.Phase == PhaseRejected {
		return nil
	}
	if held := m.cleanupHeld(r); held != "" {
		why := WaitingFor(ReasonCleanupRefused, held)
		if r.Condition == why {
			return nil
		}
		m.log.Warn("the UpgradeBundle asks for cleanup (spec.cleanup): not now", "bundle", r.Name, "phase", string(r.Phase), "reason", held)
		return m.Move(r, r.Phase, why, r.Progress)
	}
	m.log.Info("the UpgradeBundle asks for cleanup (spec.cleanup)", "bundle", r.Name, "phase", string(r.Phase))
	return m.requestArrived(EvRequest{Kind: ReqCleanup})
}

// specRefuses is why r must not load: its UpgradeBundle approves another
// digest. A node's own approvals add to the administrator's, never
// override the spec's choice of a bundle ("" when it does not refuse).
func (m *Machine) specRefuses(r *Record) string {
	p := m.bundlePolicy
	if p == nil || p.ApprovedDigest == "" || m.bundleName != m.activeResource() {
		return ""
	}
	if approved := meta.NormalizeDigest(p.ApprovedDigest); approved != "" && approved != r.Digest {
		return "not loading: UpgradeBundle " + m.bundleName + " approves " + string(approved) + ", not this bundle (" + string(r.Digest) +
			"): bring the approved bundle, or the administrator changes spec.approvedDigest"
	}
	return ""
}

// activeResource is the UpgradeBundle name of the active bundle ("" when
// none).
func (m *Machine) activeResource() string {
	if r := m.Active; r != nil && r.Metadata != nil {
		return ResourceName(r.Metadata.Version, r.Metadata.Arch)
	}
	return ""
}

// policyRead tells whether the active bundle's UpgradeBundle has been read
// (always, without an API): the upgrade starts by itself only once the
// administrator's word on it is known.
func (m *Machine) policyRead() bool {
	return !m.HasAPI || m.bundlePolicy != nil && m.bundleName == m.activeResource()
}

// ApprovalsRead: the digests the cluster's UpgradeBundles approve,
// each with the resource that holds it, digests normalized.
type ApprovalsRead struct{ Approvals []cluster.Approval }

// polFor is the node's approval policy for a bundle of md (nil: none in
// view): its config's, what registry mode approves, and the digest md's
// own UpgradeBundle approves (ownApproval). The cluster adds approvals;
// it never overrides a refusal (arch, digest, the node's signature
// policy are checked all the same).
func (m *Machine) polFor(md *meta.Metadata) meta.Policy {
	own := m.ownApproval(md)
	if own == "" && len(m.pulled) == 0 && len(m.clusterSources) == 0 {
		return m.policy
	}
	p := m.policy
	p.ApprovedDigests = slices.Concat(p.ApprovedDigests, m.pulled)
	if own != "" {
		p.ApprovedDigests = append(p.ApprovedDigests, own)
	}
	p.ApprovedSources = m.clusterSources
	return p
}

// ownApproval is the digest that md's own UpgradeBundle approves, the one
// named ResourceName (issue 45): approval, schedule, proceed and
// exclusions all come from that one resource. Another resource naming
// the digest (4.19.8-amd64 for 4.19.8-x86-64, a copy under another
// name) approves nothing: strayApprovals says so.
func (m *Machine) ownApproval(md *meta.Metadata) string {
	if md == nil {
		return ""
	}
	name := ResourceName(md.Version, md.Arch)
	for _, ap := range m.clusterApproved {
		if ap.Bundle == name {
			return ap.Digest
		}
	}
	return ""
}

// strayApprovals are the UpgradeBundles other than name, the bundle's
// own, that approve its digest d: each is a mistake to report, never an
// approval.
func StrayApprovals(approvals []cluster.Approval, name string, d digest.Digest) []string {
	var out []string
	for _, ap := range approvals {
		if ap.Bundle != name && d != "" && meta.NormalizeDigest(ap.Digest) == d {
			out = append(out, ap.Bundle)
		}
	}
	return out
}

// clusterApprovalsSeen takes the cluster's approvals: a bundle waiting
// for approval that is now approved goes on (next), with no restart.
func (m *Machine) clusterApprovalsSeen(ev ApprovalsRead) []Effect {
	if slices.Equal(m.clusterApproved, ev.Approvals) {
		return nil
	}
	m.clusterApproved = ev.Approvals
	m.log.Info("approved digests from the cluster's UpgradeBundles", "approvals", approvalsText(ev.Approvals))
	if r := m.Active; r != nil && r.Approval == meta.ApprovalNone && r.Phase == PhaseExtracted {
		return m.next()
	}
	return nil
}

// strayMessage says that UpgradeBundle stray approves the digest of the
// bundle whose own resource is name, and does not count.
func StrayMessage(stray, name string, d digest.Digest) string {
	return "UpgradeBundle " + stray + " approves " + sha256digest.Short(d) + " but is not this bundle's resource: ferry takes approval, schedule, proceed, exclusions and cleanup from UpgradeBundle " +
		name + " only; write the spec there (oc patch upgradebundle " + name + " --type=merge -p '{\"spec\":{…}}') and delete " + stray
}

// waitingForApproval is why r waits unloaded: with the cluster's API, how
// the administrator approves it there, with no node shell and no restart.
// The digest to approve is the engineer's (the bundle's .sha256 file,
// ferry bundle verify), never one a node reports: this node's is given
// to compare with, and a node's word can be forged.
func (m *Machine) WaitingForApproval(r *Record) string {
	if !m.HasAPI || r.Metadata == nil {
		return WaitingForApproval(r.Digest)
	}
	name := ResourceName(r.Metadata.Version, r.Metadata.Arch)
	why := approvalCommand(name, r.Metadata.Name(), r.Digest)
	if strays := StrayApprovals(m.clusterApproved, name, r.Digest); len(strays) > 0 {
		why += "; " + StrayMessage(strings.Join(strays, ", "), name, r.Digest)
	}
	return why
}

// approvalCommand is how the administrator approves the bundle file
// (upgrade-<version>-<arch>) of the UpgradeBundle name, whether or not
// that resource exists yet: ferry approve with the engineer's .sha256,
// which creates it or writes its spec. d, this node's digest, is given to
// compare with, never to paste: a node's word can be forged.
func approvalCommand(name, file string, d digest.Digest) string {
	return "waiting for approval: ferry approve " + file + ".sha256 with the engineer's file (it creates UpgradeBundle " + name + ", or writes its spec.approvedDigest), " +
		"never with a digest from this node: this node read " + string(d) + ", compare it (or add the engineer's digest to approved_digests and restart ferry)"
}
