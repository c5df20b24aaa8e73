package kube

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

const bundleName = "4.13.7-x86-64"

func installBundles(e *kubeenv.Env) {
	e.InstallUpgradeBundles(repoFile("packaging/upgradebundle-crd.yaml"))
}

// TestClient_UpgradeBundleStatusIsFerrysAndSpecTheAdministrators: with
// only ferry's RBAC and the shipped admission policy, ferry writes each
// node's entry of the administrator's UpgradeBundle into that node's
// UpgradeBundleNode without touching the others', records Events, and
// cannot write the spec: neither creating one with it nor patching it.
func TestClient_UpgradeBundleStatusIsFerrysAndSpecTheAdministrators(t *testing.T) {
	e := kubeenv.Start(t, current)
	c := ferryClient(t, e)
	e.AddNode("node-b", "10.0.0.2")
	cb := nodeClient(t, e, "node-b")
	installBundles(e)
	ctx := t.Context()

	if _, ok, err := c.UpgradeBundle(ctx, bundleName); err != nil || ok {
		t.Fatalf("before: ok %v, %v", ok, err)
	}
	// Every UpgradeBundle is the administrator's: a node's create is
	// refused (TestPolicy_ANodeCreatesNoUpgradeBundleHoweverOftenItAsks).
	e.CreateBundle(bundleName)
	sum := cluster.BundleSummary{Version: "4.13.7", Arch: "x86_64", Digest: digest.Digest("sha256:" + strings.Repeat("a", 64)), Phase: "loading", NodesReady: "0/2"}
	entry := cluster.BundleNodeEntry{Phase: "loading", Digest: sum.Digest, Conditions: []cluster.BundleCondition{{Type: "Extracted", Status: "True", Reason: "Extracted"}}}
	for n, cl := range map[string]*kube.Client{"node-a": c, "node-b": cb} {
		if err := cl.PublishBundleStatus(ctx, bundleName, sum, n, entry); err != nil {
			t.Fatal(err)
		}
	}
	// A node's credential writes its own entry only.
	if err := c.PublishBundleStatus(ctx, bundleName, sum, "node-b", cluster.BundleNodeEntry{Phase: "failed"}); err == nil || !strings.Contains(err.Error(), "writes the UpgradeBundleNode node-a only, not node-b") {
		t.Errorf("node-a writing node-b's entry: %v, want the admission policy's refusal", err)
	}
	ub, ok, err := c.UpgradeBundle(ctx, bundleName)
	if err != nil || !ok || len(ub.Nodes) != 2 || ub.Nodes["node-a"].Phase != "loading" || ub.Policy.ApprovedDigest != "" {
		t.Fatalf("read back: %+v %v %v", ub, ok, err)
	}
	if err := c.BundleEvent(ctx, bundleName, ub.UID, "node-a", "Normal", "Loading", "node-a: loading 3/7 images"); err != nil {
		t.Fatal(err)
	}
	if evs := e.Events(bundleName); len(evs) != 1 || evs[0] != "Normal Loading: node-a: loading 3/7 images" {
		t.Errorf("events %q", evs)
	}

	// The administrator approves; ferry reads it.
	digest := "sha256:" + strings.Repeat("b", 64)
	e.PatchBundleSpec(bundleName, map[string]any{"approvedDigest": digest, "schedule": "Manual", "excludedNodes": []string{"node-c"}})
	ub, _, err = c.UpgradeBundle(ctx, bundleName)
	if err != nil || ub.Policy.ApprovedDigest != digest || ub.Policy.Schedule != "Manual" || len(ub.Policy.ExcludedNodes) != 1 {
		t.Fatalf("spec as ferry reads it: %+v %v", ub.Policy, err)
	}

	// ferry's identity cannot approve: neither patching the spec nor
	// creating a resource (with a spec or without) is in its RBAC.
	err = c.Raw(ctx, "PATCH", "/apis/ferry.io/v1alpha1/upgradebundles/"+bundleName, "application/merge-patch+json",
		map[string]any{"spec": map[string]any{"approvedDigest": "sha256:" + strings.Repeat("c", 64)}}, nil)
	if !errors.Is(err, kube.ErrForbidden) {
		t.Errorf("ferry patching the spec: %v, want forbidden", err)
	}
	err = c.Raw(ctx, "POST", "/apis/ferry.io/v1alpha1/upgradebundles", "application/json", map[string]any{
		"apiVersion": "ferry.io/v1alpha1", "kind": "UpgradeBundle", "metadata": map[string]any{"name": "4.13.8-x86-64"},
		"spec": map[string]any{"approvedDigest": "sha256:" + strings.Repeat("c", 64)}}, nil)
	if !errors.Is(err, kube.ErrForbidden) {
		t.Errorf("ferry creating an approved bundle: %v, want forbidden", err)
	}
	// Nor through the status subresource (the spec stays as it was).
	c.Raw(ctx, "PATCH", "/apis/ferry.io/v1alpha1/upgradebundles/"+bundleName+"/status", "application/merge-patch+json",
		map[string]any{"spec": map[string]any{"approvedDigest": "sha256:" + strings.Repeat("d", 64)}}, nil)
	if ub, _, _ = c.UpgradeBundle(ctx, bundleName); ub.Policy.ApprovedDigest != digest {
		t.Errorf("the spec after ferry wrote it through /status: %+v", ub.Policy)
	}
}

// TestAgent_ABundleApprovedAheadInItsUpgradeBundleGoesThroughAlone: the
// administrator writes the UpgradeBundle (approvedDigest from the
// engineer) before the technician arrives; the agent, approval required
// and nothing approved in its config, loads the bundle when it is given,
// starts the upgrade, and reports it Updated, with the real API server,
// CRI-O and ferry's shipped rights.
func TestAgent_ABundleApprovedAheadInItsUpgradeBundleGoesThroughAlone(t *testing.T) {
	n := startBundleNode(t, func(e *kubeenv.Env, b bundleNode) {
		e.PatchBundleSpec(b.name, map[string]any{"approvedDigest": b.digest, "schedule": "Automatic"})
		e.ApproveRelease(b.meta.Release)
	})
	e, a, meta, name := n.e, n.a, n.meta, n.name
	a.WaitPhase(bound, agent.PhaseClusterReady)
	waitUntil(t, "the upgrade asked for", func() bool { du := e.DesiredUpdate(); return du != nil && du["image"] == meta.Release })
	e.SetHistory(kubeenv.History{State: "Completed", Image: meta.Release, Version: meta.Version}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	t.Cleanup(func() {
		if t.Failed() {
			s, _ := a.Status(context.Background())
			t.Logf("the UpgradeBundle: %v\nthe agent: %+v\nits log:\n%s", e.Bundle(name), s, a.Logs())
		}
	})
	waitUntil(t, "Updated in the UpgradeBundle", func() bool {
		o, _ := e.UpgradeBundle(name)
		st, n := o.Status, e.BundleNodes(name)["node-a"]
		stale := n.Message != "" // "waiting for approval", from before the spec was read
		return apimeta.IsStatusConditionTrue(n.Conditions, "Updated") &&
			st.Approved == "digest" && st.NodesReady == "1/1" && n.Reason == agent.ReasonUpgraded && !stale
	})
	// The label follows the entry on a write of its own.
	waitUntil(t, "node-a labelled upgraded", func() bool {
		return e.NodeLabels("node-a")[agent.LabelPhase] == string(agent.PhaseUpgraded)
	})
}

// bundleNode is one real agent (approval required, nothing approved in
// its config) with a real CRI-O, against the real API server with ferry's
// CRD, RBAC and admission policies, given a release bundle with ferry
// load, or fetching it from a peer that was.
type bundleNode struct {
	e            *kubeenv.Env
	a            *ferryenv.Agent
	node         string // its Node's name
	meta         *bundle.Metadata
	name, digest string
	tree         string // where the bundle is extracted
	tar          string // the bundle, its .sha256 beside it
}

// givenBundle is the release bundle the technician brings, with e: no
// node or agent yet.
func givenBundle(t *testing.T, e *kubeenv.Env) bundleNode {
	tarPath, meta := releaseBundle(t)
	sidecar, err := os.ReadFile(strings.TrimSuffix(tarPath, ".tar") + ".sha256")
	if err != nil {
		t.Fatal(err)
	}
	return bundleNode{e: e, meta: meta, name: agent.ResourceName(meta.Version, meta.Arch), digest: "sha256:" + strings.Fields(string(sidecar))[0], tar: tarPath}
}

// startBundleNode starts it; admin runs as the administrator before the
// bundle is given (b holds the bundle, not its agent yet).
func startBundleNode(t *testing.T, admin func(e *kubeenv.Env, b bundleNode)) bundleNode {
	return startBundleNodeWith(t, admin, nil)
}

// startBundleNodeWith is startBundleNode with the agent's config set up
// further by configure.
func startBundleNodeWith(t *testing.T, admin func(e *kubeenv.Env, b bundleNode), configure func(*kubeenv.Env, *agent.Config)) bundleNode {
	c := crioenv.Start(t)
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "127.0.0.1")
	e.InstallFerry()
	installBundles(e)
	n := givenBundle(t, e)
	n.node = "node-a"
	if admin != nil {
		admin(e, n)
	}
	n.a = nodeAgent(t, e, n.tar, func(cfg *agent.Config) {
		c.Configure(cfg)
		cfg.Approval = "required"
		n.tree = filepath.Join(cfg.Paths.ExtractDir, n.meta.DirName())
		if configure != nil {
			configure(e, cfg)
		}
	})
	return n
}

// startTwoBundleNodes is startBundleNode with two nodes, node-a and
// node-b, each with its own CRI-O and only its kubelet's identity
// (kubeletAgents): the bundle is given to node-a, node-b fetches it over
// peer TLS.
func startTwoBundleNodes(t *testing.T, admin func(e *kubeenv.Env, b bundleNode)) []bundleNode {
	e := kubeenv.Start(t, current)
	names := []string{"node-a", "node-b"}
	for _, n := range names {
		e.AddNode(n, "127.0.0.1")
	}
	e.InstallFerry()
	installBundles(e)
	b := givenBundle(t, e)
	if admin != nil {
		admin(e, b)
	}
	trees := map[string]string{}
	agents := kubeletAgents(t, e, names, func(node string, cfg *agent.Config) {
		crioenv.Start(t).Configure(cfg)
		cfg.Approval = "required"
		trees[node] = filepath.Join(cfg.Paths.ExtractDir, b.meta.DirName())
	})
	if out, err := agents["node-a"].Ferry("load", b.tar); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	var nodes []bundleNode
	for _, n := range names {
		b.a, b.node, b.tree = agents[n], n, trees[n]
		nodes = append(nodes, b)
	}
	return nodes
}

// nodeAgent starts the agent of node-a with its own credential, set up
// further by configure (nil: as ferryenv makes it), and gives it tarPath
// with ferry load ("" gives nothing).
func nodeAgent(t *testing.T, e *kubeenv.Env, tarPath string, configure func(*agent.Config)) *ferryenv.Agent {
	t.Helper()
	cfg := ferryenv.Config(t.TempDir())
	cfg.NodeName = "node-a"
	cfg.Cluster.Kubeconfig = e.NodeKubeconfig("node-a")
	if configure != nil {
		configure(&cfg)
	}
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, "idle")
	if tarPath == "" {
		return a
	}
	if out, err := a.Ferry("load", tarPath); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	return a
}

// TestAgent_SpecCleanupTakesOutABundleWaitingForApproval: a bundle the
// administrator does not want is taken off the node with oc patch
// (spec.cleanup), no node shell: its extracted tree goes, nothing was
// loaded, and the node says cleaned in the resource.
func TestAgent_SpecCleanupTakesOutABundleWaitingForApproval(t *testing.T) {
	n := startBundleNode(t, nil)
	n.a.Wait(bound, "waiting for approval", func(s agent.Status) bool {
		return s.Reason == agent.ReasonAwaitingApproval
	})
	if _, err := os.Stat(n.tree); err != nil {
		t.Fatalf("the bundle is not extracted: %v", err)
	}
	n.e.PatchBundleSpec(n.name, map[string]any{"cleanup": true})
	waitUntil(t, "node-a cleaned in the UpgradeBundle", func() bool {
		return n.e.BundleNodes(n.name)["node-a"].Phase == string(agent.PhaseCleaned)
	})
	if _, err := os.Stat(n.tree); !os.IsNotExist(err) {
		t.Fatalf("the extracted tree is still there: %v", err)
	}
}

// TestClient_EachNodeWritesOnlyItsOwn (issue 35, item 1; issue 43): with
// each node's writes under its own field manager, the API server's
// managedFields show it: the summary's writer owns the summary and
// nothing of the nodes' entries, each node owns its UpgradeBundleNode
// alone, owned by its Node, and a node's entry changes nothing of the
// UpgradeBundle.
func TestClient_EachNodeWritesOnlyItsOwn(t *testing.T) {
	e := kubeenv.Start(t, current)
	ca := ferryClient(t, e)
	e.AddNode("node-b", "10.0.0.2")
	cb := nodeClient(t, e, "node-b")
	ca.FieldManager, cb.FieldManager = kube.FieldManager("node-a"), kube.FieldManager("node-b")
	installBundles(e)
	ctx := t.Context()
	e.CreateBundle(bundleName)
	d := digest.Digest("sha256:" + strings.Repeat("a", 64))
	sum := cluster.BundleSummary{Version: "4.13.7", Arch: "x86_64", Digest: d, Phase: "loading", NodesReady: "0/2"}
	if err := ca.PublishBundleStatus(ctx, bundleName, sum, "node-a", cluster.BundleNodeEntry{Phase: "loading", Digest: d}); err != nil {
		t.Fatal(err)
	}
	before, _ := e.UpgradeBundle(bundleName)
	if err := cb.PublishBundleEntry(ctx, bundleName, "node-b", cluster.BundleNodeEntry{Phase: "loaded", Digest: d}); err != nil {
		t.Fatal(err)
	}
	o, _ := e.UpgradeBundle(bundleName)
	if o.ResourceVersion != before.ResourceVersion {
		t.Errorf("node-b's entry changed the UpgradeBundle: %+v", o.Status)
	}
	for _, m := range o.ManagedFields {
		if m.Subresource != "status" {
			continue
		}
		if m.Manager != "ferry-node-a" || m.Operation != metav1.ManagedFieldsOperationApply {
			t.Errorf("%s wrote the status with %s, want ferry-node-a alone, by Apply", m.Manager, m.Operation)
		}
		if f := string(m.FieldsV1.Raw); !strings.Contains(f, `"f:nodesReady"`) || strings.Contains(f, `"f:nodes"`) {
			t.Errorf("ferry-node-a owns %s", f)
		}
	}
	for _, n := range []string{"node-a", "node-b"} {
		bn, ok := e.BundleNode(n)
		if !ok || len(bn.Status.Bundles) != 1 || bn.Status.Bundles[0].Name != bundleName {
			t.Fatalf("%s's UpgradeBundleNode: %+v", n, bn)
		}
		if refs := bn.OwnerReferences; len(refs) != 1 || refs[0].Kind != "Node" || refs[0].Name != n || string(refs[0].UID) != e.NodeUID(n) {
			t.Errorf("%s's UpgradeBundleNode is owned by %+v, want its Node alone", n, refs)
		}
		for _, m := range bn.ManagedFields {
			if m.Manager != kube.FieldManager(n) || m.Operation != metav1.ManagedFieldsOperationApply {
				t.Errorf("%s's UpgradeBundleNode written by %s with %s, want %s by Apply", n, m.Manager, m.Operation, kube.FieldManager(n))
			}
		}
	}
	if got := e.BundleNodes(bundleName); got["node-a"].Phase != "loading" || got["node-b"].Phase != "loaded" {
		t.Errorf("the entries: %+v", got)
	}
	// A second bundle: its entry comes first, the first one's stays, and
	// oc get upgradebundlenodes shows the newest.
	if err := cb.PublishBundleEntry(ctx, "4.13.8-x86-64", "node-b", cluster.BundleNodeEntry{Phase: "fetching"}); err != nil {
		t.Fatal(err)
	}
	if bn, _ := e.BundleNode("node-b"); len(bn.Status.Bundles) != 2 || bn.Status.Bundles[0].Name != "4.13.8-x86-64" || bn.Status.Bundles[1].Phase != "loaded" {
		t.Errorf("node-b's entries after a second bundle: %+v", bn.Status.Bundles)
	}
	out, err := kubectl(t, e, "get", "upgradebundlenodes")
	if err != nil || !regexp.MustCompile(`(?m)^node-a\s+`+bundleName+`\s+loading\s`).MatchString(out) || !regexp.MustCompile(`(?m)^node-b\s+4\.13\.8-x86-64\s+fetching\s`).MatchString(out) {
		t.Errorf("kubectl get upgradebundlenodes: %v\n%s", err, out)
	}
}

// TestClient_ThePullersRecordIsItsOwnToWrite (issue 41): the pulling
// node publishes its pull in its own entry (the release, what its tag
// resolved to, then the bundle's digest) in its own UpgradeBundleNode,
// through the shipped CRD and admission policy; the record stays when its
// entry is written again without it; another node reads it there; another
// node's credential cannot write it into the puller's object.
func TestClient_ThePullersRecordIsItsOwnToWrite(t *testing.T) {
	e := kubeenv.Start(t, current)
	c := ferryClient(t, e)
	e.AddNode("node-b", "10.0.0.2")
	cb := nodeClient(t, e, "node-b")
	installBundles(e)
	ctx := t.Context()
	e.CreateBundle(bundleName)
	release := "quay.io/openshift-release-dev/ocp-release@sha256:" + strings.Repeat("1", 64)
	e.PatchBundleSpec(bundleName, map[string]any{"source": map[string]any{"release": release, "extraImages": []string{"quay.io/my-company/my-workload:v1"}}})
	rec := &cluster.PullRecord{Release: release, Extras: map[string]digest.Digest{"quay.io/my-company/my-workload:v1": digest.Digest("sha256:" + strings.Repeat("2", 64))}}
	if err := c.PublishBundleEntry(ctx, bundleName, "node-a", cluster.BundleNodeEntry{Phase: "pulling", Pull: rec}); err != nil {
		t.Fatal(err)
	}
	rec.Digest = digest.Digest("sha256:" + strings.Repeat("3", 64))
	if err := c.PublishBundleEntry(ctx, bundleName, "node-a", cluster.BundleNodeEntry{Phase: "pulling", Pull: rec}); err != nil {
		t.Fatal(err)
	}
	if err := c.PublishBundleEntry(ctx, bundleName, "node-a", cluster.BundleNodeEntry{Phase: "extracting", Digest: rec.Digest}); err != nil {
		t.Fatal(err)
	}
	got, err := cb.PullRecord(ctx, bundleName, "node-a")
	if err != nil || got == nil {
		t.Fatalf("node-a's record as node-b reads it: %+v, %v", got, err)
	}
	if got.Digest != rec.Digest || got.Release != release || got.Extras["quay.io/my-company/my-workload:v1"] != rec.Extras["quay.io/my-company/my-workload:v1"] {
		t.Fatalf("node-a's record as node-b reads it: %+v, want %+v", got, rec)
	}
	lie := &cluster.PullRecord{Release: release, Digest: digest.Digest("sha256:" + strings.Repeat("6", 64))}
	if err := cb.PublishBundleEntry(ctx, bundleName, "node-a", cluster.BundleNodeEntry{Phase: "pulling", Pull: lie}); err == nil || !strings.Contains(err.Error(), "writes the UpgradeBundleNode node-b only, not node-a") {
		t.Errorf("node-b writing node-a's record: %v, want the admission policy's refusal", err)
	}
}
