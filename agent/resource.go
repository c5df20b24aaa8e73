package agent

import (
	"cmp"
	"context"
	"fmt"
	"github.com/ferry-edge/ferry/agent/machine"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
)

// The UpgradeBundle resource (docs/design.md, "The UpgradeBundle"): the
// administrator's policy for a bundle (spec) is read here, and this node's
// view of it written into its status, with an Event for each phase it
// reaches and a ferry.io/phase label on its Node. Without an API none of
// this runs.

// LabelPhase is the Node label that says this node's phase (oc get nodes
// -L ferry.io/phase).
const LabelPhase = "ferry.io/phase"

// BundleAPI is the part of the cluster's API the resource needs.
type BundleAPI interface {
	UpgradeBundle(ctx context.Context, name string) (cluster.BundleView, bool, error)
	// PublishBundle writes node's entry, and the summary when sum is not
	// nil (this node is the summary's one writer, summaryWriter).
	PublishBundle(ctx context.Context, name string, sum *cluster.BundleSummary, node string, entry cluster.BundleNodeEntry) error
	// FollowEntries follows every node's entries while all is true (this
	// node writes a summary: UpgradeBundle's view then holds them all),
	// else only this node's own.
	FollowEntries(all bool)
	// PullRecord is what node published of its pull for the
	// UpgradeBundle bundle (registry mode), nil when nothing.
	PullRecord(ctx context.Context, bundle, node string) (*cluster.PullRecord, error)
	BundleEvent(ctx context.Context, name, uid, node, eventType, reason, message string) error
	NodeReadiness(ctx context.Context) (map[string]cluster.NodeReady, error)
	// Approvals is every UpgradeBundle's spec.approvedDigest, with the
	// resource that holds it.
	Approvals(ctx context.Context) ([]cluster.Approval, error)
	// Sources is every UpgradeBundle's spec.source (registry.go).
	Sources(ctx context.Context) ([]cluster.RegistrySource, error)
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

// summaryWriter is the node that writes the summary of the UpgradeBundle
// name: the first by name of the nodes whose record says they report on
// it (and this one), leaving out those the gate leaves out and those not
// ready. A node is known by its record (ready holds only nodes with a
// Lease), never by its entry, which only the writer reads: every node
// picks alike from the records it watches, itself held to the same rule
// as the others (else a node not ready would write beside the ready one
// the others pick); when none is ready, the first by name of those
// known; when the writer stops (it goes NotReady, is excluded or
// deleted, its record expires) the next one takes over.
func summaryWriter(name string, ready map[string]cluster.NodeReady, excluded map[string]string, self string) string {
	first := func(wantReady bool) string {
		writer := ""
		for n, r := range ready {
			if _, out := excluded[n]; out || writer != "" && n >= writer || n != self && r.Reports != name || wantReady && !r.Ready {
				continue
			}
			writer = n
		}
		return writer
	}
	return cmp.Or(first(true), first(false), self)
}

// summarize fills the cluster's phase and nodes-ready count from every
// node's entry (this one's as it is now), leaving out the excluded nodes;
// nodes lists the nodes with a record (nil when unknown): an entry of any
// other name is no node's and is not counted. The nodes the machine
// config operator counts with no record (rep.unrecorded) are waited for:
// nodesReady counts them, never ready.
func summarize(rep *machine.BundleReport, view cluster.BundleView, self string, nodes []string, excluded map[string]string) cluster.BundleSummary {
	sum, _ := machine.SummarizeGated(rep, view, self, nodes, excluded)
	return sum
}

// followBundle reads the active bundle's resource and writes this node's
// part of it: what it read goes to the loop as one event (EvCluster:
// approvals, sources, the bundle's policy), the report to
// the status, an Event for each new phase. It reads when the API's watch
// sees a change, when this node's report changes, at each resync, and
// after a failure with backoff.
func (a *Agent) followBundle(ctx context.Context, api ClusterAPI) {
	var written bundleWritten
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
		// One reading of the watched list, one event for the loop.
		var read machine.EvCluster
		a.readApprovals(ctx, api, &approved, &approvalsErr, &read)
		if err := a.readSources(ctx, api, &sources, &nodes, &read); err != nil {
			if approvalsErr == "" && ctx.Err() == nil {
				a.log.Warn("cannot read the cluster's UpgradeBundles for registry sources; trying again", "err", err)
			}
			approvalsErr = err.Error()
		}
		err := error(nil)
		rep := a.snap.Load().bundle
		var own bundleRead
		if rep != nil {
			own, err = a.readBundle(ctx, api, rep, &nodes, &read)
		} else {
			api.FollowEntries(false) // no summary of its own to write
		}
		// The loop has the reading before this node writes its part.
		if read != (machine.EvCluster{}) {
			a.post(read)
		}
		if rep != nil {
			if err == nil {
				err = a.writeBundle(ctx, api, rep, own, &written, lastPhase)
			}
			if err == nil {
				err = a.warnStrays(ctx, api, rep, approved, strays)
			}
			if err != nil && err.Error() != lastErr && ctx.Err() == nil {
				a.log.Warn("cannot sync the UpgradeBundle resource; trying again", "bundle", rep.Name, "err", err)
			}
		}
		wait := a.resync()
		if !written.sumDue.IsZero() {
			wait = min(wait, max(time.Until(written.sumDue), 10*time.Millisecond))
		}
		if !nodes.wakeAt.IsZero() {
			wait = min(wait, max(time.Until(nodes.wakeAt), 10*time.Millisecond))
		}
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
// at each round, from the Follower's copy (the watch of the records).
type nodesRead struct {
	ready map[string]cluster.NodeReady
	// writerFor and writerSince: since when this node has been the
	// summary's writer by the rule for the UpgradeBundle writerFor
	// (takesTurn); wakeAt is when its turn comes (zero: none due).
	writerFor   string
	writerSince time.Time
	wakeAt      time.Time
}

// writerStagger is how long a node waits, for each ready node before it
// by name, before it writes a summary that no node before it writes:
// the first by name that reports on the bundle writes at once, and its
// record, saying so, reaches the others before their turn, so that one
// node, not every node, writes its record to say it reports (every node
// watches every record: N writes would be N events to each of N nodes).
const writerStagger = 5 * time.Second

// takesTurn tells whether this node, the summary's writer by the rule
// (summaryWriter), writes it now: at once when no ready node that the
// gate weighs comes before it by name (no node at all, when this one is
// not ready), else once it has been the writer for writerStagger per
// such node, in which time the record of an earlier node that reports on
// the bundle comes in.
func (n *nodesRead) takesTurn(name, self string, excluded map[string]string, now time.Time) bool {
	// The nodes before it in the rule's own order: the ready ones, or,
	// when it is not ready itself (none is: the rule then takes the first
	// of those known), every one.
	selfReady := n.ready[self].Ready
	rank := 0
	for m, r := range n.ready {
		if _, out := excluded[m]; !out && (r.Ready || !selfReady) && m < self {
			rank++
		}
	}
	if n.writerFor != name || n.writerSince.IsZero() {
		n.writerFor, n.writerSince = name, now
	}
	due := n.writerSince.Add(time.Duration(rank) * writerStagger)
	if now.Before(due) {
		n.wakeAt = due
		return false
	}
	n.wakeAt = time.Time{}
	return true
}

// notWriter forgets this node's time as the writer by the rule.
func (n *nodesRead) notWriter() { n.writerFor, n.writerSince, n.wakeAt = "", time.Time{}, time.Time{} }

// refresh reads the nodes' readiness again.
func (n *nodesRead) refresh(ctx context.Context, api BundleAPI) error {
	ready, err := api.NodeReadiness(ctx)
	if err != nil {
		n.ready = nil
		return err
	}
	n.ready = ready
	return nil
}

// bundleRead is the active bundle's UpgradeBundle as readBundle read it,
// for writeBundle.
type bundleRead struct {
	absent   bool // no UpgradeBundle of this name: the administrator creates it
	view     cluster.BundleView
	ready    map[string]cluster.NodeReady
	excluded map[string]string
	writer   bool // this node writes the summary (summaryWriter)
}

// readBundle reads the active bundle's UpgradeBundle (a node creates
// none) and the nodes' readiness; its policy goes into read.
func (a *Agent) readBundle(ctx context.Context, api ClusterAPI, rep *machine.BundleReport, nodes *nodesRead, read *machine.EvCluster) (bundleRead, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	view, ok, err := api.UpgradeBundle(cctx, rep.Name)
	if err != nil {
		return bundleRead{}, err
	}
	if !ok {
		// None yet (or no CRD): the node's config is the policy, and the
		// node reports on its own Node, until the administrator creates
		// it (absent.go).
		read.Policy = &machine.PolicyRead{Name: rep.Name}
		return bundleRead{absent: true}, nil
	}
	if err := nodes.refresh(cctx, api); err != nil {
		return bundleRead{}, err
	}
	ready := nodes.ready
	excluded := excludedNodes(view.Policy, ready, a.deps.Now(), a.cfg.NodeName)
	// Only the summary's writer follows every node's entry.
	writer := summaryWriter(rep.Name, ready, excluded, a.cfg.NodeName) == a.cfg.NodeName
	if !writer {
		nodes.notWriter()
	} else if r, ok := ready[a.cfg.NodeName]; !ok || r.Reports != rep.Name {
		// Its record does not say it reports on the bundle yet: its turn
		// comes after the nodes before it (it says so as it first writes).
		writer = nodes.takesTurn(rep.Name, a.cfg.NodeName, excluded, a.deps.Now())
	}
	api.FollowEntries(writer)
	if writer {
		if view, ok, err = api.UpgradeBundle(cctx, rep.Name); err != nil || !ok {
			return bundleRead{}, cmp.Or(err, fmt.Errorf("upgradebundle %s: gone while read", rep.Name))
		}
	}
	var hosts map[string]string
	if len(excluded) > 0 {
		if hosts, err = api.NodeAddresses(cctx); err != nil {
			return bundleRead{}, err
		}
	}
	read.Policy = &machine.PolicyRead{Name: rep.Name, Policy: view.Policy, Generation: view.Generation, Excluded: excluded, Hosts: hosts}
	return bundleRead{view: view, ready: ready, excluded: excluded, writer: writer}, nil
}

// writeBundle writes this node's entry of the active bundle's
// UpgradeBundle (and the summary, when this node is its writer), and an
// Event for each phase the record reached.
// bundleWritten is what this node last wrote of the active bundle.
type bundleWritten struct {
	name  string
	entry cluster.BundleNodeEntry
	at    time.Time // the entry's write
	// The summary, when this node wrote it last (as its writer): when,
	// and when a change held back (summaryEvery) is due.
	sum           cluster.BundleSummary
	wroteSum      bool
	sumAt, sumDue time.Time
}

// summaryEvery bounds how often the summary's writer rewrites it for a
// change of its counts and words alone (nodesReady, behind, a
// condition's message): every node watches the UpgradeBundle, and as
// many nodes as the cluster has move one after another. A change of
// phase, approval, digest or of a condition's status or reason is
// written at once.
const summaryEvery = 10 * time.Second

// summaryNews tells whether b says something a says not, beyond its
// counts and words: what summaryEvery does not hold back.
func summaryNews(a, b cluster.BundleSummary) bool {
	if a.Version != b.Version || a.Arch != b.Arch || a.Release != b.Release || a.Digest != b.Digest || a.Size != b.Size || a.Images != b.Images ||
		a.Phase != b.Phase || a.Approved != b.Approved || a.ObservedGeneration != b.ObservedGeneration ||
		!slices.Equal(a.Warnings, b.Warnings) || !slices.Equal(a.Excluded, b.Excluded) || len(a.Conditions) != len(b.Conditions) {
		return true
	}
	for i, c := range a.Conditions {
		d := b.Conditions[i]
		if c.Type != d.Type || c.Status != d.Status || c.Reason != d.Reason || c.ObservedGeneration != d.ObservedGeneration {
			return true
		}
	}
	return false
}

func (a *Agent) writeBundle(ctx context.Context, api ClusterAPI, rep *machine.BundleReport, own bundleRead, written *bundleWritten, lastPhase map[string]string) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if own.absent {
		written.name = "" // written again in full once it exists
		return a.reportWithoutResource(cctx, api, rep, lastPhase)
	}
	view, ready, excluded := own.view, own.ready, own.excluded
	entry := rep.Entry
	entry.Excluded = excluded[a.cfg.NodeName]
	rep2 := *rep
	rep2.Entry = entry
	// Each node writes its own entry; the summary, derived from every
	// entry, has one writer, so that no node's write changes what another
	// wrote (summaryWriter).
	var sum cluster.BundleSummary
	var sump *cluster.BundleSummary
	if own.writer {
		known := make([]string, 0, len(ready)) // not nil: no record, no node
		for n := range ready {
			known = append(known, n)
		}
		var gated map[string]cluster.BundleNodeEntry
		sum, gated = machine.SummarizeGated(&rep2, view, a.cfg.NodeName, known, excluded)
		machine.SummaryConditions(&sum, &rep2, view, gated, a.deps.Now())
		sump = &sum
	}
	same := written.name == rep.Name
	entryChanged := !same || !reflect.DeepEqual(written.entry, entry)
	if entryChanged && same && holdOnly(written.entry, entry) && time.Since(written.at) < a.resync() {
		entryChanged = false // pacing's hold alone: at most once a resync, not with every reading
	}
	var sumOut *cluster.BundleSummary
	written.sumDue = time.Time{}
	switch {
	case sump == nil:
		written.wroteSum = false // another node writes it now
	case !same || !written.wroteSum || summaryNews(written.sum, sum) || !reflect.DeepEqual(written.sum, sum) && time.Since(written.sumAt) >= summaryEvery:
		sumOut = sump
	case !reflect.DeepEqual(written.sum, sum):
		written.sumDue = written.sumAt.Add(summaryEvery) // its counts alone: held back
	}
	if entryChanged || sumOut != nil {
		if err := api.PublishBundle(cctx, rep.Name, sumOut, a.cfg.NodeName, entry); err != nil {
			return err
		}
		written.name, written.entry, written.at = rep.Name, entry, time.Now()
		if sumOut != nil {
			written.sum, written.wroteSum, written.sumAt = sum, true, time.Now()
			if err := a.approvalEvent(cctx, api, rep.Name, view, sum); err != nil {
				return err
			}
		}
	}
	return a.phaseEvents(cctx, api, rep, view.UID, entry.Phase, lastPhase)
}

// phaseEvents records one Event per phase the record reached, in order,
// those passed between two polls too; the newest (current) says the
// status line. uid is the resource's ("" while it does not exist).
func (a *Agent) phaseEvents(cctx context.Context, api BundleAPI, rep *machine.BundleReport, uid, current string, lastPhase map[string]string) error {
	for _, p := range rep.Phases {
		key := rep.Name + "/" + string(p.Phase) + "/" + p.At.String()
		if lastPhase[key] != "" {
			continue
		}
		typ, msg := "Normal", fmt.Sprintf("%s: %s at %s", a.cfg.NodeName, p.Phase, p.At.UTC().Format(time.RFC3339))
		if string(p.Phase) == current {
			msg = fmt.Sprintf("%s: %s", a.cfg.NodeName, rep.Line)
			if !rep.Healthy {
				typ = "Warning"
			}
		}
		if err := api.BundleEvent(cctx, rep.Name, uid, a.cfg.NodeName, typ, machine.PhaseReason(p.Phase), machine.SanitizeReason(msg)); err != nil {
			return err
		}
		lastPhase[key] = "sent"
	}
	return nil
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

// readApprovals keeps the loop's view of the cluster's approvals: every
// UpgradeBundle's spec.approvedDigest, as the API's watch last saw them.
func (a *Agent) readApprovals(ctx context.Context, api BundleAPI, last *[]cluster.Approval, lastErr *string, read *machine.EvCluster) {
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
		read.Approvals = &machine.ApprovalsRead{Approvals: norm}
	}
}

// warnStrays records a Warning Event, once per resource and digest, for
// each UpgradeBundle other than the active bundle's own that approves its
// digest: on that resource (where the administrator wrote it) and on the
// bundle's own, naming the one that counts.
func (a *Agent) warnStrays(ctx context.Context, api BundleAPI, rep *machine.BundleReport, approvals []cluster.Approval, sent map[string]bool) error {
	for _, stray := range machine.StrayApprovals(approvals, rep.Name, rep.Entry.Digest) {
		key := stray + "/" + string(rep.Entry.Digest)
		if sent[key] {
			continue
		}
		msg := machine.SanitizeReason(a.cfg.NodeName + ": " + machine.StrayMessage(stray, rep.Name, rep.Entry.Digest))
		a.log.Warn("an UpgradeBundle that is not the bundle's own approves its digest: ignored", "resource", stray, "bundle", rep.Name)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := api.BundleEvent(cctx, stray, "", a.cfg.NodeName, "Warning", "ApprovalIgnored", msg)
		if err == nil {
			err = api.BundleEvent(cctx, rep.Name, "", a.cfg.NodeName, "Warning", "ApprovalIgnored", msg)
		}
		cancel()
		if err != nil {
			return err
		}
		sent[key] = true
	}
	return nil
}
