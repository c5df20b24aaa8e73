package kube

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// Issue 45: three ways a trial against a real API server went wrong, each
// with one real agent, its node's own credential, ferry's RBAC and
// admission policies, and a real CRI-O.

// administrator is what the cluster's administrator does in these tests,
// in one place: writing an UpgradeBundle's spec (oc patch upgradebundle,
// creating it when there is none) and clearing the upgrade asked for (oc
// adm upgrade --clear). Where ferry's admission policy asks for more of
// the administrator (a release approved in openshift-ferry/ferry-admission),
// that step goes here too.
type administrator struct{ e *kubeenv.Env }

func (a administrator) spec(name string, spec map[string]any) { a.e.PatchBundleSpec(name, spec) }

func (a administrator) clearUpgrade(t *testing.T) {
	t.Helper()
	err := a.e.Admin.Raw(context.Background(), "PATCH", "/apis/config.openshift.io/v1/clusterversions/version", "application/merge-patch+json",
		map[string]any{"spec": map[string]any{"desiredUpdate": nil}}, nil)
	if err != nil {
		t.Fatalf("oc adm upgrade --clear: %v", err)
	}
}

// logOnFailure shows the resource and the agent's status and log when t
// fails.
func logOnFailure(t *testing.T, n bundleNode) {
	t.Cleanup(func() {
		if t.Failed() {
			s, _ := n.a.Status(context.Background())
			t.Logf("the UpgradeBundle: %v\nthe agent: %+v\nits log:\n%s", n.e.Bundle(n.name), s, n.a.Logs())
		}
	})
}

// nodeEntry is node-a's entry in UpgradeBundle name's status.
func nodeEntry(e *kubeenv.Env, name string) map[string]any {
	st, _ := e.Bundle(name)["status"].(map[string]any)
	nodes, _ := st["nodes"].(map[string]any)
	entry, _ := nodes["node-a"].(map[string]any)
	return entry
}

// TestAgent_AnApprovalInAnotherUpgradeBundleNeverStartsTheUpgrade (issue
// 45, item 1): the administrator wrote the engineer's digest and
// schedule Manual into 4.13.7-amd64, the spelling people use, while the
// bundle's own resource is 4.13.7-x86-64. Before, the node took the
// approval from the stray one, created its own with an empty spec
// (Automatic) and asked for the upgrade seconds after loading. Now
// nothing is loaded or asked, the node says which resource counts, and
// a Warning Event on the stray one names it.
func TestAgent_AnApprovalInAnotherUpgradeBundleNeverStartsTheUpgrade(t *testing.T) {
	const stray = "4.13.7-amd64"
	n := startBundleNode(t, func(e *kubeenv.Env, b bundleNode) {
		// The release is approved: only the stray bundle approval stands
		// between the load and the upgrade.
		e.ApproveRelease(b.meta.Release)
		administrator{e}.spec(stray, map[string]any{"approvedDigest": b.digest, "schedule": "Manual"})
	})
	logOnFailure(t, n)
	waitUntil(t, "a Warning Event on "+stray+" naming "+n.name, func() bool {
		for _, ev := range n.e.Events(stray) {
			if strings.HasPrefix(ev, "Warning ApprovalIgnored: node-a: ") && strings.Contains(ev, stray) && strings.Contains(ev, n.name) {
				return true
			}
		}
		return false
	})
	waitUntil(t, "the warnings of "+n.name+" to say so", func() bool {
		st, _ := n.e.Bundle(n.name)["status"].(map[string]any)
		ws, _ := st["warnings"].([]any)
		return len(ws) > 0 && strings.Contains(ws[0].(string), stray)
	})
	n.a.Wait(bound, "the node to say which resource counts", func(s agent.Status) bool {
		return s.Reason == agent.ReasonAwaitingApproval
	})
	// The bug asked for the upgrade on a turn after the load: turns of the
	// loop that bring nothing new must not.
	n.a.TurnsRefused(3, "proceed")
	if s, _ := n.a.Status(t.Context()); s.Phase != string(agent.PhaseExtracted) {
		t.Errorf("phase %s, want extracted (not loaded)", s.Phase)
	}
	if du := n.e.DesiredUpdate(); du != nil {
		t.Fatalf("desiredUpdate %v: the upgrade was asked for", du)
	}
	if spec, _ := n.e.Bundle(n.name)["spec"].(map[string]any); len(spec) != 0 {
		t.Errorf("the bundle's own resource has the spec %v", spec)
	}
}

// TestAgent_CleanupAfterTheUpgradeWasAskedForIsRefused (issue 45, item
// 2): spec.cleanup right after ferry wrote desiredUpdate (cluster-ready,
// the version operator not started). Before, the node took its images
// and mirror out and said cleaned while desiredUpdate named the release.
// Now it refuses, saying the way out; once the administrator clears the
// upgrade, the cleanup goes on by itself.
func TestAgent_CleanupAfterTheUpgradeWasAskedForIsRefused(t *testing.T) {
	var admin administrator
	n := startBundleNode(t, func(e *kubeenv.Env, b bundleNode) {
		admin = administrator{e}
		e.ApproveRelease(b.meta.Release)
		admin.spec(b.name, map[string]any{"approvedDigest": b.digest, "schedule": "Automatic"})
	})
	logOnFailure(t, n)
	n.a.WaitPhase(bound, agent.PhaseClusterReady)
	waitUntil(t, "the upgrade asked for", func() bool { du := n.e.DesiredUpdate(); return du != nil && du["image"] == n.meta.Release })

	admin.spec(n.name, map[string]any{"cleanup": true})
	waitUntil(t, "node-a refusing the cleanup in the UpgradeBundle", func() bool {
		entry := nodeEntry(n.e, n.name)
		message, _ := entry["message"].(string)
		return entry["reason"] == agent.ReasonCleanupRefused && strings.Contains(message, "oc adm upgrade --clear")
	})
	// Asked again by hand, the cleanup is refused the same way: turns of
	// the loop, with spec.cleanup standing, that take nothing out.
	n.a.TurnsRefused(2, "cleanup")
	if s, _ := n.a.Status(t.Context()); s.Phase != string(agent.PhaseClusterReady) {
		t.Fatalf("phase %s, want cluster-ready: the bundle went while desiredUpdate names its release", s.Phase)
	}
	if _, err := os.Stat(n.tree); err != nil {
		t.Fatalf("the bundle's tree went while desiredUpdate names its release: %v", err)
	}
	if out, err := n.a.Ferry("cleanup"); err == nil || !strings.Contains(out, "oc adm upgrade --clear") {
		t.Errorf("ferry cleanup on the node: %v\n%s", err, out)
	}
	if du := n.e.DesiredUpdate(); du == nil || du["image"] != n.meta.Release {
		t.Fatalf("desiredUpdate %v", du)
	}

	admin.clearUpgrade(t)
	waitUntil(t, "node-a cleaned once the upgrade is cleared", func() bool { return nodeEntry(n.e, n.name)["phase"] == string(agent.PhaseCleaned) })
	if du := n.e.DesiredUpdate(); du != nil {
		t.Errorf("desiredUpdate %v after the cleanup: ferry asked again", du)
	}
}

// TestAgent_AHistoryEntrySpelledByDigestAloneIsThisRelease (issue 45,
// item 3): the version operator's history names the release as oc adm
// upgrade --to-image name@sha256:… wrote it, another repository and no
// tag, not as the bundle does. Before, the node waited for the operator
// to start forever; now Completed is this release's, and it is upgraded.
func TestAgent_AHistoryEntrySpelledByDigestAloneIsThisRelease(t *testing.T) {
	n := startBundleNode(t, func(e *kubeenv.Env, b bundleNode) {
		e.ApproveRelease(b.meta.Release)
		administrator{e}.spec(b.name, map[string]any{"approvedDigest": b.digest, "schedule": "Automatic"})
	})
	logOnFailure(t, n)
	n.a.WaitPhase(bound, agent.PhaseClusterReady)
	waitUntil(t, "the upgrade asked for", func() bool { du := n.e.DesiredUpdate(); return du != nil && du["image"] == n.meta.Release })
	at := strings.LastIndex(n.meta.Release, "@")
	spelled := "mirror.example.com:5000/ocp4/openshift4" + n.meta.Release[at:]
	if spelled == n.meta.Release {
		t.Fatalf("the release %s is spelled so already", n.meta.Release)
	}
	n.e.SetHistory(kubeenv.History{State: "Completed", Image: spelled, Version: n.meta.Version}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	n.a.WaitPhase(bound, agent.PhaseUpgraded)
	waitUntil(t, "Updated in the UpgradeBundle", func() bool {
		cs, _ := nodeEntry(n.e, n.name)["conditions"].([]any)
		for _, c := range cs {
			if c, _ := c.(map[string]any); c["type"] == "Updated" && c["status"] == "True" {
				return true
			}
		}
		return false
	})
}
