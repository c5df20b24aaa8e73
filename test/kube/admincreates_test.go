package kube

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// Issue 41: the number of objects one node can create is bounded. Every
// UpgradeBundle is the administrator's (ferry approve, or oc apply): a
// node creates none, so a node's credential adds no cluster-scoped
// object, however often it asks (docs/security.md, "How many objects one
// node can create"); until the administrator's exists, a node reports on
// its own Node and in Events.

// upgradeBundles is how many UpgradeBundles exist, as the administrator
// lists them.
func upgradeBundles(t *testing.T, e *kubeenv.Env) int {
	t.Helper()
	var list struct {
		Items []any `json:"items"`
	}
	if err := e.Admin.Raw(t.Context(), "GET", "/apis/ferry.io/v1alpha1/upgradebundles", "", nil, &list); err != nil {
		t.Fatal(err)
	}
	return len(list.Items)
}

// TestPolicy_ANodeCreatesNoUpgradeBundleHoweverOftenItAsks: a worker's
// kubelet certificate asks to create 20 UpgradeBundles, each a name the
// CRD takes: RBAC refuses each, and none exists. With a further grant of
// create to system:nodes (another role a site binds), the
// ferry-upgradebundle policy refuses each all the same, naming the
// administrator's command. The administrator's resource then takes that
// node's entry.
func TestPolicy_ANodeCreatesNoUpgradeBundleHoweverOftenItAsks(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("w1", "10.0.0.1")
	e.InstallFerry()
	installBundles(e)
	w1 := kubeletClient(t, e, "w1")
	ctx := t.Context()
	const asks = 20
	createAll := func(check func(name string, err error)) {
		for i := range asks {
			name := fmt.Sprintf("4.13.%d-x86-64", i)
			check(name, w1.Raw(ctx, "POST", "/apis/ferry.io/v1alpha1/upgradebundles", "application/json",
				map[string]any{"apiVersion": "ferry.io/v1alpha1", "kind": "UpgradeBundle", "metadata": map[string]any{"name": name}}, nil))
		}
	}
	createAll(func(name string, err error) { denied(t, "w1 creating "+name, err, "") })
	if n := upgradeBundles(t, e); n != 0 {
		t.Fatalf("%d UpgradeBundles after %d creates by a node, want 0", n, asks)
	}

	e.Create("/apis/rbac.authorization.k8s.io/v1/clusterroles", map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
		"metadata": map[string]any{"name": "site-upgradebundles"},
		"rules":    []any{map[string]any{"apiGroups": []string{"ferry.io"}, "resources": []string{"upgradebundles"}, "verbs": []string{"create"}}}})
	e.Create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]any{"name": "site-upgradebundles"},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "site-upgradebundles"},
		"subjects": []any{map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}}})
	waitUntil(t, "RBAC to grant create to system:nodes", func() bool {
		return allowed(t, e, "system:node:w1", []string{"system:nodes", "system:authenticated"}, access{verb: "create", group: "ferry.io", resource: "upgradebundles"})
	})
	createAll(func(name string, err error) {
		denied(t, "w1 creating "+name+" with create granted", err, "ferry-upgradebundle")
		if err != nil && !strings.Contains(err.Error(), "only the administrator creates an UpgradeBundle (ferry approve") {
			t.Errorf("w1 creating %s: %v, want the policy to name the administrator's command", name, err)
		}
	})
	if n := upgradeBundles(t, e); n != 0 {
		t.Fatalf("%d UpgradeBundles after %d more creates by a node granted create, want 0", n, asks)
	}

	e.CreateBundle(bundleName)
	if err := w1.PublishBundleEntry(ctx, bundleName, "w1", cluster.BundleNodeEntry{Phase: "extracted"}); err != nil {
		t.Fatalf("w1's entry in the administrator's UpgradeBundle: %v", err)
	}
	if n := upgradeBundles(t, e); n != 1 {
		t.Fatalf("%d UpgradeBundles, want the administrator's one", n)
	}
}

// TestAgent_TheStickBeforeFerryApproveWaitsOnItsNodeThenGoesThrough: the
// technician comes first. The node given the bundle (approval required,
// nothing approved) creates no UpgradeBundle; it waits, and says so where
// docs/admin.md says the administrator sees it: its Node's ferry.io/phase
// label (oc get nodes -L ferry.io/phase), its ferry.io/reason naming
// ferry approve with the engineer's file, and an Event about the
// bundle's name. Then the administrator's ferry approve (the bundle
// beside the .sha256) creates the resource and approves the release: the
// node loads, writes its entry there, and asks for the upgrade.
func TestAgent_TheStickBeforeFerryApproveWaitsOnItsNodeThenGoesThrough(t *testing.T) {
	n := startBundleNode(t, nil)
	logOnFailure(t, n)
	n.a.Wait(bound, "waiting for approval", func(s agent.Status) bool { return s.Reason == agent.ReasonAwaitingApproval })
	file := n.meta.Name() + ".sha256"
	waitUntil(t, "the Node and an Event to say it waits for ferry approve", func() bool {
		waits := false
		for _, ev := range n.e.Events(n.name) {
			waits = waits || strings.Contains(ev, "Extracted: node-a: ") && strings.Contains(ev, "ferry approve "+file)
		}
		return waits && n.e.NodeLabels("node-a")[agent.LabelPhase] == string(agent.PhaseExtracted) &&
			strings.Contains(n.e.Annotations("node-a")[agent.AnnotationReason], "ferry approve "+file+" with the engineer's file")
	})
	if o := n.e.Bundle(n.name); o != nil {
		t.Fatalf("the node created UpgradeBundle %s: %v", n.name, o)
	}
	if out, err := kubectl(t, n.e, "get", "nodes", "-L", agent.LabelPhase); err != nil || !strings.Contains(out, string(agent.PhaseExtracted)) {
		t.Errorf("kubectl get nodes -L %s: %v\n%s", agent.LabelPhase, err, out)
	}

	out, err := exec.Command(ferryenv.Binary(t), "approve", strings.TrimSuffix(n.tar, ".tar")+".sha256", "--kubeconfig", n.e.AdminKC).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "upgradebundle "+n.name+" created") {
		t.Fatalf("ferry approve: %v\n%s", err, out)
	}
	if out, err := kubectl(t, n.e, "wait", "--for=condition=Approved", "upgradebundle/"+n.name, fmt.Sprintf("--timeout=%ds", int(bound/time.Second))); err != nil {
		t.Fatalf("kubectl wait --for=condition=Approved: %v\n%s", err, out)
	}
	waitUntil(t, "the upgrade asked for", func() bool { du := n.e.DesiredUpdate(); return du != nil && du["image"] == n.meta.Release })
	if e := n.entry(); e.Digest != n.digest {
		t.Errorf("node-a's entry %v, want its digest %s", e, n.digest)
	}
}
