package kubeenv

import (
	"context"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/api/v1alpha1"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/kube"
)

// What the administrator does with ferry's UpgradeBundle resource, with
// oc, in the tests.

const bundlesPath = "/apis/ferry.io/v1alpha1/upgradebundles"

// InstallUpgradeBundles applies ferry's CRDs, the UpgradeBundle's and
// the UpgradeBundleNode's (their admission policies are in
// admission.yaml, InstallFerry).
func (e *Env) InstallUpgradeBundles(crd string) {
	e.t.Helper()
	e.ApplyFile(crd)
	deadline := time.Now().Add(30 * time.Second)
	for e.Admin.Raw(context.Background(), "GET", bundlesPath, "", nil, nil) != nil || e.Admin.Raw(context.Background(), "GET", bundleNodesPath, "", nil, nil) != nil {
		if time.Now().After(deadline) {
			e.t.Fatal("the UpgradeBundle and UpgradeBundleNode CRDs never became established")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The admission policies (InstallFerry's) hold for the new types once
	// a credential bound to no Node is refused a summary's write (to a
	// resource the administrator made, so that the policy is what
	// answers: a node may create none) and an UpgradeBundleNode.
	const probeBundle = "0.0.0-probe-x86-64"
	ctx := context.Background()
	e.CreateBundle(probeBundle)
	defer e.Admin.Raw(ctx, "DELETE", bundlesPath+"/"+probeBundle, "", nil, nil)
	c, err := kube.New(e.ServiceAccountKubeconfig("openshift-ferry", "ferry"), nil)
	must(e.t, err)
	c.Attempts = 1
	for {
		err := c.PublishBundleSummary(ctx, probeBundle, "probe", cluster.BundleSummary{Phase: "idle"})
		nerr := ApplyBundleNode(ctx, c, "probe", "probe", "00000000-0000-0000-0000-000000000000", nil)
		if err != nil && strings.Contains(err.Error(), "bound to no Node") && nerr != nil && strings.Contains(nerr.Error(), "bound to no Node") {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the ferry-upgradebundle and ferry-upgradebundlenode admission policies never held (apply InstallFerry first): %v; %v", err, nerr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

const bundleNodesPath = "/apis/ferry.io/v1alpha1/upgradebundlenodes"

// ApplyBundleNode applies, with c's credential, the UpgradeBundleNode
// name owned by Node owner (its uid), holding bundles, as a node's ferry
// does (server-side apply as ferry-<name>): for the tests of what the
// admission policy refuses.
func ApplyBundleNode(ctx context.Context, c *kube.Client, name, owner, uid string, bundles []v1alpha1.BundleNodeStatus) error {
	if bundles == nil {
		bundles = []v1alpha1.BundleNodeStatus{}
	}
	body := map[string]any{"apiVersion": "ferry.io/v1alpha1", "kind": "UpgradeBundleNode",
		"metadata": map[string]any{"name": name, "ownerReferences": []map[string]any{{"apiVersion": "v1", "kind": "Node", "name": owner, "uid": uid}}},
		"status":   map[string]any{"bundles": bundles}}
	return c.Raw(ctx, "PATCH", bundleNodesPath+"/"+name+"?fieldManager="+kube.FieldManager(name), "application/apply-patch+yaml", body, nil)
}

// BundleNodes is every node's entry for the UpgradeBundle name, from the
// nodes' UpgradeBundleNodes, decoded into ferry's API types, by node.
func (e *Env) BundleNodes(name string) map[string]v1alpha1.NodeStatus {
	e.t.Helper()
	var list v1alpha1.UpgradeBundleNodeList
	must(e.t, e.Admin.Raw(context.Background(), "GET", bundleNodesPath, "", nil, &list))
	out := map[string]v1alpha1.NodeStatus{}
	for _, o := range list.Items {
		for _, b := range o.Status.Bundles {
			if b.Name == name {
				out[o.Name] = b.NodeStatus
			}
		}
	}
	return out
}

// BundleNode is node's UpgradeBundleNode as stored (ok false when there
// is none).
func (e *Env) BundleNode(node string) (o v1alpha1.UpgradeBundleNode, ok bool) {
	e.t.Helper()
	err := e.Admin.Raw(context.Background(), "GET", bundleNodesPath+"/"+node, "", nil, &o)
	if kube.IsNotFound(err) {
		return o, false
	}
	must(e.t, err)
	return o, true
}

// NodeUID is the uid of the Node node.
func (e *Env) NodeUID(node string) string {
	e.t.Helper()
	var n struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
	}
	must(e.t, e.Admin.Raw(context.Background(), "GET", "/api/v1/nodes/"+node, "", nil, &n))
	return n.Metadata.UID
}

// PatchBundleSpec merge-patches an UpgradeBundle's spec as the
// administrator (oc patch upgradebundle NAME --type=merge -p '{"spec":…}'),
// creating the resource first if there is none.
func (e *Env) PatchBundleSpec(name string, spec map[string]any) {
	e.t.Helper()
	ctx := context.Background()
	err := e.Admin.Raw(ctx, "PATCH", bundlesPath+"/"+name, "application/merge-patch+json", map[string]any{"spec": spec}, nil)
	if kube.IsNotFound(err) {
		err = e.Admin.Raw(ctx, "POST", bundlesPath, "application/json", map[string]any{"apiVersion": "ferry.io/v1alpha1", "kind": "UpgradeBundle",
			"metadata": map[string]any{"name": name}, "spec": spec}, nil)
	}
	must(e.t, err)
}

// UpgradeBundle returns an UpgradeBundle decoded into ferry's API types,
// as kube/ decodes it; ok is false when there is none.
func (e *Env) UpgradeBundle(name string) (o v1alpha1.UpgradeBundle, ok bool) {
	e.t.Helper()
	err := e.Admin.Raw(context.Background(), "GET", bundlesPath+"/"+name, "", nil, &o)
	if kube.IsNotFound(err) {
		return v1alpha1.UpgradeBundle{}, false
	}
	must(e.t, err)
	return o, true
}

// Bundle returns an UpgradeBundle as stored, every field the API server
// holds (nil when there is none): for a test's log.
// CreateBundle creates an UpgradeBundle with a spec of defaults as the
// administrator (a node creates none: ferry approve or oc apply does).
// The spec holds one field (cleanup: false): the API server tracks no
// managedFields on an object created owning none, not even the nodes'
// later writes, as ferry approve's approvedDigest and oc apply's
// annotation each give it one.
func (e *Env) CreateBundle(name string) {
	e.t.Helper()
	must(e.t, e.Admin.Raw(context.Background(), "POST", bundlesPath, "application/json", map[string]any{"apiVersion": "ferry.io/v1alpha1", "kind": "UpgradeBundle",
		"metadata": map[string]any{"name": name}, "spec": map[string]any{"cleanup": false}}, nil))
}

// Bundle returns an UpgradeBundle as stored (nil when there is none).
func (e *Env) Bundle(name string) map[string]any {
	e.t.Helper()
	var o map[string]any
	err := e.Admin.Raw(context.Background(), "GET", bundlesPath+"/"+name, "", nil, &o)
	if kube.IsNotFound(err) {
		return nil
	}
	must(e.t, err)
	return o
}

// Events returns the reasons and messages of the Events on the
// UpgradeBundle name.
func (e *Env) Events(name string) []string {
	e.t.Helper()
	var list struct {
		Items []struct {
			InvolvedObject struct {
				Kind string `json:"kind"`
				Name string `json:"name"`
			} `json:"involvedObject"`
			Type    string `json:"type"`
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"items"`
	}
	must(e.t, e.Admin.Raw(context.Background(), "GET", "/api/v1/namespaces/default/events", "", nil, &list))
	var out []string
	for _, ev := range list.Items {
		if ev.InvolvedObject.Kind == "UpgradeBundle" && ev.InvolvedObject.Name == name {
			out = append(out, ev.Type+" "+ev.Reason+": "+ev.Message)
		}
	}
	return out
}

// NodeLabels returns a Node's labels.
func (e *Env) NodeLabels(node string) map[string]string {
	e.t.Helper()
	var n struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	must(e.t, e.Admin.Raw(context.Background(), "GET", "/api/v1/nodes/"+node, "", nil, &n))
	return n.Metadata.Labels
}

// SetNodeReady writes a Node's Ready condition, as its kubelet (or the
// node lifecycle controller, for a node gone silent) does.
func (e *Env) SetNodeReady(node string, ready bool, since time.Time) {
	e.t.Helper()
	status := "True"
	if !ready {
		status = "Unknown"
	}
	patch := map[string]any{"status": map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": status,
		"reason": "KubeletReady", "lastTransitionTime": since.UTC().Format(time.RFC3339), "lastHeartbeatTime": since.UTC().Format(time.RFC3339)}}}}
	must(e.t, e.Admin.Raw(context.Background(), "PATCH", "/api/v1/nodes/"+node+"/status", "application/strategic-merge-patch+json", patch, nil))
}

const leasesPath = "/apis/coordination.k8s.io/v1/namespaces/openshift-ferry/leases/"

// Lease is the annotations of node's record for its peers (its Lease,
// which its ferry writes); found is false while it has none.
func (e *Env) Lease(node string) (annotations map[string]string, found bool) {
	e.t.Helper()
	var l struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	err := e.Admin.Raw(context.Background(), "GET", leasesPath+node, "", nil, &l)
	if kube.IsNotFound(err) {
		return nil, false
	}
	must(e.t, err)
	return l.Metadata.Annotations, true
}

// ExpireLease plays the time for a node whose ferry is down: its record
// was last renewed so long ago that it expired at at.
func (e *Env) ExpireLease(node string, at time.Time) {
	e.t.Helper()
	var l struct {
		Spec struct {
			LeaseDurationSeconds int `json:"leaseDurationSeconds"`
		} `json:"spec"`
	}
	must(e.t, e.Admin.Raw(context.Background(), "GET", leasesPath+node, "", nil, &l))
	renewed := at.Add(-time.Duration(l.Spec.LeaseDurationSeconds) * time.Second).UTC().Format("2006-01-02T15:04:05.000000Z07:00")
	patch := map[string]any{"spec": map[string]any{"renewTime": renewed}}
	must(e.t, e.Admin.Raw(context.Background(), "PATCH", leasesPath+node, "application/merge-patch+json", patch, nil))
}

// RecordNode plays the record of a node whose ferry the test runs outside
// an agent (a peer played by the test): its Lease, ready, at address, as
// the node's own ferry writes it (kube.Follower.KeepRecord).
func (e *Env) RecordNode(node, address string) {
	e.t.Helper()
	now := time.Now().UTC()
	l := map[string]any{
		"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
		"metadata": map[string]any{"name": node, "namespace": "openshift-ferry", "annotations": map[string]string{
			kube.AnnotationAddress: address, kube.AnnotationReady: "true", kube.AnnotationReadySince: now.Format(time.RFC3339)}},
		"spec": map[string]any{"holderIdentity": node, "leaseDurationSeconds": 900, "renewTime": now.Format("2006-01-02T15:04:05.000000Z07:00")},
	}
	must(e.t, e.Admin.Raw(context.Background(), "POST", strings.TrimSuffix(leasesPath, "/"), "application/json", l, nil))
}
