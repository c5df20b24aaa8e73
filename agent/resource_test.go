package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle/bundletest"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/peer"
)

const resourceName = "4.13.7-x86-64"

func TestResourceName_IsAKubernetesName(t *testing.T) {
	for in, want := range map[[2]string]string{{"4.13.7", "x86_64"}: "4.13.7-x86-64", {"4.14.0-rc.1", "aarch64"}: "4.14.0-rc.1-aarch64", {"4.13.7+Build", "s390x"}: "4.13.7-build-s390x"} {
		if got := ResourceName(in[0], in[1]); got != want {
			t.Errorf("ResourceName%v = %q, want %q", in, got, want)
		}
	}
}

func TestResource_ANodeCreatesItAndReportsEachPhaseWithConditionsEventsAndLabel(t *testing.T) {
	h, api := apiHarness(t)
	h.start()
	src, digest := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	h.waitPhase(PhaseClusterReady)
	var b fakeBundle
	h.waitFor("the resource to say loaded", func() bool {
		var ok bool
		b, ok = api.bundle(resourceName)
		return ok && b.nodes["node-a"].Phase == string(PhaseClusterReady)
	})
	e := b.nodes["node-a"]
	if e.Digest != digest || b.sum.Version != "4.13.7" || b.sum.Digest != digest || b.sum.NodesReady != "1/1" || b.sum.Phase != string(PhaseClusterReady) {
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
	api.mu.Lock()
	label, events := api.labels["node-a"][LabelPhase], strings.Join(api.events, "\n")
	api.mu.Unlock()
	if label != string(PhaseClusterReady) {
		t.Errorf("label %s=%q", LabelPhase, label)
	}
	if !strings.Contains(events, "Normal/ClusterReady/node-a:") || !strings.Contains(events, "Normal/Extracted/node-a: extracted at") ||
		!strings.Contains(events, "Normal/Loaded/node-a: loaded at") {
		t.Errorf("events:\n%s", events)
	}
}

func TestResource_ARefusalIsAWarningEvent(t *testing.T) {
	h, api := apiHarness(t)
	api.pre = cluster.Preflight{Refusals: []string{"the cluster is at 4.13.7 already"}}
	h.start()
	src, _ := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	h.waitPhase(PhaseRejected)
	h.waitFor("a Warning event", func() bool {
		api.mu.Lock()
		defer api.mu.Unlock()
		return strings.Contains(strings.Join(api.events, "\n"), "Warning/Rejected/node-a: rejected")
	})
}

func TestResource_TheGateLeavesOutExcludedAndLongNotReadyNodes(t *testing.T) {
	for _, c := range []struct {
		name   string
		policy cluster.BundlePolicy
		ready  map[string]cluster.NodeReady
	}{
		{"excludedNodes", cluster.BundlePolicy{ExcludedNodes: []string{"b"}}, nil},
		{"notReadyTimeout", cluster.BundlePolicy{NotReadyTimeout: time.Minute},
			map[string]cluster.NodeReady{"node-a": {Ready: true}, "b": {Ready: false, Since: time.Date(2026, 11, 22, 7, 0, 0, 0, time.UTC)}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, p := clusterHarness(t)
			api := newFakeAPI()
			api.addrs = map[string]string{"node-a": "10.0.0.1", "b": "10.0.0.2"}
			api.readiness = c.ready
			h.api = api
			h.start()
			src, digest := stick(t, bundletest.Options{})
			p.mu.Lock()
			p.statuses["10.0.0.2:8090"] = peer.PeerStatus{Err: errors.New("connection refused")} // b is gone
			p.mu.Unlock()
			h.plug("/dev/sda", src)
			h.waitReason("waiting for 10.0.0.2:8090 (unreachable)")
			h.waitPolls(p, 2)
			if s := h.agent.Status(); s.Phase != string(PhaseExtracted) {
				t.Fatalf("went on without b before the administrator said so: %+v", s)
			}
			api.setPolicy(resourceName, c.policy)
			h.waitPhase(PhaseClusterReady)
			h.waitFor("the summary leaving b out", func() bool {
				b, _ := api.bundle(resourceName)
				return b.sum.NodesReady == "1/1" && b.nodes["node-a"].Digest == digest
			})
		})
	}
}

func TestResource_ManualScheduleAndProceedFromTheSpec(t *testing.T) {
	h, api := apiHarness(t)
	h.start()
	api.setPolicy(resourceName, cluster.BundlePolicy{Schedule: "Manual"})
	src, _ := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	h.waitPhase(PhaseClusterReady)
	h.waitFor("the spec read", func() bool { return h.agent.Status().Bundles[0].Condition.Reason == "" })
	api.mu.Lock()
	asked := len(api.starts)
	api.mu.Unlock()
	if asked != 0 {
		t.Fatal("a Manual schedule in the spec asked for the upgrade by itself")
	}
	api.setPolicy(resourceName, cluster.BundlePolicy{Schedule: "Manual", Proceed: true})
	h.waitFor("the upgrade asked for after spec.proceed", func() bool { api.mu.Lock(); defer api.mu.Unlock(); return len(api.starts) == 1 })
}

func TestResource_ApprovedInTheSpecLoadsWithNoRestart(t *testing.T) {
	h, api := apiHarness(t)
	h.cfg.Approval = "required"
	h.start()
	src, digest := stick(t, bundletest.Options{})
	h.plug("/dev/sda", src)
	s := h.waitReason("waiting for approval: oc patch upgradebundle " + resourceName)
	if s.Phase != string(PhaseExtracted) || !strings.Contains(s.Reason, "this node read "+string(digest)) {
		t.Fatalf("status %+v", s)
	}
	// The administrator is told to approve the engineer's digest, not
	// handed this node's (a node's word can be forged) to paste.
	if !strings.Contains(s.Reason, `"approvedDigest":"<the engineer's digest>"`) || !strings.Contains(s.Reason, "from the engineer (the bundle's .sha256 file), not from this node") ||
		strings.Contains(s.Reason, `"approvedDigest":"`+string(digest)) {
		t.Fatalf("reason %q", s.Reason)
	}
	h.waitFor("the resource to say waiting", func() bool {
		b, ok := api.bundle(resourceName)
		return ok && b.sum.Approved == "waiting for approval"
	})
	loads := h.loads()
	if loads != 0 {
		t.Fatal("an unapproved bundle was loaded")
	}
	api.setPolicy(resourceName, cluster.BundlePolicy{ApprovedDigest: string(digest)})
	h.waitPhase(PhaseClusterReady)
	h.waitFor("the resource to say approved", func() bool {
		b, _ := api.bundle(resourceName)
		return b.sum.Approved == "digest"
	})
}

// TestResource_ASpecApprovingAnotherDigestIsNotOverriddenLocally: the
// node's config approves the bundle, but its UpgradeBundle approves
// another digest: the spec's choice holds (nothing loads) until the
// administrator names this bundle, then it loads with no restart.
func TestResource_ASpecApprovingAnotherDigestIsNotOverriddenLocally(t *testing.T) {
	h, p := clusterHarness(t)
	api := newFakeAPI()
	api.addrs = map[string]string{"node-a": "10.0.0.1", "b": "10.0.0.2"}
	h.api = api
	src, digest := stick(t, bundletest.Options{})
	h.cfg.Approval = "required"
	h.cfg.ApprovedDigests = []string{string(digest)}
	h.start()
	p.mu.Lock()
	p.statuses["10.0.0.2:8090"] = peer.PeerStatus{Err: errors.New("connection refused")} // b holds the gate
	p.mu.Unlock()
	other := "sha256:" + strings.Repeat("ab", 32)
	api.setPolicy(resourceName, cluster.BundlePolicy{ApprovedDigest: other})
	h.plug("/dev/sda", src)
	s := h.waitReason("approves " + other + ", not this bundle (" + string(digest) + ")")
	if s.Phase != string(PhaseExtracted) {
		t.Fatalf("status %+v", s)
	}
	api.setPolicy(resourceName, cluster.BundlePolicy{ApprovedDigest: other, ExcludedNodes: []string{"b"}})
	h.waitFor("the summary to leave b out, and say why", func() bool {
		b, _ := api.bundle(resourceName)
		return len(b.sum.Excluded) == 1 && b.sum.Excluded[0] == "b: listed in spec.excludedNodes"
	})
	h.waitPolls(p, 2)
	loads := h.loads()
	if s := h.agent.Status(); loads != 0 || s.Phase != string(PhaseExtracted) {
		t.Fatalf("the node's approval overrode the spec's: %d loads, status %+v", loads, s)
	}
	api.setPolicy(resourceName, cluster.BundlePolicy{ApprovedDigest: string(digest), ExcludedNodes: []string{"b"}})
	h.waitPhase(PhaseClusterReady)
}

// TestResource_SpecCleanupTakesTheBundleOut: the administrator's
// spec.cleanup does what 'ferry cleanup' does on the node: a loaded
// bundle the cluster never upgraded to is unloaded (its pins, mirror and
// tree go; the running release's pins stay), a bundle still waiting is
// removed; once.
func TestResource_SpecCleanupTakesTheBundleOut(t *testing.T) {
	t.Run("loaded", func(t *testing.T) {
		h, api := apiHarness(t)
		h.start()
		src, _ := stick(t, bundletest.Options{})
		h.plug("/dev/sda", src)
		h.waitPhase(PhaseClusterReady)
		api.setPolicy(resourceName, cluster.BundlePolicy{Cleanup: true})
		h.waitFor("the bundle unloaded", func() bool { return h.cleanups() == 1 })
		h.waitFor("the cleanup's end", func() bool { return h.record().Phase == PhaseCleaned })
		if n, r := h.cleanups(), h.retires(); n != 1 || r != 0 {
			t.Fatalf("unloaded %d times, retired %d times: want one unload and no retirement", n, r)
		}
		if h.record().Phase != PhaseCleaned {
			t.Fatalf("record %+v, want cleaned", h.record())
		}
	})
	t.Run("waiting for approval", func(t *testing.T) {
		h, api := apiHarness(t)
		h.cfg.Approval = "required"
		h.start()
		src, _ := stick(t, bundletest.Options{})
		h.plug("/dev/sda", src)
		h.waitReason("waiting for approval")
		api.setPolicy(resourceName, cluster.BundlePolicy{Cleanup: true})
		h.waitFor("the bundle cleaned up, and said so in the resource", func() bool {
			b, _ := api.bundle(resourceName)
			return h.record().Phase == PhaseCleaned && b.nodes["node-a"].Phase == string(PhaseCleaned)
		})
		loads := h.loads()
		if loads != 0 {
			t.Fatal("loaded")
		}
		if _, err := os.Stat(filepath.Join(h.cfg.Paths.ExtractDir, "4.13.7-x86_64")); !os.IsNotExist(err) {
			t.Fatalf("extracted dir kept: %v", err)
		}
	})
}

func TestSummarize_UpgradedNodesCountAsReady(t *testing.T) {
	const d = "sha256:aa"
	rep := &bundleReport{entry: cluster.BundleNodeEntry{Phase: string(PhaseUpgraded), Digest: d}}
	view := cluster.BundleView{Nodes: map[string]cluster.BundleNodeEntry{
		"b": {Phase: string(PhaseUpgrading), Digest: d},
		"c": {Phase: string(PhaseExtracted), Digest: d},
		"d": {Phase: string(PhaseCleaned), Digest: d},
	}}
	sum := summarize(rep, view, "a", []string{"a", "b", "c", "d", "e"}, map[string]string{"e": "listed in spec.excludedNodes"})
	if sum.NodesReady != "2/4" || sum.Phase != string(PhaseExtracted) || !slices.Equal(sum.Excluded, []string{"e: listed in spec.excludedNodes"}) {
		t.Fatalf("summary %+v", sum)
	}
}

func TestSummarize_FitsTheCRDsBounds(t *testing.T) {
	rep := &bundleReport{sum: cluster.BundleSummary{Warnings: boundList(slices.Repeat([]string{strings.Repeat("w", 4096)}, 40), maxSummaryWarnings)}}
	excluded := map[string]string{}
	for i := range 300 {
		excluded[fmt.Sprintf("node-%03d", i)] = "listed in spec.excludedNodes"
	}
	sum := summarize(rep, cluster.BundleView{}, "a", nil, excluded)
	if len(sum.Warnings) != maxSummaryWarnings || !strings.HasPrefix(sum.Warnings[maxSummaryWarnings-1], "… and 25 more") {
		t.Errorf("warnings: %d, last %q", len(sum.Warnings), sum.Warnings[len(sum.Warnings)-1])
	}
	for _, w := range sum.Warnings {
		if len(w) > MaxReason {
			t.Errorf("a warning of %d bytes", len(w))
		}
	}
	if len(sum.Excluded) != maxSummaryExcluded || sum.Excluded[0] != "node-000: listed in spec.excludedNodes" || !strings.HasPrefix(sum.Excluded[maxSummaryExcluded-1], "… and 45 more") {
		t.Errorf("excluded: %d, first %q, last %q", len(sum.Excluded), sum.Excluded[0], sum.Excluded[len(sum.Excluded)-1])
	}
	if got := boundList(nil, 3); got != nil {
		t.Errorf("boundList(nil) = %q", got)
	}
}

func TestSummarize_DisagreeingDigestsAreShownLoudly(t *testing.T) {
	const own, other = "sha256:aa", "sha256:ff"
	rep := &bundleReport{sum: cluster.BundleSummary{Digest: own, Approved: "digest", Warnings: []string{"paused pool"}}, entry: cluster.BundleNodeEntry{Phase: string(PhaseLoaded), Digest: own}}
	view := cluster.BundleView{Nodes: map[string]cluster.BundleNodeEntry{"b": {Phase: string(PhaseLoaded), Digest: own}, "c": {Phase: string(PhaseExtracted), Digest: other}, "d": {Phase: string(PhaseFetching)}}}
	sum := summarize(rep, view, "a", nil, nil)
	if sum.Digest != "" || sum.Approved != ApprovedDisagree || sum.NodesReady != "2/4" || len(sum.Warnings) != 2 ||
		sum.Warnings[0] != "the nodes read different digests for this bundle (sha256:aa: a, b; sha256:ff: c): approve only the digest the engineer gave you (the bundle's .sha256 file), and find out why a node reads another" {
		t.Fatalf("summary %+v", sum)
	}
	delete(view.Nodes, "c")
	if sum := summarize(rep, view, "a", nil, nil); sum.Digest != own || sum.Approved != "digest" || len(sum.Warnings) != 1 {
		t.Fatalf("agreeing: %+v", sum)
	}
}
