package machine

import (
	"strings"
	"testing"
)

// TestWaitingForApproval_WithAnAPINamesTheCommandNotThisNodesDigest:
// the administrator is told the one command that approves the bundle
// whether or not its UpgradeBundle exists (ferry approve, which creates
// it: a node creates none), with the engineer's file, not handed this
// node's digest (a node's word can be forged) to paste; this node's is
// said as what it read.
func TestWaitingForApproval_WithAnAPINamesTheCommandNotThisNodesDigest(t *testing.T) {
	m := machineIn(t, PhaseExtracted)
	m.HasAPI = true
	why := m.WaitingForApproval(m.Records["held"])
	if !strings.Contains(why, "ferry approve upgrade-4.13.7-x86_64.sha256 with the engineer's file") || !strings.Contains(why, "creates UpgradeBundle 4.13.7-x86-64") ||
		!strings.Contains(why, "this node read "+heldDigest) || strings.Contains(why, "approve "+heldDigest) {
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
