package machine

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
	rep := &BundleReport{Entry: self, Healthy: true, Sum: cluster.BundleSummary{Approved: string(approved), Digest: self.Digest}}
	view.Nodes = map[string]cluster.BundleNodeEntry{"b": other}
	sum, gated := SummarizeGated(rep, view, "a", []string{"a", "b"}, nil)
	SummaryConditions(&sum, rep, view, gated, now)
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
	line := "loaded x.tar — " + ApprovalOffWarning + " — WARNING: cluster.kubeconfig skips the TLS check"
	if got := eventLine(line); got != "loaded x.tar" {
		t.Errorf("event line %q", got)
	}
	m := machineIn(t, PhaseLoaded)
	s := m.NodeStatus()
	s.ApprovalOff, s.Warnings = true, []string{"TLS check skipped"}
	rep := m.ResourceReport(s)
	if w := strings.Join(rep.Sum.Warnings, "|"); !strings.Contains(w, ApprovalOffWarning) || !strings.Contains(w, "TLS check skipped") {
		t.Errorf("summary warnings %q", rep.Sum.Warnings)
	}
	s.HoldingBack = "io pressure 23%"
	if rep := m.ResourceReport(s); !strings.HasSuffix(rep.Entry.Message, "holding back for io pressure: the node's other work stalls (pacing)") {
		t.Errorf("pacing's hold in the entry: %q", rep.Entry.Message)
	}
}

// TestSummaryConditions_AlwaysAReasonAndAMessage: the CRD requires both,
// as metav1.Condition does, even with every node left out of the gate
// and a node unhealthy with no words of its own.
func TestSummaryConditions_AlwaysAReasonAndAMessage(t *testing.T) {
	rep := &BundleReport{Entry: cluster.BundleNodeEntry{Phase: string(PhaseLoaded)}, Healthy: false}
	view := cluster.BundleView{Generation: 1, Nodes: map[string]cluster.BundleNodeEntry{}}
	sum, gated := SummarizeGated(rep, view, "a", []string{"a"}, map[string]string{"a": "listed in spec.excludedNodes"})
	SummaryConditions(&sum, rep, view, gated, time.Now())
	for _, c := range sum.Conditions {
		if c.Reason == "" || c.Message == "" {
			t.Errorf("condition %+v", c)
		}
	}
}
