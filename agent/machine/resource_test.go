package machine

import (
	"strings"
	"testing"
)

// TestWaitingForApproval_WithAnAPINamesTheResourceNotThisNodesDigest:
// the administrator is told how to approve the bundle in its
// UpgradeBundle, with the engineer's digest, not handed this node's (a
// node's word can be forged) to paste; this node's is said as what it read.
func TestWaitingForApproval_WithAnAPINamesTheResourceNotThisNodesDigest(t *testing.T) {
	m := machineIn(t, PhaseExtracted)
	m.HasAPI = true
	why := m.WaitingForApproval(m.Records["held"])
	if !strings.Contains(why, "oc patch upgradebundle 4.13.7-x86-64") || !strings.Contains(why, `"approvedDigest":"<the engineer's digest>"`) ||
		!strings.Contains(why, "this node read "+heldDigest) || strings.Contains(why, `"approvedDigest":"`+heldDigest) {
		t.Fatalf("waiting for approval: %q", why)
	}
}

// TestResourceReport_ExcludedNodesAreNotWaitedFor: a node the machine
// config operator counts without a record, excluded by name, is not waited
// for.
func TestResourceReport_ExcludedNodesAreNotWaitedFor(t *testing.T) {
	m := machineIn(t, PhaseLoaded)
	m.Recorded, m.Unrecorded = []string{"b", "node-a"}, 1
	m.Excluded = map[string]string{"c": "listed in spec.excludedNodes"}
	if rep := m.ResourceReport(m.NodeStatus()); rep.Unrecorded != 0 {
		t.Errorf("the third node excluded by name: %d unrecorded waited for, want 0", rep.Unrecorded)
	}
}
