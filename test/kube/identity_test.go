package kube

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	apimeta "k8s.io/apimachinery/pkg/api/meta"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/api/v1alpha1"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/test/kubeenv"
	"github.com/ferry-edge/ferry/test/releasesig"
)

// These tests give ferry the node's own kubelet credential, as on
// OpenShift (cluster.kubeconfig = /var/lib/kubelet/kubeconfig): a client
// certificate CN system:node:NAME, O system:nodes, issued by the API
// server's client CA, with only what packaging/ ships.

// kubeletClient is ferry's client with node's kubelet credential.
func kubeletClient(t *testing.T, e *kubeenv.Env, node string) *kube.Client {
	t.Helper()
	c, err := kube.New(e.NodeCertKubeconfig(node), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Attempts = 1
	return c
}

// whoami is the user the API server sees.
func whoami(t *testing.T, c *kube.Client) (string, []string) {
	t.Helper()
	var review struct {
		Status struct {
			UserInfo struct {
				Username string   `json:"username"`
				Groups   []string `json:"groups"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	if err := c.Raw(t.Context(), "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", "application/json",
		map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}, &review); err != nil {
		t.Fatal(err)
	}
	return review.Status.UserInfo.Username, review.Status.UserInfo.Groups
}

// refusesWhatIsNotNodeAs: with node-a's kubelet credential c, writing
// node-b's UpgradeBundleNode (or owning its own to Node node-b), approving, setting force and writing Node node-b are
// each refused by ferry's own admission policy (or by RBAC where ferry
// grants no verb at all).
func refusesWhatIsNotNodeAs(t *testing.T, e *kubeenv.Env, c *kube.Client, bundle string) {
	t.Helper()
	ctx := t.Context()
	forged := []v1alpha1.BundleNodeStatus{{Name: bundle, NodeStatus: v1alpha1.NodeStatus{Phase: "failed", Reason: "forged"}}}
	err := kubeenv.ApplyBundleNode(ctx, c, "node-b", "node-b", e.NodeUID("node-b"), forged)
	denied(t, "writing node-b's UpgradeBundleNode", err, "ferry-upgradebundlenode")
	if err != nil && !strings.Contains(err.Error(), "the credential of node node-a writes the UpgradeBundleNode node-a only, not node-b") {
		t.Errorf("writing node-b's UpgradeBundleNode: %v, want the policy to name node-a", err)
	}
	err = kubeenv.ApplyBundleNode(ctx, c, "node-a", "node-b", e.NodeUID("node-b"), forged)
	denied(t, "owning its UpgradeBundleNode to Node node-b", err, "ferry-upgradebundlenode")
	if err != nil && !strings.Contains(err.Error(), "is owned by Node node-a alone") {
		t.Errorf("owning its UpgradeBundleNode to Node node-b: %v, want the policy's refusal", err)
	}
	if err := kubeenv.ApplyBundleNode(ctx, c, "node-a", "node-a", e.NodeUID("node-a"), nil); err != nil {
		t.Errorf("writing its own UpgradeBundleNode: %v", err)
	}
	denied(t, "deleting its UpgradeBundleNode", c.Raw(ctx, "DELETE", "/apis/ferry.io/v1alpha1/upgradebundlenodes/node-a", "", nil, nil), "ferry-upgradebundlenode")

	approve := map[string]any{"spec": map[string]any{"approvedDigest": "sha256:" + strings.Repeat("c", 64)}}
	denied(t, "approving (patching the spec)", merge(t, c, "/apis/ferry.io/v1alpha1/upgradebundles/"+bundle, approve), "")
	err = c.Raw(ctx, "POST", "/apis/ferry.io/v1alpha1/upgradebundles", "application/json", map[string]any{
		"apiVersion": "ferry.io/v1alpha1", "kind": "UpgradeBundle", "metadata": map[string]any{"name": "4.13.9-x86-64"},
		"spec": map[string]any{"approvedDigest": "sha256:" + strings.Repeat("c", 64)}}, nil)
	denied(t, "approving (creating an approved UpgradeBundle)", err, "")

	err = merge(t, c, cvPath, desired(next, true))
	denied(t, "setting force", err, "ferry-clusterversion")
	if err != nil && !strings.Contains(err.Error(), "may not set spec.desiredUpdate.force") {
		t.Errorf("setting force: %v, want the force refusal", err)
	}

	denied(t, "node-b's ferry.io annotation", c.Annotate(ctx, "node-b", map[string]string{"ferry.io/phase": "loaded"}, nil), "ferry-node")
	denied(t, "node-b's ferry.io label", merge(t, c, "/api/v1/nodes/node-b", meta("labels", map[string]any{"ferry.io/phase": "x"})), "ferry-node")
	// The Node authorizer lets any kubelet patch any Node; NodeRestriction
	// (on OpenShift, not here) and ferry's policy hold it to its own.
	denied(t, "node-b's other labels", merge(t, c, "/api/v1/nodes/node-b", meta("labels", map[string]any{"evil": "x"})), "ferry-node")
	denied(t, "a taint on its own Node with a ferry.io annotation", merge(t, c, "/api/v1/nodes/node-a", map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{"ferry.io/phase": "x"}},
		"spec":     map[string]any{"taints": []any{map[string]any{"key": "evil", "effect": "NoSchedule"}}}}), "ferry-node")
	if got := e.Annotations("node-b"); got["ferry.io/phase"] != "" {
		t.Errorf("node-b's annotations after the refusals: %v", got)
	}
}

// TestPolicy_AKubeletCertificateActsForItsOwnNodeOnly: the kubelet's
// credential writes its own Node's ferry.io/* metadata and its own entry;
// it cannot write another node's, approve, or force; and the kubelet's
// own updates of its Node (status, its other labels) and its Events pass
// ferry's policies untouched.
func TestPolicy_AKubeletCertificateActsForItsOwnNodeOnly(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	e.AddNode("node-b", "10.0.0.2")
	e.InstallFerry()
	installBundles(e)
	a := kubeletClient(t, e, "node-a")
	ctx := t.Context()

	if user, groups := whoami(t, a); user != "system:node:node-a" || !slices.Contains(groups, "system:nodes") {
		t.Fatalf("the API server sees %q %v, want system:node:node-a in system:nodes", user, groups)
	}
	if n, ok := a.NodeIdentity(); !ok || n != "node-a" {
		t.Fatalf("NodeIdentity %q %v", n, ok)
	}

	// What ferry does.
	if err := a.Annotate(ctx, "node-a", map[string]string{"ferry.io/phase": "loaded"}, map[string]string{"ferry.io/phase": "loaded"}); err != nil {
		t.Fatalf("annotating its own Node: %v", err)
	}
	e.CreateBundle(bundleName) // the administrator's (a node creates none)
	digest := digest.Digest("sha256:" + strings.Repeat("a", 64))
	sum := cluster.BundleSummary{Version: "4.13.7", Arch: "x86_64", Digest: digest, Phase: "loaded", NodesReady: "1/2"}
	if err := a.PublishBundleStatus(ctx, bundleName, sum, "node-a", cluster.BundleNodeEntry{Phase: "loaded", Digest: digest}); err != nil {
		t.Fatalf("its own entry: %v", err)
	}
	if err := a.BundleEvent(ctx, bundleName, "", "node-a", "Normal", "Loaded", "node-a: loaded"); err != nil {
		t.Fatalf("its own Event: %v", err)
	}
	e.ApproveRelease(next)
	if err := a.StartUpgrade(ctx, cluster.Upgrade{Release: next, Version: "4.13.7", Signatures: releasesig.Signatures(next, "4.13.7")}); err != nil {
		t.Fatalf("starting the upgrade: %v", err)
	}

	// What the kubelet does, which ferry's policies must leave alone.
	if err := merge(t, a, "/api/v1/nodes/node-a/status", map[string]any{"status": map[string]any{"conditions": []any{map[string]any{
		"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
		"lastHeartbeatTime": "2024-01-01T00:00:00Z", "lastTransitionTime": "2024-01-01T00:00:00Z"}}}}); err != nil {
		t.Errorf("the kubelet's status update: %v", err)
	}
	if err := merge(t, a, "/api/v1/nodes/node-a", map[string]any{"metadata": map[string]any{
		"labels":      map[string]any{"kubernetes.io/hostname": "node-a"},
		"annotations": map[string]any{"volumes.kubernetes.io/controller-managed-attach-detach": "true"}}}); err != nil {
		t.Errorf("the kubelet's own labels and annotations: %v", err)
	}
	err := a.Raw(ctx, "POST", "/api/v1/namespaces/default/events", "application/json", map[string]any{
		"apiVersion": "v1", "kind": "Event", "metadata": map[string]any{"generateName": "node-a."},
		"involvedObject": map[string]any{"kind": "Node", "name": "node-a", "uid": "node-a"}, "type": "Normal", "reason": "NodeReady",
		"message": "Node node-a status is now: NodeReady", "source": map[string]any{"component": "kubelet", "host": "node-a"},
		"firstTimestamp": "2024-01-01T00:00:00Z", "lastTimestamp": "2024-01-01T00:00:00Z", "count": 1}, nil)
	if err != nil {
		t.Errorf("the kubelet's Event on its Node: %v", err)
	}

	refusesWhatIsNotNodeAs(t, e, a, bundleName)
	denied(t, "an Event about an UpgradeBundle as node-b", a.BundleEvent(ctx, bundleName, "", "node-b", "Normal", "Loaded", "node-b: loaded"), "ferry-events")

	// The kubelet rotates its certificate: ferry goes on with the new one.
	e.RotateNodeCert("node-a")
	if err := a.Annotate(ctx, "node-a", map[string]string{"ferry.io/reason": "rotated"}, nil); err != nil {
		t.Fatalf("after the kubelet rotated its certificate: %v", err)
	}
}

// TestAgent_TheKubeletsCertificateRunsTheWholeLoop: the agent, given only
// node-a's kubelet kubeconfig and no node_name of its own (its hostname),
// acts as node-a: it loads a bundle the administrator approved in its
// UpgradeBundle, starts the upgrade, and reports it Updated, with a real
// CRI-O and ferry's shipped rights. With the same credential, what is
// not node-a's is refused.
func TestAgent_TheKubeletsCertificateRunsTheWholeLoop(t *testing.T) {
	host, err := os.Hostname()
	if err != nil || host == "node-a" {
		t.Fatalf("hostname %q, %v: the test needs one that is not node-a", host, err)
	}
	var kc string
	n := startBundleNodeWith(t, func(e *kubeenv.Env, b bundleNode) {
		e.AddNode("node-b", "10.0.0.2")
		e.PatchBundleSpec(b.name, map[string]any{"approvedDigest": b.digest, "schedule": "Automatic"})
		e.ApproveRelease(b.meta.Release)
	}, func(e *kubeenv.Env, cfg *agent.Config) {
		kc = e.NodeCertKubeconfig("node-a")
		cfg.Cluster.Kubeconfig = kc
		cfg.NodeName = host // what the config has by default
	})
	e, a, meta, name := n.e, n.a, n.meta, n.name
	t.Cleanup(func() {
		if t.Failed() {
			s, _ := a.Status(context.Background())
			t.Logf("the UpgradeBundle: %v\nthe agent: %+v\nits log:\n%s", e.Bundle(name), s, a.Logs())
		}
	})
	if s := a.WaitPhase(bound, agent.PhaseClusterReady); s.Node != "node-a" {
		t.Errorf("the agent calls itself %q, want node-a (its certificate's CN)", s.Node)
	}
	waitUntil(t, "the upgrade asked for", func() bool { du := e.DesiredUpdate(); return du != nil && du["image"] == meta.Release })
	e.SetHistory(kubeenv.History{State: "Completed", Image: meta.Release, Version: meta.Version}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	waitUntil(t, "Updated in node-a's entry", func() bool {
		return apimeta.IsStatusConditionTrue(e.BundleNodes(name)["node-a"].Conditions, "Updated")
	})
	// The Node's label and annotation follow the node entry on their own
	// write: wait for them rather than read them once.
	waitUntil(t, "node-a labelled and annotated upgraded", func() bool {
		return e.NodeLabels("node-a")[agent.LabelPhase] == string(agent.PhaseUpgraded) &&
			e.Annotations("node-a")[agent.AnnotationPhase] == string(agent.PhaseUpgraded)
	})

	// The same credential, the agent's kubeconfig.
	c, err := kube.New(kc, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Attempts = 1
	refusesWhatIsNotNodeAs(t, e, c, name)
}
