package agent

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/sha256digest"
	"github.com/ferry-edge/ferry/peer"
)

// The UpgradeBundle resource (docs/design.md, "The UpgradeBundle"): the
// administrator's policy for a bundle (spec) is read here, and this node's
// view of it written into its status, with an Event for each phase it
// reaches and a ferry.io/phase label on its Node. Without an API none of
// this runs.

// LabelPhase is the Node label that says this node's phase (oc get nodes
// -L ferry.io/phase).
const LabelPhase = "ferry.io/phase"

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

// BundleAPI is the part of the cluster's API the resource needs.
type BundleAPI interface {
	UpgradeBundle(ctx context.Context, name string) (cluster.BundleView, bool, error)
	// PublishBundle writes node's entry, and the summary when sum is not
	// nil (this node is the summary's one writer, summaryWriter).
	PublishBundle(ctx context.Context, name string, sum *cluster.BundleSummary, node string, entry cluster.BundleNodeEntry) error
	BundleEvent(ctx context.Context, name, uid, node, eventType, reason, message string) error
	NodeReadiness(ctx context.Context) (map[string]cluster.NodeReady, error)
	// Approvals is every UpgradeBundle's spec.approvedDigest, with the
	// resource that holds it.
	Approvals(ctx context.Context) ([]cluster.Approval, error)
	// Sources is every UpgradeBundle's spec.source (registry.go).
	Sources(ctx context.Context) ([]cluster.RegistrySource, error)
}

// bundleReport is this node's part of the active bundle's resource, as
// the loop last published it.
type bundleReport struct {
	name    string // <version>-<arch>: the resource's name
	sum     cluster.BundleSummary
	entry   cluster.BundleNodeEntry
	line    string // the status line, for Events
	healthy bool
	phases  []phaseAt // every phase reached, for Events
	// unrecorded: nodes the machine config operator counts, with no
	// record and not excluded; the summary's nodesReady counts them.
	unrecorded int
}

// evBundlePolicy: the administrator's policy for bundle name, and the
// nodes the gate leaves out (node name → why; their peer addresses too).
type evBundlePolicy struct {
	name     string
	policy   cluster.BundlePolicy
	excluded map[string]string
	hosts    map[string]string // node name → InternalIP
}

func (evBundlePolicy) isEvent() {}

// resourceReport is this node's report on the active bundle, nil when
// there is none to report.
func (m *machine) resourceReport(s Status) *bundleReport {
	r := m.active
	if r == nil {
		r = m.lastBad // a refusal is reported too
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
	rep := &bundleReport{name: ResourceName(md.Version, md.Arch), line: eventLine(s.Line), healthy: s.Healthy, phases: reached(r)}
	var strays []string // said as long as they stand, approved or not
	if s := strayApprovals(m.clusterApproved, rep.name, r.Digest); len(s) > 0 {
		strays = []string{strayMessage(strings.Join(s, ", "), rep.name, r.Digest)}
	}
	// The node's standing warnings (approval off, a TLS check skipped)
	// are said once, here, not in every Event and condition.
	var standing []string
	if s.ApprovalOff {
		standing = append(standing, approvalOffWarning)
	}
	standing = append(standing, s.Warnings...)
	rep.unrecorded, _ = m.unrecordedLeft()
	rep.sum = cluster.BundleSummary{Version: md.Version, Arch: md.Arch, Release: SanitizeReason(md.Release), Digest: r.Digest, Size: sanitizeText(md.Size, maxSummarySize),
		Images: len(md.AllImages()), Approved: string(r.Approval), Warnings: boundList(slices.Concat(strays, r.Warnings, r.SignaturePolicy, standing), maxSummaryWarnings)}
	rep.entry = cluster.BundleNodeEntry{Phase: string(r.Phase), Digest: r.Digest, Reason: reasonOf(r.Phase, r.Condition),
		Message: SanitizeReason(strings.TrimPrefix(r.Condition.Message+heldBack(s.HoldingBack), " — ")), Conditions: conditions(r)}
	return rep
}

// eventLine is the status line as an Event says it: without the node's
// standing warnings, which the summary's warnings say once.
func eventLine(line string) string {
	for _, w := range []string{" — " + approvalOffWarning, " — WARNING: "} {
		if i := strings.Index(line, w); i >= 0 {
			line = line[:i]
		}
	}
	return line
}

// heldBack says in the node's entry that pacing holds its bulk work
// back, and for what ("io pressure"), without the measure, which moves
// with every reading and would rewrite the entry each time.
func heldBack(why string) string {
	if why = strings.TrimRight(why, "0123456789.% "); why == "" {
		return ""
	}
	return " — holding back for " + why + ": the node's other work stalls (pacing)"
}

// holdOnly tells whether entries a and b differ in pacing's hold alone.
func holdOnly(a, b cluster.BundleNodeEntry) bool {
	a.Reason, b.Reason = withoutHold(a.Reason), withoutHold(b.Reason)
	return reflect.DeepEqual(a, b)
}

// withoutHold is reason without what heldBack added.
func withoutHold(reason string) string {
	if i := strings.Index(reason, "holding back for "); i >= 0 {
		return strings.TrimSuffix(reason[:i], " — ")
	}
	return reason
}

// summaryWriter is the node that writes a resource's summary: the first
// by name of the nodes that have written their entry there (and this
// one), leaving out those the gate leaves out and those not ready. A
// node is known by its record (ready holds only nodes with a Lease): an
// entry of a name with none (a deleted Node, or a name someone made up)
// never writes the summary. Every node picks alike from the same
// resource, itself held to the same rule as the others (else a node not
// ready would write beside the ready one the others pick); when none is
// ready, the first by name of those known; when the writer stops (it
// goes NotReady, is excluded or deleted) the next one takes over.
func summaryWriter(view cluster.BundleView, ready map[string]cluster.NodeReady, excluded map[string]string, self string) string {
	first := func(wantReady bool) string {
		writer := ""
		consider := func(n string) {
			if _, out := excluded[n]; out || writer != "" && n >= writer {
				return
			}
			if r, known := ready[n]; !known || wantReady && !r.Ready {
				return
			}
			writer = n
		}
		consider(self)
		for n, e := range view.Nodes {
			if e.Phase != "" {
				consider(n)
			}
		}
		return writer
	}
	return cmp.Or(first(true), first(false), self)
}

// What the resource's CRD (packaging/upgradebundle-crd.yaml) bounds, and
// ferry's own writes fit: a list of warnings or excluded nodes, and the
// size string (from metadata.json).
const (
	maxSummaryWarnings = 16
	maxSummaryExcluded = 256
	maxSummarySize     = 64
	maxSummaryBehind   = 1024
)

// boundList is l, each item SanitizeReason'd, at most max items: the last
// one says how many more there are.
func boundList(l []string, max int) []string {
	var out []string
	for i, s := range l {
		if i == max-1 && len(l) > max {
			out = append(out, fmt.Sprintf("… and %d more (ferry status on the node)", len(l)-i))
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
		c := cluster.BundleCondition{Type: t, Status: "False", Reason: phaseReason(p), Message: SanitizeReason(r.Condition.Message), Since: at(p)}
		if ok {
			c = cluster.BundleCondition{Type: t, Status: "True", Reason: phaseReason(p), Since: okSince}
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
func phaseReason(p Phase) string {
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

// summarize fills the cluster's phase and nodes-ready count from every
// node's entry (this one's as it is now), leaving out the excluded nodes;
// nodes lists the nodes with a record (nil when unknown): an entry of any
// other name is no node's and is not counted. The nodes the machine
// config operator counts with no record (rep.unrecorded) are waited for:
// nodesReady counts them, never ready.
func summarize(rep *bundleReport, view cluster.BundleView, self string, nodes []string, excluded map[string]string) cluster.BundleSummary {
	sum, _ := summarizeGated(rep, view, self, nodes, excluded)
	return sum
}

// summarizeGated is summarize, with the entries of the nodes the gate
// waits for (the resource's conditions are decided from them).
func summarizeGated(rep *bundleReport, view cluster.BundleView, self string, nodes []string, excluded map[string]string) (cluster.BundleSummary, map[string]cluster.BundleNodeEntry) {
	sum := rep.sum
	entries := map[string]cluster.BundleNodeEntry{}
	for n, e := range view.Nodes {
		entries[n] = e
	}
	entries[self] = rep.entry
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
		if p := Phase(e.Phase); (p.Loaded() || p == PhaseUpgraded) && e.Digest == rep.entry.Digest {
			ready++
		} else {
			behind = append(behind, n)
		}
		if phase == "" || phaseRank(e.Phase) < phaseRank(phase) {
			phase = e.Phase
		}
	}
	waited += rep.unrecorded
	sum.Phase, sum.NodesReady = phase, fmt.Sprintf("%d/%d", ready, waited)
	slices.Sort(behind)
	if rep.unrecorded > 0 {
		behind = append(behind, fmt.Sprintf("%d without ferry", rep.unrecorded))
	}
	sum.Behind = sanitizeText(strings.Join(behind, ", "), maxSummaryBehind)
	for n, why := range excluded {
		sum.Excluded = append(sum.Excluded, n+": "+why)
	}
	slices.Sort(sum.Excluded)
	sum.Excluded = boundList(sum.Excluded, maxSummaryExcluded)
	if sum.Approved == "" || sum.Approved == string(bundle.ApprovalNone) {
		sum.Approved = ApprovedWaiting
	}
	if disagree != "" {
		// Said loudly, where oc get shows it; the admission policy
		// refuses a summary that names a digest some entry contradicts.
		sum.Digest, sum.Approved = "", ApprovedDisagree
		sum.Warnings = boundList(slices.Concat([]string{disagree}, sum.Warnings), maxSummaryWarnings)
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

// followBundle reads the active bundle's resource and writes this node's
// part of it: the policy goes to the loop (evBundlePolicy), the report to
// the status, an Event for each new phase. It reads when the API's watch
// sees a change, when this node's report changes, at each resync, and
// after a failure with backoff.
func (a *Agent) followBundle(ctx context.Context, api ClusterAPI) {
	var written struct {
		name  string
		sum   cluster.BundleSummary
		entry cluster.BundleNodeEntry
		at    time.Time
	}
	var nodes nodesRead
	lastPhase, lastErr := map[string]string{}, ""
	var approved []cluster.Approval
	var approvalsErr string
	strays := map[string]bool{}
	var sources []cluster.RegistrySource
	retry := time.Duration(0)
	for {
		// Taken before reading: a change while reading wakes the next round.
		changes, followed := api.Changes(), a.followed.c()
		a.readApprovals(ctx, api, &approved, &approvalsErr)
		if err := a.readSources(ctx, api, &sources, &nodes); err != nil {
			if approvalsErr == "" && ctx.Err() == nil {
				a.log.Warn("cannot read the cluster's UpgradeBundles for registry sources; trying again", "err", err)
			}
			approvalsErr = err.Error()
		}
		err := error(nil)
		if rep := a.snap.Load().bundle; rep != nil {
			err = a.syncBundle(ctx, api, rep, &written, &nodes, lastPhase)
			if err == nil {
				err = a.warnStrays(ctx, api, rep, approved, strays)
			}
			if err != nil && err.Error() != lastErr && ctx.Err() == nil {
				a.log.Warn("cannot sync the UpgradeBundle resource; trying again", "bundle", rep.name, "err", err)
			}
		}
		wait := a.resync()
		if err != nil || approvalsErr != "" {
			retry = min(max(2*retry, time.Second), 30*time.Second)
			wait = min(wait, retry)
		} else {
			retry = 0
		}
		if err != nil {
			lastErr = err.Error()
		} else {
			lastErr = ""
		}
		if !awaitChange(ctx, wait, changes, followed) {
			return
		}
	}
}

// resync is how long a follower of the API waits when nothing wakes it.
func (a *Agent) resync() time.Duration {
	return cmp.Or(a.deps.APIPoll, time.Minute)
}

// awaitChange waits for the API's changes, the node's own (followed), or
// wait; false when ctx ended.
func awaitChange(ctx context.Context, wait time.Duration, changes, followed <-chan struct{}) bool {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-changes:
	case <-followed:
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return true
}

// nodesRead is the nodes' readiness as their records (Leases) last said
// it: a node without one (no ferry, or its Node deleted) is absent. Read
// at most once a nodesEvery (a record expires by time, with no change).
type nodesRead struct {
	ready   map[string]cluster.NodeReady
	at      time.Time
	readFor string // the unheard names last read again for (readAgainFor)
}

const nodesEvery = time.Minute

// unheard names the nodes before self by name with an entry in view
// that the last reading does not know ("" when none): each may be the
// summary's writer (summaryWriter), or a name with no record.
func (n *nodesRead) unheard(view cluster.BundleView, self string) string {
	var out []string
	for name, e := range view.Nodes {
		if _, known := n.ready[name]; e.Phase != "" && name < self && !known {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// readAgainFor makes the next refresh read again, once for each new set
// of unheard names: a name with no record for good (a deleted Node's
// entry) costs one reading, not one per sync.
func (n *nodesRead) readAgainFor(unheard string) {
	if unheard != "" && unheard != n.readFor {
		n.ready, n.readFor = nil, unheard
	}
}

// refresh reads the Nodes' readiness again when the last reading is older
// than nodesEvery (or the resync, when shorter).
func (n *nodesRead) refresh(ctx context.Context, api BundleAPI, resync time.Duration) error {
	if n.ready != nil && time.Since(n.at) < min(nodesEvery, resync) {
		return nil
	}
	ready, err := api.NodeReadiness(ctx)
	if err != nil {
		n.ready = nil
		return err
	}
	n.ready, n.at = ready, time.Now()
	return nil
}

func (a *Agent) syncBundle(ctx context.Context, api ClusterAPI, rep *bundleReport, written *struct {
	name  string
	sum   cluster.BundleSummary
	entry cluster.BundleNodeEntry
	at    time.Time
}, nodes *nodesRead, lastPhase map[string]string) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	view, ok, err := api.UpgradeBundle(cctx, rep.name)
	if err != nil {
		return err
	}
	if !ok {
		// None yet (or no CRD): the node's config is the policy, and the
		// node reports on its own Node, until the administrator creates
		// it (absent.go).
		a.post(evBundlePolicy{name: rep.name})
		written.name = "" // written again in full once it exists
		return a.reportWithoutResource(cctx, api, rep, lastPhase)
	}
	// A node whose entry came after this one's readiness reading (both
	// just started): read again, once for those names, rather than write
	// a summary that may be that node's to write (one writer).
	nodes.readAgainFor(nodes.unheard(view, a.cfg.NodeName))
	if err := nodes.refresh(cctx, api, a.resync()); err != nil {
		return err
	}
	ready := nodes.ready
	excluded := excludedNodes(view.Policy, ready, a.deps.Now(), a.cfg.NodeName)
	var hosts map[string]string
	if len(excluded) > 0 {
		if hosts, err = api.NodeAddresses(cctx); err != nil {
			return err
		}
	}
	a.post(evBundlePolicy{name: rep.name, policy: view.Policy, excluded: excluded, hosts: hosts})

	entry := rep.entry
	entry.Excluded = excluded[a.cfg.NodeName]
	rep2 := *rep
	rep2.entry = entry
	// Each node writes its own entry; the summary, derived from every
	// entry, has one writer, so that no node's write changes what another
	// wrote (summaryWriter).
	var sum cluster.BundleSummary
	var sump *cluster.BundleSummary
	if summaryWriter(view, ready, excluded, a.cfg.NodeName) == a.cfg.NodeName {
		known := make([]string, 0, len(ready)) // not nil: no record, no node
		for n := range ready {
			known = append(known, n)
		}
		var gated map[string]cluster.BundleNodeEntry
		sum, gated = summarizeGated(&rep2, view, a.cfg.NodeName, known, excluded)
		summaryConditions(&sum, &rep2, view, gated, a.deps.Now())
		sump = &sum
	}
	changed := written.name != rep.name || !reflect.DeepEqual(written.sum, sum) || !reflect.DeepEqual(written.entry, entry)
	if changed && written.name == rep.name && reflect.DeepEqual(written.sum, sum) && holdOnly(written.entry, entry) && time.Since(written.at) < a.resync() {
		changed = false // pacing's hold alone: at most once a resync, not with every reading
	}
	if changed {
		if err := api.PublishBundle(cctx, rep.name, sump, a.cfg.NodeName, entry); err != nil {
			return err
		}
		written.name, written.sum, written.entry, written.at = rep.name, sum, entry, time.Now()
		if sump != nil {
			if err := a.approvalEvent(cctx, api, rep.name, view, sum); err != nil {
				return err
			}
		}
	}
	return a.phaseEvents(cctx, api, rep, view.UID, entry.Phase, lastPhase)
}

// phaseEvents records one Event per phase the record reached, in order,
// those passed between two polls too; the newest (current) says the
// status line. uid is the resource's ("" while it does not exist).
func (a *Agent) phaseEvents(cctx context.Context, api BundleAPI, rep *bundleReport, uid, current string, lastPhase map[string]string) error {
	for _, p := range rep.phases {
		key := rep.name + "/" + string(p.phase) + "/" + p.at.String()
		if lastPhase[key] != "" {
			continue
		}
		typ, msg := "Normal", fmt.Sprintf("%s: %s at %s", a.cfg.NodeName, p.phase, p.at.UTC().Format(time.RFC3339))
		if string(p.phase) == current {
			msg = fmt.Sprintf("%s: %s", a.cfg.NodeName, rep.line)
			if !rep.healthy {
				typ = "Warning"
			}
		}
		if err := api.BundleEvent(cctx, rep.name, uid, a.cfg.NodeName, typ, phaseReason(p.phase), SanitizeReason(msg)); err != nil {
			return err
		}
		lastPhase[key] = "sent"
	}
	return nil
}

// phaseAt is a phase a record reached, and when.
type phaseAt struct {
	phase Phase
	at    time.Time
}

// reached lists the phases r reached, oldest first.
func reached(r *Record) []phaseAt {
	var out []phaseAt
	for p, at := range r.Times {
		out = append(out, phaseAt{p, at})
	}
	slices.SortFunc(out, func(a, b phaseAt) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return phaseRank(string(a.phase)) - phaseRank(string(b.phase))
	})
	return out
}

// excludedNodes are the nodes the gate leaves out, with why: those the
// policy names, and those NotReady for longer than its timeout.
func excludedNodes(p cluster.BundlePolicy, ready map[string]cluster.NodeReady, now time.Time, self string) map[string]string {
	out := map[string]string{}
	for _, n := range p.ExcludedNodes {
		out[n] = "listed in spec.excludedNodes"
	}
	if p.NotReadyTimeout > 0 {
		for n, r := range ready {
			if _, listed := out[n]; !listed && n != self && !r.Ready && now.Sub(r.Since) > p.NotReadyTimeout {
				out[n] = fmt.Sprintf("NotReady since %s (longer than spec.notReadyTimeout %s)", r.Since.UTC().Format(time.RFC3339), p.NotReadyTimeout)
			}
		}
	}
	return out
}

// gateExcluded tells whether the peer at addr (status s, when heard) is
// left out of the gate by the administrator's policy.
func (m *machine) gateExcluded(addr, node string) bool {
	if len(m.excluded) == 0 {
		return false
	}
	if _, ok := m.excluded[node]; ok && node != "" {
		return true
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	return m.excludedHosts[host]
}

// gatedStatuses are the peers' statuses the gate weighs: the excluded
// nodes' left out.
func (m *machine) gatedStatuses() map[string]peer.PeerStatus {
	if len(m.excluded) == 0 {
		return m.view.statuses
	}
	out := map[string]peer.PeerStatus{}
	for addr, st := range m.view.statuses {
		if !m.gateExcluded(addr, peerNode(st)) {
			out[addr] = st
		}
	}
	return out
}

// schedule is the administrator's schedule for the active bundle, else
// the node's config's.
func (m *machine) schedule() string {
	if p := m.bundlePolicy; p != nil && p.Schedule != "" && m.activeResource() == m.bundleName {
		return p.Schedule
	}
	return m.cfg.Cluster.Schedule
}

// bundlePolicySeen takes the administrator's newest word on a bundle: who
// the gate leaves out, the schedule, and proceed (Manual).
func (m *machine) bundlePolicySeen(ev evBundlePolicy) []effect {
	changed := m.bundleName != ev.name || m.bundlePolicy == nil || !reflect.DeepEqual(*m.bundlePolicy, ev.policy) ||
		!reflect.DeepEqual(m.excluded, ev.excluded)
	if !changed {
		return nil
	}
	p := ev.policy
	m.bundleName, m.bundlePolicy, m.excluded = ev.name, &p, ev.excluded
	m.excludedHosts = map[string]bool{}
	for n := range ev.excluded {
		if ip := ev.hosts[n]; ip != "" {
			m.excludedHosts[ip] = true
		}
	}
	if len(ev.excluded) > 0 {
		m.log.Info("the gate leaves nodes out", "bundle", ev.name, "excluded", fmt.Sprint(ev.excluded))
	}
	r := m.active
	if m.activeResource() != ev.name {
		return nil
	}
	if p.Cleanup {
		return m.cleanupAskedByCluster(r)
	}
	var effs []effect
	if p.Proceed && m.schedule() == "Manual" && r.Phase == PhaseClusterReady && r.Plugged {
		effs = append(effs, m.proceed(r, false)...)
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
func (m *machine) cleanupAskedByCluster(r *Record) []effect {
	if m.cleanupAsked || r.Retirement >= RetirementStarted || r.Phase == PhaseCleaned || r.Phase == PhaseRejected {
		return nil
	}
	if held := m.cleanupHeld(r); held != "" {
		why := waiting(ReasonCleanupRefused, held)
		if r.Condition == why {
			return nil
		}
		m.log.Warn("the UpgradeBundle asks for cleanup (spec.cleanup): not now", "bundle", r.Name, "phase", string(r.Phase), "reason", held)
		return m.move(r, r.Phase, why, r.Progress)
	}
	m.log.Info("the UpgradeBundle asks for cleanup (spec.cleanup)", "bundle", r.Name, "phase", string(r.Phase))
	return m.request(evRequest{kind: reqCleanup})
}

// specRefuses is why r must not load: its UpgradeBundle approves another
// digest. A node's own approvals add to the administrator's, never
// override the spec's choice of a bundle ("" when it does not refuse).
func (m *machine) specRefuses(r *Record) string {
	p := m.bundlePolicy
	if p == nil || p.ApprovedDigest == "" || m.bundleName != m.activeResource() {
		return ""
	}
	if approved := bundle.NormalizeDigest(p.ApprovedDigest); approved != "" && approved != r.Digest {
		return fmt.Sprintf("not loading: UpgradeBundle %s approves %s, not this bundle (%s): bring the approved bundle, or the administrator changes spec.approvedDigest",
			m.bundleName, approved, r.Digest)
	}
	return ""
}

// activeResource is the UpgradeBundle name of the active bundle ("" when
// none).
func (m *machine) activeResource() string {
	if r := m.active; r != nil && r.Metadata != nil {
		return ResourceName(r.Metadata.Version, r.Metadata.Arch)
	}
	return ""
}

// policyRead tells whether the active bundle's UpgradeBundle has been read
// (always, without an API): the upgrade starts by itself only once the
// administrator's word on it is known.
func (m *machine) policyRead() bool {
	return !m.hasAPI || m.bundlePolicy != nil && m.bundleName == m.activeResource()
}

// evClusterApprovals: the digests the cluster's UpgradeBundles approve,
// each with the resource that holds it, digests normalized.
type evClusterApprovals struct{ approvals []cluster.Approval }

func (evClusterApprovals) isEvent() {}

// polFor is the node's approval policy for a bundle of md (nil: none in
// view): its config's, what registry mode approves, and the digest md's
// own UpgradeBundle approves (ownApproval). The cluster adds approvals;
// it never overrides a refusal (arch, digest, the node's signature
// policy are checked all the same).
func (m *machine) polFor(md *bundle.Metadata) bundle.Policy {
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
func (m *machine) ownApproval(md *bundle.Metadata) string {
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
func strayApprovals(approvals []cluster.Approval, name string, d digest.Digest) []string {
	var out []string
	for _, ap := range approvals {
		if ap.Bundle != name && d != "" && bundle.NormalizeDigest(ap.Digest) == d {
			out = append(out, ap.Bundle)
		}
	}
	return out
}

// clusterApprovalsSeen takes the cluster's approvals: a bundle waiting
// for approval that is now approved goes on (next), with no restart.
func (m *machine) clusterApprovalsSeen(ev evClusterApprovals) []effect {
	if slices.Equal(m.clusterApproved, ev.approvals) {
		return nil
	}
	m.clusterApproved = ev.approvals
	m.log.Info("approved digests from the cluster's UpgradeBundles", "approvals", fmt.Sprint(ev.approvals))
	if r := m.active; r != nil && r.Approval == bundle.ApprovalNone && r.Phase == PhaseExtracted {
		return m.next()
	}
	return nil
}

// readApprovals keeps the loop's view of the cluster's approvals: every
// UpgradeBundle's spec.approvedDigest, as the API's watch last saw them.
func (a *Agent) readApprovals(ctx context.Context, api BundleAPI, last *[]cluster.Approval, lastErr *string) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	aps, err := api.Approvals(cctx)
	cancel()
	if err != nil {
		if err.Error() != *lastErr && ctx.Err() == nil {
			a.log.Warn("cannot read the cluster's UpgradeBundles for approvals; trying again", "err", err)
		}
		*lastErr = err.Error()
		return
	}
	*lastErr = ""
	var norm []cluster.Approval
	for _, ap := range aps {
		if n := bundle.NormalizeDigest(ap.Digest); n != "" {
			norm = append(norm, cluster.Approval{Bundle: ap.Bundle, Digest: string(n)})
		}
	}
	slices.SortFunc(norm, func(x, y cluster.Approval) int { return strings.Compare(x.Bundle, y.Bundle) })
	if !slices.Equal(norm, *last) {
		*last = norm
		a.post(evClusterApprovals{approvals: norm})
	}
}

// warnStrays records a Warning Event, once per resource and digest, for
// each UpgradeBundle other than the active bundle's own that approves its
// digest: on that resource (where the administrator wrote it) and on the
// bundle's own, naming the one that counts.
func (a *Agent) warnStrays(ctx context.Context, api BundleAPI, rep *bundleReport, approvals []cluster.Approval, sent map[string]bool) error {
	for _, stray := range strayApprovals(approvals, rep.name, rep.entry.Digest) {
		key := stray + "/" + string(rep.entry.Digest)
		if sent[key] {
			continue
		}
		msg := SanitizeReason(a.cfg.NodeName + ": " + strayMessage(stray, rep.name, rep.entry.Digest))
		a.log.Warn("an UpgradeBundle that is not the bundle's own approves its digest: ignored", "resource", stray, "bundle", rep.name)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := api.BundleEvent(cctx, stray, "", a.cfg.NodeName, "Warning", "ApprovalIgnored", msg)
		if err == nil {
			err = api.BundleEvent(cctx, rep.name, "", a.cfg.NodeName, "Warning", "ApprovalIgnored", msg)
		}
		cancel()
		if err != nil {
			return err
		}
		sent[key] = true
	}
	return nil
}

// strayMessage says that UpgradeBundle stray approves the digest of the
// bundle whose own resource is name, and does not count.
func strayMessage(stray, name string, d digest.Digest) string {
	return fmt.Sprintf("UpgradeBundle %s approves %s but is not this bundle's resource: ferry takes approval, schedule, proceed, exclusions and cleanup from UpgradeBundle %s only; write the spec there (oc patch upgradebundle %s --type=merge -p '{\"spec\":{…}}') and delete %s",
		stray, sha256digest.Short(d), name, name, stray)
}

// waitingForApproval is why r waits unloaded: with the cluster's API, how
// the administrator approves it there, with no node shell and no restart.
// The digest to approve is the engineer's (the bundle's .sha256 file,
// ferry bundle verify), never one a node reports: this node's is given
// to compare with, and a node's word can be forged.
func (m *machine) waitingForApproval(r *Record) string {
	if !m.hasAPI || r.Metadata == nil {
		return WaitingForApproval(r.Digest)
	}
	name := ResourceName(r.Metadata.Version, r.Metadata.Arch)
	why := approvalCommand(name, r.Metadata.Name(), r.Digest)
	if strays := strayApprovals(m.clusterApproved, name, r.Digest); len(strays) > 0 {
		why += "; " + strayMessage(strings.Join(strays, ", "), name, r.Digest)
	}
	return why
}
