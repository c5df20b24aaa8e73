package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
)

// conditionsFor decides the resource's conditions of a two-node cluster
// (self a, b) from the entries given, with spec view.
func conditionsFor(t *testing.T, self, other cluster.BundleNodeEntry, approved bundle.Approval, view cluster.BundleView, now time.Time) (cluster.BundleSummary, map[string]cluster.BundleCondition) {
	t.Helper()
	rep := &bundleReport{entry: self, healthy: true, sum: cluster.BundleSummary{Approved: string(approved), Digest: self.Digest}}
	view.Nodes = map[string]cluster.BundleNodeEntry{"b": other}
	sum, gated := summarizeGated(rep, view, "a", []string{"a", "b"}, nil)
	summaryConditions(&sum, rep, view, gated, now)
	by := map[string]cluster.BundleCondition{}
	for _, c := range sum.Conditions {
		if c.ObservedGeneration != view.Generation || c.Reason == "" || c.Message == "" || c.Since.IsZero() {
			t.Errorf("condition %+v: want observedGeneration %d, a reason, a message and a time", c, view.Generation)
		}
		by[c.Type] = c
	}
	if len(by) != 5 || sum.ObservedGeneration != view.Generation {
		t.Fatalf("conditions %+v, observedGeneration %d", sum.Conditions, sum.ObservedGeneration)
	}
	return sum, by
}

func TestSummaryConditions_FollowTheBundleToItsEnd(t *testing.T) {
	const d = "sha256:" + "aa"
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	at := func(p Phase) cluster.BundleNodeEntry { return cluster.BundleNodeEntry{Phase: string(p), Digest: d} }
	view := cluster.BundleView{Generation: 3}

	sum, c := conditionsFor(t, at(PhaseExtracted), at(PhaseExtracted), bundle.ApprovalNone, view, now)
	if c[CondApproved].Status != "False" || c[CondApproved].Reason != ReasonAwaitingApproval || sum.Approved != ApprovedWaiting {
		t.Errorf("unapproved: %+v, approved %q", c[CondApproved], sum.Approved)
	}
	if c[CondLoaded].Status != "False" || !strings.Contains(c[CondLoaded].Message, "behind: a, b") || sum.Behind != "a, b" {
		t.Errorf("nothing loaded: %+v, behind %q", c[CondLoaded], sum.Behind)
	}

	_, c = conditionsFor(t, at(PhaseLoaded), at(PhaseLoading), bundle.ApprovalDigest, view, now)
	if c[CondApproved].Status != "True" || c[CondApproved].Reason != "ApprovedDigest" || c[CondLoaded].Status != "False" {
		t.Errorf("approved, one loaded: %+v %+v", c[CondApproved], c[CondLoaded])
	}

	view.Conditions = []cluster.BundleCondition{{Type: CondApproved, Status: "True", Since: now.Add(-time.Hour)}}
	_, c = conditionsFor(t, at(PhaseUpgrading), at(PhaseUpgrading), bundle.ApprovalDigest, view, now)
	if c[CondLoaded].Status != "True" || c[CondUpgrading].Status != "True" || c[CondUpgraded].Status != "False" {
		t.Errorf("upgrading: %+v", c)
	}
	if !c[CondApproved].Since.Equal(now.Add(-time.Hour)) || !c[CondLoaded].Since.Equal(now) {
		t.Errorf("a condition whose status stays keeps its time, one that moves takes now: %+v %+v", c[CondApproved], c[CondLoaded])
	}

	_, c = conditionsFor(t, at(PhaseUpgraded), at(PhaseUpgraded), bundle.ApprovalDigest, view, now)
	if c[CondUpgraded].Status != "True" || c[CondUpgrading].Status != "False" || c[CondDegraded].Status != "False" {
		t.Errorf("upgraded: %+v", c)
	}
}

// TestSummaryConditions_SayWhatBecameOfAnApproval: an approval of another
// digest and a refusal are said in the APPROVED column and the Approved
// condition, not left at "waiting for approval".
func TestSummaryConditions_SayWhatBecameOfAnApproval(t *testing.T) {
	const d = "sha256:" + "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	const other = "sha256:" + "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	now := time.Now()
	extracted := cluster.BundleNodeEntry{Phase: string(PhaseExtracted), Digest: d}

	sum, c := conditionsFor(t, extracted, extracted, bundle.ApprovalNone, cluster.BundleView{Generation: 2, Policy: cluster.BundlePolicy{ApprovedDigest: other}}, now)
	if sum.Approved != ApprovedOther || c[CondApproved].Reason != "OtherDigestApproved" || !strings.Contains(c[CondApproved].Message, "sha256:bbbbbbbbbbbb") {
		t.Errorf("another digest approved: %q %+v", sum.Approved, c[CondApproved])
	}

	rejected := cluster.BundleNodeEntry{Phase: string(PhaseRejected), Digest: d, Reason: "the bundle's sha256 does not match"}
	sum, c = conditionsFor(t, extracted, rejected, bundle.ApprovalNone, cluster.BundleView{Generation: 2}, now)
	if sum.Approved != ApprovedRejected || c[CondApproved].Reason != "Rejected" || !strings.Contains(c[CondApproved].Message, "refused on b: the bundle's sha256") {
		t.Errorf("rejected: %q %+v", sum.Approved, c[CondApproved])
	}
	if c[CondDegraded].Status != "True" || c[CondDegraded].Reason != "Rejected" {
		t.Errorf("a refusal degrades the bundle: %+v", c[CondDegraded])
	}
}

// TestEventLine_WarningsSaidOnceNotInEveryEvent: the node's standing
// warnings go to the summary's warnings, not into each Event's line.
func TestEventLine_WarningsSaidOnceNotInEveryEvent(t *testing.T) {
	line := "loaded x.tar — " + approvalOffWarning + " — WARNING: cluster.kubeconfig skips the TLS check"
	if got := eventLine(line); got != "loaded x.tar" {
		t.Errorf("event line %q", got)
	}
	m := machineIn(t, PhaseLoaded)
	s := m.status()
	s.ApprovalOff, s.Warnings = true, []string{"TLS check skipped"}
	rep := m.resourceReport(s)
	if w := strings.Join(rep.sum.Warnings, "|"); !strings.Contains(w, approvalOffWarning) || !strings.Contains(w, "TLS check skipped") {
		t.Errorf("summary warnings %q", rep.sum.Warnings)
	}
	s.HoldingBack = "io pressure 23%"
	if rep := m.resourceReport(s); !strings.HasSuffix(rep.entry.Message, "holding back for io pressure: the node's other work stalls (pacing)") {
		t.Errorf("pacing's hold in the entry: %q", rep.entry.Message)
	}
}

// TestAnnotations_PacingsHoldIsInTheNodesReasonAsProgress: the Node's
// reason says that pacing holds the node's bulk work back, and the hold
// coming and going alone is written at the pace of progress, not at once.
func TestAnnotations_PacingsHoldIsInTheNodesReasonAsProgress(t *testing.T) {
	s := Status{Phase: string(PhaseLoading), Reason: ReasonLoading, Message: "loading 3 of 40 images", Healthy: true}
	plain := annotations(s)
	s.HoldingBack = "io pressure 31%"
	held := annotations(s)
	if want := "loading 3 of 40 images — holding back for io pressure: the node's other work stalls (pacing)"; held[AnnotationReason] != want {
		t.Errorf("reason %q, want %q", held[AnnotationReason], want)
	}
	if !onlyProgress(held, plain) || !onlyProgress(plain, held) {
		t.Error("the hold alone is written at once, not as progress")
	}
	s.Message = "loading 4 of 40 images"
	if onlyProgress(annotations(s), held) {
		t.Error("a change of the reason itself is taken for progress")
	}
}

// TestSummaryConditions_AlwaysAReasonAndAMessage: the CRD requires both,
// as metav1.Condition does, even with every node left out of the gate
// and a node unhealthy with no words of its own.
func TestSummaryConditions_AlwaysAReasonAndAMessage(t *testing.T) {
	rep := &bundleReport{entry: cluster.BundleNodeEntry{Phase: string(PhaseLoaded)}, healthy: false}
	view := cluster.BundleView{Generation: 1, Nodes: map[string]cluster.BundleNodeEntry{}}
	sum, gated := summarizeGated(rep, view, "a", []string{"a"}, map[string]string{"a": "listed in spec.excludedNodes"})
	summaryConditions(&sum, rep, view, gated, time.Now())
	for _, c := range sum.Conditions {
		if c.Reason == "" || c.Message == "" {
			t.Errorf("condition %+v", c)
		}
	}
}

func TestHoldOnly_TellsPacingsHoldFromAChange(t *testing.T) {
	e := cluster.BundleNodeEntry{Phase: string(PhaseLoading), Reason: "loading"}
	held := e
	held.Reason += heldBack("cpu pressure 91%")
	if !holdOnly(e, held) || !holdOnly(held, e) {
		t.Error("the hold alone is taken for a change")
	}
	moved := held
	moved.Phase = string(PhaseLoaded)
	if holdOnly(e, moved) {
		t.Error("a phase change is taken for the hold alone")
	}
}

// TestSummaryWriter_EveryNodePicksTheSameOneReadyOrNot: a node is held to
// the rule it holds the others to, so that two nodes never both write:
// with neither ready each picks the first by name of those known, with
// one ready each picks that one.
func TestSummaryWriter_EveryNodePicksTheSameOneReadyOrNot(t *testing.T) {
	entry := cluster.BundleNodeEntry{Phase: string(PhaseExtracted)}
	view := cluster.BundleView{Nodes: map[string]cluster.BundleNodeEntry{"a": entry, "b": entry}}
	for _, tc := range []struct {
		ready map[string]cluster.NodeReady
		want  string
	}{
		{map[string]cluster.NodeReady{"a": {}, "b": {}}, "a"},
		{map[string]cluster.NodeReady{"a": {}, "b": {Ready: true}}, "b"},
		{map[string]cluster.NodeReady{"a": {Ready: true}, "b": {Ready: true}}, "a"},
	} {
		for _, self := range []string{"a", "b"} {
			if w := summaryWriter(view, tc.ready, nil, self); w != tc.want {
				t.Errorf("readiness %v, as %s: writer %s, want %s", tc.ready, self, w, tc.want)
			}
		}
	}
}

// TestNodesRead_ReadAgainOnceForANodeItDoesNotKnow: an entry of a node
// the last reading does not know has the readiness read again, once for
// those names (a deleted Node's entry costs one reading, not one a sync).
func TestNodesRead_ReadAgainOnceForANodeItDoesNotKnow(t *testing.T) {
	entry := cluster.BundleNodeEntry{Phase: string(PhaseExtracted)}
	view := cluster.BundleView{Nodes: map[string]cluster.BundleNodeEntry{"a": entry, "c": entry}}
	n := nodesRead{ready: map[string]cluster.NodeReady{"b": {}}, at: time.Now()}
	if u := n.unheard(view, "b"); u != "a" {
		t.Fatalf("unheard %q, want a (c comes after b: never its writer)", u)
	}
	n.readAgainFor(n.unheard(view, "b"))
	if n.ready != nil {
		t.Fatal("not read again for a")
	}
	n.ready = map[string]cluster.NodeReady{"b": {}} // a has no record still
	n.readAgainFor(n.unheard(view, "b"))
	if n.ready == nil {
		t.Error("read again for the same names")
	}
}
