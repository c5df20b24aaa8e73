package agent

import (
	"fmt"
	"github.com/ferry-edge/ferry/agent/machine"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle/bundletest"
	"github.com/ferry-edge/ferry/cluster"
)

const resourceName = "4.13.7-x86-64"

func TestResourceName_IsAKubernetesName(t *testing.T) {
	for in, want := range map[[2]string]string{{"4.13.7", "x86_64"}: "4.13.7-x86-64", {"4.14.0-rc.1", "aarch64"}: "4.14.0-rc.1-aarch64", {"4.13.7+Build", "s390x"}: "4.13.7-build-s390x"} {
		if got := machine.ResourceName(in[0], in[1]); got != want {
			t.Errorf("ResourceName%v = %q, want %q", in, got, want)
		}
	}
}

func TestResource_ANodeReportsEachPhaseWithConditionsEventsAndLabel(t *testing.T) {
	h, api := apiHarness(t)
	api.create(resourceName)
	h.start()
	src, digest := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	h.waitPhase(machine.PhaseClusterReady)
	var b fakeBundle
	h.waitFor("the resource to say loaded", func() bool {
		var ok bool
		b, ok = api.bundle(resourceName)
		return ok && b.nodes["node-a"].Phase == string(machine.PhaseClusterReady)
	})
	e := b.nodes["node-a"]
	if e.Digest != digest || b.sum.Version != "4.13.7" || b.sum.Digest != digest || b.sum.NodesReady != "1/1" || b.sum.Phase != string(machine.PhaseClusterReady) {
		t.Fatalf("resource %+v", b)
	}
	for _, c := range e.Conditions {
		if want := map[string]string{"Extracted": "True", "Loaded": "True", "Updated": "False"}[c.Type]; c.Status != want {
			t.Errorf("condition %+v, want %s", c, want)
		}
	}
	if b.policy.ApprovedDigest != "" {
		t.Errorf("ferry wrote a spec: %+v", b.policy)
	}
	// The label and the Events are written on their own, after the
	// entry: wait for them. An Event per phase reached, Normal (a
	// refusal's is a Warning: the reducer's table, "an unreadable bundle
	// is rejected").
	h.waitFor("the label and an Event per phase", func() bool {
		api.mu.Lock()
		defer api.mu.Unlock()
		events := strings.Join(api.events, "\n")
		return api.labels["node-a"][LabelPhase] == string(machine.PhaseClusterReady) &&
			strings.Contains(events, "Normal/ClusterReady/node-a:") && strings.Contains(events, "Normal/Extracted/node-a:") &&
			strings.Contains(events, "Normal/Loaded/node-a:")
	})
}

func TestResource_ApprovedInTheSpecLoadsWithNoRestart(t *testing.T) {
	h, api := apiHarness(t)
	h.cfg.Approval = "required"
	api.create(resourceName)
	h.start()
	src, digest := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	// What it says while it waits is the reducer's (its table, and
	// TestWaitingForApproval_WithAnAPINamesTheResourceNotThisNodesDigest);
	// here, that the spec's approval reaches the loop through the API.
	h.waitFor("the resource to say waiting", func() bool {
		b, ok := api.bundle(resourceName)
		return ok && b.sum.Approved == machine.ApprovedWaiting && h.record().Condition.Reason == machine.ReasonAwaitingApproval
	})
	loads := h.loads()
	if loads != 0 {
		t.Fatal("an unapproved bundle was loaded")
	}
	api.setPolicy(resourceName, cluster.BundlePolicy{ApprovedDigest: string(digest)})
	h.waitPhase(machine.PhaseClusterReady)
	h.waitFor("the resource to say approved", func() bool {
		b, _ := api.bundle(resourceName)
		return b.sum.Approved == "digest"
	})
}

// TestResource_AnApprovalInAnotherUpgradeBundleApprovesNothing (issue
// 45, item 1): the administrator wrote the approval and Manual in
// 4.13.7-amd64, not the bundle's own 4.13.7-x86-64: nothing is loaded,
// the node says which resource counts, and a Warning Event names it.
func TestResource_AnApprovalInAnotherUpgradeBundleApprovesNothing(t *testing.T) {
	h, api := apiHarness(t)
	h.cfg.Approval = "required"
	h.start()
	src, digest := stick(t, bundletest.Options{})
	api.create(resourceName)
	api.setPolicy("4.13.7-amd64", cluster.BundlePolicy{ApprovedDigest: string(digest), Schedule: "Manual"})
	h.plug("/dev/sda", src)
	h.waitFor("a Warning Event naming the resource that counts", func() bool {
		api.mu.Lock()
		defer api.mu.Unlock()
		return slices.ContainsFunc(api.events, func(e string) bool {
			return strings.HasPrefix(e, "Warning/ApprovalIgnored/node-a: UpgradeBundle 4.13.7-amd64 approves") && strings.Contains(e, "from UpgradeBundle "+resourceName+" only")
		})
	})
	h.waitFor("the node to say so while it waits", func() bool {
		c := h.record().Condition
		return c.Reason == machine.ReasonAwaitingApproval && strings.Contains(c.Message, "4.13.7-amd64") // names the stray resource
	})
	h.waitFor("the summary's warnings to say so", func() bool {
		b, _ := api.bundle(resourceName)
		return len(b.sum.Warnings) > 0 && strings.HasPrefix(b.sum.Warnings[0], "UpgradeBundle 4.13.7-amd64 approves")
	})
	if b, ok := api.bundle(resourceName); !ok || b.policy.ApprovedDigest != "" {
		t.Errorf("the bundle's own resource: %+v, %v", b, ok)
	}
	if h.loads() != 0 {
		t.Fatal("a bundle approved only in another UpgradeBundle was loaded")
	}
}

// TestResource_WithoutItTheNodeCreatesNoneAndReportsOnItsNode: no
// UpgradeBundle exists (the administrator has created none): the node
// creates none, goes on as its own config says, and says each phase on
// its Node's label and in Events about the bundle's name; once the
// administrator creates the resource, the node writes its entry there.
func TestResource_WithoutItTheNodeCreatesNoneAndReportsOnItsNode(t *testing.T) {
	h, api := apiHarness(t)
	h.start()
	src, digest := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	h.waitPhase(PhaseClusterReady)
	h.waitFor("the Node's label and the Events to say so", func() bool {
		api.mu.Lock()
		defer api.mu.Unlock()
		events := strings.Join(api.events, "\n")
		return api.labels["node-a"][LabelPhase] == string(PhaseClusterReady) && strings.Contains(events, "Normal/Extracted/node-a:") &&
			strings.Contains(events, "Normal/ClusterReady/node-a:")
	})
	if _, ok := api.bundle(resourceName); ok {
		t.Fatal("the node created the UpgradeBundle")
	}
	api.create(resourceName)
	h.waitFor("the node's entry in the resource the administrator created", func() bool {
		b, ok := api.bundle(resourceName)
		return ok && b.nodes["node-a"].Phase == string(PhaseClusterReady) && b.nodes["node-a"].Digest == digest
	})
}

func TestSummarize_UpgradedNodesCountAsReady(t *testing.T) {
	const d = "sha256:aa"
	rep := &machine.BundleReport{Entry: cluster.BundleNodeEntry{Phase: string(machine.PhaseUpgraded), Digest: d}}
	view := cluster.BundleView{Nodes: map[string]cluster.BundleNodeEntry{
		"b": {Phase: string(machine.PhaseUpgrading), Digest: d},
		"c": {Phase: string(machine.PhaseExtracted), Digest: d},
		"d": {Phase: string(machine.PhaseCleaned), Digest: d},
	}}
	sum := summarize(rep, view, "a", []string{"a", "b", "c", "d", "e"}, map[string]string{"e": "listed in spec.excludedNodes"})
	if sum.NodesReady != "2/4" || sum.Phase != string(machine.PhaseExtracted) || !slices.Equal(sum.Excluded, []string{"e: listed in spec.excludedNodes"}) {
		t.Fatalf("summary %+v", sum)
	}
}

// TestSummary_AnEntryWithNoRecordIsNoNode: an entry of a name with no
// Lease (its Node deleted, or a name someone made up) neither writes the
// summary nor counts as a node; the first by name of the nodes with a
// record and an entry writes it.
func TestSummary_AnEntryWithNoRecordIsNoNode(t *testing.T) {
	const d = "sha256:aa"
	loaded := cluster.BundleNodeEntry{Phase: string(machine.PhaseLoaded), Digest: d}
	view := cluster.BundleView{Nodes: map[string]cluster.BundleNodeEntry{"a-deleted": loaded, "b": loaded, "c": loaded}}
	ready := map[string]cluster.NodeReady{"b": {Ready: true, Reports: "x"}, "c": {Ready: true, Reports: "x"}}
	if w := summaryWriter("x", ready, nil, "c"); w != "b" {
		t.Errorf("summary writer %q, want b (a-deleted has no record)", w)
	}
	if w := summaryWriter("x", map[string]cluster.NodeReady{}, nil, "c"); w != "c" {
		t.Errorf("with no records, summary writer %q, want c itself", w)
	}
	rep := &machine.BundleReport{Entry: loaded}
	if sum := summarize(rep, view, "c", []string{"b", "c"}, nil); sum.NodesReady != "2/2" {
		t.Errorf("nodes ready %q, want 2/2 (a-deleted is no node)", sum.NodesReady)
	}
	view.Nodes["a-deleted"] = cluster.BundleNodeEntry{Phase: string(machine.PhaseLoaded), Digest: "sha256:bb"}
	if sum := summarize(rep, view, "c", []string{"b", "c"}, nil); sum.Approved != machine.ApprovedDisagree {
		t.Errorf("a recordless entry's other digest is still said loudly: %+v", sum)
	}
}

func TestSummarize_FitsTheCRDsBounds(t *testing.T) {
	rep := &machine.BundleReport{Sum: cluster.BundleSummary{Warnings: machine.BoundList(slices.Repeat([]string{strings.Repeat("w", 4096)}, 40), machine.MaxSummaryWarnings)}}
	excluded := map[string]string{}
	for i := range 300 {
		excluded[fmt.Sprintf("node-%03d", i)] = "listed in spec.excludedNodes"
	}
	sum := summarize(rep, cluster.BundleView{}, "a", nil, excluded)
	if len(sum.Warnings) != machine.MaxSummaryWarnings || !strings.HasPrefix(sum.Warnings[machine.MaxSummaryWarnings-1], "… and 25 more") {
		t.Errorf("warnings: %d, last %q", len(sum.Warnings), sum.Warnings[len(sum.Warnings)-1])
	}
	for _, w := range sum.Warnings {
		if len(w) > machine.MaxReason {
			t.Errorf("a warning of %d bytes", len(w))
		}
	}
	if len(sum.Excluded) != machine.MaxSummaryExcluded || sum.Excluded[0] != "node-000: listed in spec.excludedNodes" || !strings.HasPrefix(sum.Excluded[machine.MaxSummaryExcluded-1], "… and 45 more") {
		t.Errorf("excluded: %d, first %q, last %q", len(sum.Excluded), sum.Excluded[0], sum.Excluded[len(sum.Excluded)-1])
	}
	if got := machine.BoundList(nil, 3); got != nil {
		t.Errorf("boundList(nil) = %q", got)
	}
}

func TestSummarize_DisagreeingDigestsAreShownLoudly(t *testing.T) {
	const own, other = "sha256:aa", "sha256:ff"
	rep := &machine.BundleReport{Sum: cluster.BundleSummary{Digest: own, Approved: "digest", Warnings: []string{"paused pool"}}, Entry: cluster.BundleNodeEntry{Phase: string(machine.PhaseLoaded), Digest: own}}
	view := cluster.BundleView{Nodes: map[string]cluster.BundleNodeEntry{"b": {Phase: string(machine.PhaseLoaded), Digest: own}, "c": {Phase: string(machine.PhaseExtracted), Digest: other}, "d": {Phase: string(machine.PhaseFetching)}}}
	sum := summarize(rep, view, "a", nil, nil)
	if sum.Digest != "" || sum.Approved != machine.ApprovedDisagree || sum.NodesReady != "2/4" || len(sum.Warnings) != 2 ||
		sum.Warnings[0] != "the nodes read different digests for this bundle (sha256:aa: a, b; sha256:ff: c): approve only the digest the engineer gave you (the bundle's .sha256 file), and find out why a node reads another" {
		t.Fatalf("summary %+v", sum)
	}
	delete(view.Nodes, "c")
	if sum := summarize(rep, view, "a", nil, nil); sum.Digest != own || sum.Approved != "digest" || len(sum.Warnings) != 1 {
		t.Fatalf("agreeing: %+v", sum)
	}
}

// TestExcludedNodes_ListedOrNotReadyTooLong: the gate leaves out the
// nodes spec.excludedNodes lists and, with spec.notReadyTimeout, those
// NotReady for longer; never this node, nor one NotReady for less.
func TestExcludedNodes_ListedOrNotReadyTooLong(t *testing.T) {
	now := time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC)
	ready := map[string]cluster.NodeReady{"node-a": {Ready: false, Since: now.Add(-time.Hour)}, "b": {Ready: false, Since: now.Add(-time.Hour)},
		"c": {Ready: false, Since: now.Add(-30 * time.Second)}, "d": {Ready: true}}
	if got := excludedNodes(cluster.BundlePolicy{ExcludedNodes: []string{"d"}}, ready, now, "node-a"); len(got) != 1 || got["d"] == "" {
		t.Errorf("listed: %v", got)
	}
	got := excludedNodes(cluster.BundlePolicy{NotReadyTimeout: time.Minute}, ready, now, "node-a")
	if len(got) != 1 || !strings.Contains(got["b"], "spec.notReadyTimeout") {
		t.Errorf("NotReady too long: %v", got)
	}
}

// TestSummarize_NodesWithoutFerryAreWaitedFor: the nodes the machine
// config operator counts with no record (not excluded) are in nodesReady's
// total, never ready (a larger total is what the admission policy allows).
func TestSummarize_NodesWithoutFerryAreWaitedFor(t *testing.T) {
	const d = "sha256:aa"
	loaded := cluster.BundleNodeEntry{Phase: string(machine.PhaseLoaded), Digest: d}
	rep := &machine.BundleReport{Entry: loaded, Unrecorded: 1}
	view := cluster.BundleView{Nodes: map[string]cluster.BundleNodeEntry{"b": loaded}}
	if sum := summarize(rep, view, "a", []string{"a", "b"}, nil); sum.NodesReady != "2/3" {
		t.Errorf("3 machines, 2 with ferry, both loaded: nodesReady %q, want 2/3", sum.NodesReady)
	}
}
