package kube

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	apimeta "k8s.io/apimachinery/pkg/api/meta"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/api/v1alpha1"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// Issue 45: three ways a trial against a real API server went wrong, each
// with two real agents with kubelet-shaped identities (node client and
// serving certificates, peer.identity = "node"), ferry's RBAC and
// admission policies, and a real CRI-O each: the bundle is plugged on
// node-a, node-b fetches it over peer TLS, and both behave.

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

// logOnFailure shows the resource and the agent's status when t fails
// (kubeletAgents shows the logs).
func logOnFailure(t *testing.T, n bundleNode) {
	t.Cleanup(func() {
		if t.Failed() {
			s, _ := n.a.Status(context.Background())
			t.Logf("the UpgradeBundle: %v\n%s: %+v", n.e.Bundle(n.name), n.node, s)
		}
	})
}

// entry is n's node entry for its UpgradeBundle, in its UpgradeBundleNode.
func (n bundleNode) entry() v1alpha1.NodeStatus {
	return n.e.BundleNodes(n.name)[n.node]
}

// fetchedFromPeer fails t unless n holds its bundle fetched from a peer,
// as node-b does from node-a.
func fetchedFromPeer(t *testing.T, n bundleNode) {
	t.Helper()
	s, err := n.a.Status(t.Context())
	for _, r := range s.Bundles {
		if r.Digest == digest.Digest(n.digest) && r.Origin == agent.OriginPeer && r.Phase != agent.PhaseRejected {
			return
		}
	}
	t.Fatalf("%s holds no bundle %s fetched from a peer: %+v, %v", n.node, n.digest, s.Bundles, err)
}

// TestAgent_AnApprovalInAnotherUpgradeBundleNeverStartsTheUpgrade (issue
// 45, item 1): 4.13.7-amd64, the spelling people use, is refused by the
// CRD, naming 4.13.7-x86-64; the administrator then wrote the engineer's
// digest and schedule Manual into 4.13.7-aarch64, a valid name but not
// this bundle's own resource, 4.13.7-x86-64. Before, the node took the
// approval from the stray one, created its own with an empty spec
// (Automatic) and asked for the upgrade seconds after loading. Now
// neither node loads or asks: node-a, given the bundle, says which
// resource counts (on its Node: no node makes the bundle's own resource)
// and a Warning Event on the stray one names it; node-b refuses to fetch
// it from node-a, not approved.
func TestAgent_AnApprovalInAnotherUpgradeBundleNeverStartsTheUpgrade(t *testing.T) {
	const stray = "4.13.7-aarch64"
	nodes := startTwoBundleNodes(t, func(e *kubeenv.Env, b bundleNode) {
		refusedName(t, e, "4.13.7-amd64", "name it 4.13.7-x86-64")
		// The release is approved: only the stray bundle approval stands
		// between the load and the upgrade.
		e.ApproveRelease(b.meta.Release)
		administrator{e}.spec(stray, map[string]any{"approvedDigest": b.digest, "schedule": "Manual"})
	})
	for _, n := range nodes {
		logOnFailure(t, n)
	}
	nodeA, nodeB := nodes[0], nodes[1]
	nodeA.a.Wait(bound, "node-a to say which resource counts", func(s agent.Status) bool {
		return s.Reason == agent.ReasonAwaitingApproval && s.Digest == digest.Digest(nodeA.digest)
	})
	waitUntil(t, "a Warning Event from node-a on "+stray+" naming "+nodeA.name, func() bool {
		for _, ev := range nodeA.e.Events(stray) {
			if strings.HasPrefix(ev, "Warning ApprovalIgnored: node-a: ") && strings.Contains(ev, stray) && strings.Contains(ev, nodeA.name) {
				return true
			}
		}
		return false
	})
	// The bundle's own resource does not exist (a node creates none): its
	// Node says it.
	waitUntil(t, "node-a's Node to name "+stray, func() bool {
		return strings.Contains(nodeA.e.Annotations("node-a")[agent.AnnotationReason], stray)
	})
	// node-b, offered the bundle by node-a, takes no approval from the
	// stray resource either: it refuses to fetch it.
	nodeB.a.Wait(bound, "node-b to refuse the peers' bundle", func(s agent.Status) bool {
		for _, r := range s.Bundles {
			if r.Origin == agent.OriginPeer && r.Digest == digest.Digest(nodeB.digest) && r.Phase == agent.PhaseRejected && r.Condition.Reason == agent.ReasonNotApproved {
				return true
			}
		}
		return false
	})
	// The bug asked for the upgrade on a turn after the load: turns of the
	// loop that bring nothing new must not, on either node.
	for _, n := range nodes {
		n.a.TurnsRefused(3, "proceed")
	}
	if s, _ := nodeA.a.Status(t.Context()); s.Phase != string(agent.PhaseExtracted) || s.Reason != agent.ReasonAwaitingApproval {
		t.Errorf("node-a: phase %s (%s), want extracted (not loaded) awaiting approval", s.Phase, s.Reason)
	}
	s, _ := nodeB.a.Status(t.Context())
	for _, r := range s.Bundles {
		if r.Phase.Loaded() || r.Phase == agent.PhaseExtracted {
			t.Errorf("node-b holds %s %s", r.Digest, r.Phase)
		}
	}
	if du := nodeA.e.DesiredUpdate(); du != nil {
		t.Fatalf("desiredUpdate %v: the upgrade was asked for", du)
	}
	if o := nodeA.e.Bundle(nodeA.name); o != nil {
		t.Errorf("a node made the bundle's own resource: %v", o)
	}
}

// TestAgent_CleanupAfterTheUpgradeWasAskedForIsRefused (issue 45, item
// 2): spec.cleanup right after ferry wrote desiredUpdate (cluster-ready,
// the version operator not started). Before, the node took its images
// and mirror out and said cleaned while desiredUpdate named the release.
// Now both nodes refuse, saying the way out; once the administrator
// clears the upgrade, the cleanup goes on by itself on both.
func TestAgent_CleanupAfterTheUpgradeWasAskedForIsRefused(t *testing.T) {
	var admin administrator
	nodes := startTwoBundleNodes(t, func(e *kubeenv.Env, b bundleNode) {
		admin = administrator{e}
		e.ApproveRelease(b.meta.Release)
		admin.spec(b.name, map[string]any{"approvedDigest": b.digest, "schedule": "Automatic"})
	})
	for _, n := range nodes {
		logOnFailure(t, n)
		n.a.WaitPhase(bound, agent.PhaseClusterReady)
	}
	fetchedFromPeer(t, nodes[1])
	n := nodes[0]
	waitUntil(t, "the upgrade asked for", func() bool { du := n.e.DesiredUpdate(); return du != nil && du["image"] == n.meta.Release })

	admin.spec(n.name, map[string]any{"cleanup": true})
	for _, n := range nodes {
		n.a.Wait(bound, n.node+" to refuse the cleanup", func(s agent.Status) bool { return s.Reason == agent.ReasonCleanupRefused })
		waitUntil(t, n.node+" refusing the cleanup in the UpgradeBundle", func() bool {
			entry := n.entry()
			return entry.Reason == agent.ReasonCleanupRefused && strings.Contains(entry.Message, "oc adm upgrade --clear")
		})
	}
	// Asked again by hand, the cleanup is refused the same way: turns of
	// the loop, with spec.cleanup standing, that take nothing out.
	for _, n := range nodes {
		n.a.TurnsRefused(2, "cleanup")
		if s, _ := n.a.Status(t.Context()); s.Phase != string(agent.PhaseClusterReady) || s.Reason != agent.ReasonCleanupRefused {
			t.Fatalf("%s: phase %s (%s), want cluster-ready, cleanup refused: the bundle went while desiredUpdate names its release", n.node, s.Phase, s.Reason)
		}
		if _, err := os.Stat(n.tree); err != nil {
			t.Fatalf("%s: the bundle's tree went while desiredUpdate names its release: %v", n.node, err)
		}
		if out, err := n.a.Ferry("cleanup"); err == nil || !strings.Contains(out, "oc adm upgrade --clear") {
			t.Errorf("ferry cleanup on %s: %v\n%s", n.node, err, out)
		}
	}
	if du := n.e.DesiredUpdate(); du == nil || du["image"] != n.meta.Release {
		t.Fatalf("desiredUpdate %v", du)
	}

	admin.clearUpgrade(t)
	for _, n := range nodes {
		waitUntil(t, n.node+" cleaned once the upgrade is cleared", func() bool { return n.entry().Phase == string(agent.PhaseCleaned) })
		if _, err := os.Stat(n.tree); !os.IsNotExist(err) {
			t.Errorf("%s: the bundle's tree is still there after the cleanup: %v", n.node, err)
		}
	}
	if du := n.e.DesiredUpdate(); du != nil {
		t.Errorf("desiredUpdate %v after the cleanup: ferry asked again", du)
	}
}

// TestAgent_AHistoryEntrySpelledByDigestAloneIsThisRelease (issue 45,
// item 3): the version operator's history names the release as oc adm
// upgrade --to-image name@sha256:… wrote it, another repository and no
// tag, not as the bundle does. Before, the node waited for the operator
// to start forever; now Completed is this release's, and both nodes are
// upgraded.
func TestAgent_AHistoryEntrySpelledByDigestAloneIsThisRelease(t *testing.T) {
	nodes := startTwoBundleNodes(t, func(e *kubeenv.Env, b bundleNode) {
		e.ApproveRelease(b.meta.Release)
		administrator{e}.spec(b.name, map[string]any{"approvedDigest": b.digest, "schedule": "Automatic"})
	})
	for _, n := range nodes {
		logOnFailure(t, n)
		n.a.WaitPhase(bound, agent.PhaseClusterReady)
	}
	fetchedFromPeer(t, nodes[1])
	n := nodes[0]
	waitUntil(t, "the upgrade asked for", func() bool { du := n.e.DesiredUpdate(); return du != nil && du["image"] == n.meta.Release })
	at := strings.LastIndex(n.meta.Release, "@")
	spelled := "mirror.example.com:5000/ocp4/openshift4" + n.meta.Release[at:]
	if spelled == n.meta.Release {
		t.Fatalf("the release %s is spelled so already", n.meta.Release)
	}
	n.e.SetHistory(kubeenv.History{State: "Completed", Image: spelled, Version: n.meta.Version}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	for _, n := range nodes {
		n.a.WaitPhase(bound, agent.PhaseUpgraded)
		waitUntil(t, n.node+" Updated in the UpgradeBundle", func() bool {
			entry := n.entry()
			return apimeta.IsStatusConditionTrue(entry.Conditions, "Updated") && entry.Reason == agent.ReasonUpgraded
		})
	}
}

// refusedName shows that the API server refuses to create UpgradeBundle
// name, its message saying want (the spelling ferry reads).
func refusedName(t *testing.T, e *kubeenv.Env, name, want string) {
	t.Helper()
	cmd := exec.Command(e.Kubectl(), "--kubeconfig", e.AdminKC, "create", "-f", "-")
	cmd.Stdin = strings.NewReader(`{"apiVersion":"ferry.io/v1alpha1","kind":"UpgradeBundle","metadata":{"name":"` + name + `"}}`)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), want) {
		t.Fatalf("creating UpgradeBundle %s: %v, want refused saying %q:\n%s", name, err, want, out)
	}
}
