package kube

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

const leasesPath = "/apis/coordination.k8s.io/v1/namespaces/openshift-ferry/leases"

// withoutClusterWideReads takes from ferry's ClusterRole what a kubelet
// may not have since Kubernetes 1.32 (AuthorizeNodeWithSelectors): a list
// or watch of every Node, a list of every pod. What ferry does must work
// with the kubelet's own rights (its own Node, its own pods) and the
// Leases.
func withoutClusterWideReads(t *testing.T, e *kubeenv.Env) {
	t.Helper()
	const path = "/apis/rbac.authorization.k8s.io/v1/clusterroles/ferry"
	var role map[string]any
	if err := e.Admin.Raw(t.Context(), "GET", path, "", nil, &role); err != nil {
		t.Fatal(err)
	}
	var rules []any
	for _, r := range role["rules"].([]any) {
		rule := r.(map[string]any)
		res := rule["resources"].([]any)
		switch {
		case slices.Contains(res, any("pods")):
			continue
		case slices.Contains(res, any("nodes")):
			rule["verbs"] = []any{"get", "patch"}
		}
		rules = append(rules, rule)
	}
	role["rules"] = rules
	if err := e.Admin.Raw(t.Context(), "PUT", path, "application/json", role, nil); err != nil {
		t.Fatal(err)
	}
}

// follower runs node's Follower and its record, with node's kubelet
// certificate, until the test ends.
func follower(t *testing.T, e *kubeenv.Env, node string) (*kube.Client, *kube.Follower) {
	t.Helper()
	c, err := kube.New(e.NodeCertKubeconfig(node), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Attempts = 1
	f := c.Follow(node)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { f.Run(ctx) })
	wg.Go(func() { f.KeepRecord(ctx, "") })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return c, f
}

// TestLeases_KubeletsFindEachOtherByTheirRecordsAlone: two nodes with
// their kubelets' certificates and none of the cluster-wide reads
// (withoutClusterWideReads) each write their Lease from their own Node
// and see the other's address and readiness as it changes; the record is
// owned by its Node, so that the garbage collector deletes it with the
// Node (this API server runs no garbage collector: the test plays it),
// and a node whose record is gone is no peer.
func TestLeases_KubeletsFindEachOtherByTheirRecordsAlone(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	e.AddNode("node-b", "10.0.0.2")
	e.SetNodeReady("node-a", true, time.Now().Add(-time.Hour))
	e.InstallFerry()
	withoutClusterWideReads(t, e)
	ctx := t.Context()
	_, fa := follower(t, e, "node-a")
	_, fb := follower(t, e, "node-b")

	waitUntil(t, "each node's address in the other's copy", func() bool {
		a, errA := fa.NodeAddresses(ctx)
		b, errB := fb.NodeAddresses(ctx)
		return errA == nil && errB == nil && a["node-b"] == "10.0.0.2" && b["node-a"] == "10.0.0.1"
	})
	r, err := fb.NodeReadiness(ctx)
	if err != nil || !r["node-a"].Ready || r["node-b"].Ready {
		t.Fatalf("readiness seen by node-b: %+v, %v (node-a Ready, node-b with no Ready condition)", r, err)
	}
	since := time.Now().Add(-10 * time.Minute).Truncate(time.Second)
	e.SetNodeReady("node-b", false, since)
	e.SetNodeReady("node-a", false, since)
	waitUntil(t, "node-a NotReady, as its record says, in node-b's copy", func() bool {
		r, err := fb.NodeReadiness(ctx)
		return err == nil && !r["node-a"].Ready && r["node-a"].Since.Equal(since)
	})
	e.SetNodeReady("node-b", true, time.Now())
	waitUntil(t, "node-b Ready in node-a's copy", func() bool {
		r, err := fa.NodeReadiness(ctx)
		return err == nil && r["node-b"].Ready
	})

	// The record is the Lease the design names, owned by its Node.
	var l struct {
		Metadata struct {
			Labels          map[string]string `json:"labels"`
			Annotations     map[string]string `json:"annotations"`
			OwnerReferences []struct {
				APIVersion, Kind, Name, UID string
			} `json:"ownerReferences"`
		} `json:"metadata"`
		Spec struct {
			HolderIdentity       string `json:"holderIdentity"`
			LeaseDurationSeconds int    `json:"leaseDurationSeconds"`
			RenewTime            string `json:"renewTime"`
		} `json:"spec"`
	}
	var n struct {
		Metadata struct{ UID string } `json:"metadata"`
	}
	if err := e.Admin.Raw(ctx, "GET", leasesPath+"/node-b", "", nil, &l); err != nil {
		t.Fatal(err)
	}
	if err := e.Admin.Raw(ctx, "GET", "/api/v1/nodes/node-b", "", nil, &n); err != nil {
		t.Fatal(err)
	}
	o := l.Metadata.OwnerReferences
	if len(o) != 1 || o[0].APIVersion != "v1" || o[0].Kind != "Node" || o[0].Name != "node-b" || o[0].UID != n.Metadata.UID || n.Metadata.UID == "" {
		t.Errorf("owners %+v, want node-b's Node (uid %s) alone", o, n.Metadata.UID)
	}
	if l.Spec.HolderIdentity != "node-b" || l.Spec.LeaseDurationSeconds != 900 || l.Spec.RenewTime == "" || len(l.Metadata.Labels) != 0 ||
		l.Metadata.Annotations["ferry.io/address"] != "10.0.0.2" || l.Metadata.Annotations["ferry.io/ready"] != "true" {
		t.Errorf("lease %+v", l)
	}

	// node-b's Node is deleted; the garbage collector (played here)
	// deletes its Lease: node-b is no peer of node-a's any more, and its
	// ferry, with no Node, writes none again.
	if err := e.Admin.Raw(ctx, "DELETE", "/api/v1/nodes/node-b", "", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.Admin.Raw(ctx, "DELETE", leasesPath+"/node-b", "", nil, nil); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "node-b gone from node-a's peers and readiness", func() bool {
		a, err := fa.NodeAddresses(ctx)
		r, err2 := fa.NodeReadiness(ctx)
		_, inA := a["node-b"]
		_, inR := r["node-b"]
		return err == nil && err2 == nil && !inA && !inR && a["node-a"] == "10.0.0.1"
	})
	time.Sleep(2 * time.Second)
	if err := e.Admin.Raw(ctx, "GET", leasesPath+"/node-b", "", nil, nil); !kube.IsNotFound(err) {
		t.Errorf("node-b's Lease after its Node was deleted: %v, want 404", err)
	}
}

// TestPolicy_ANodeWritesOneLeaseItsOwn: with its kubelet's certificate a
// node writes its own Lease, and the ferry-lease policy refuses another
// node's, a second one, one owned by anything but its own Node, labels,
// other annotations, and every delete.
func TestPolicy_ANodeWritesOneLeaseItsOwn(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	e.AddNode("node-b", "10.0.0.2")
	e.InstallFerry()
	withoutClusterWideReads(t, e)
	ctx := t.Context()
	a, _ := follower(t, e, "node-a")
	_, _ = follower(t, e, "node-b")
	waitUntil(t, "both Leases", func() bool {
		return e.Admin.Raw(ctx, "GET", leasesPath+"/node-a", "", nil, nil) == nil && e.Admin.Raw(ctx, "GET", leasesPath+"/node-b", "", nil, nil) == nil
	})

	leaseOf := func(name, holder, owner string) map[string]any {
		return map[string]any{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
			"metadata": map[string]any{"name": name, "ownerReferences": []any{map[string]any{"apiVersion": "v1", "kind": "Node", "name": owner, "uid": "0000"}}},
			"spec":     map[string]any{"holderIdentity": holder}}
	}
	post := func(l map[string]any) error { return a.Raw(ctx, "POST", leasesPath, "application/json", l, nil) }
	denied(t, "a Lease of another node's name", post(leaseOf("node-c", "node-c", "node-c")), "ferry-lease")
	denied(t, "a second Lease of its own", post(leaseOf("node-a-2", "node-a", "node-a")), "ferry-lease")

	// Its own Lease, as it is, changed one way at a time.
	own := func(change func(md, spec map[string]any)) error {
		var l map[string]any
		if err := a.Raw(ctx, "GET", leasesPath+"/node-a", "", nil, &l); err != nil {
			t.Fatal(err)
		}
		change(l["metadata"].(map[string]any), l["spec"].(map[string]any))
		return a.Raw(ctx, "PUT", leasesPath+"/node-a", "application/json", l, nil)
	}
	if err := own(func(md, spec map[string]any) {}); err != nil {
		t.Fatalf("writing its own Lease as it is: %v", err)
	}
	denied(t, "held by another node", own(func(_, spec map[string]any) { spec["holderIdentity"] = "node-b" }), "ferry-lease")
	denied(t, "owned by another Node", own(func(md, _ map[string]any) {
		md["ownerReferences"] = []any{map[string]any{"apiVersion": "v1", "kind": "Node", "name": "node-b", "uid": "0000"}}
	}), "ferry-lease")
	denied(t, "owned by nothing", own(func(md, _ map[string]any) { delete(md, "ownerReferences") }), "ferry-lease")
	denied(t, "a label", own(func(md, _ map[string]any) { md["labels"] = map[string]any{"evil": "x"} }), "ferry-lease")
	denied(t, "an annotation not ferry.io/", own(func(md, _ map[string]any) {
		md["annotations"].(map[string]any)["evil"] = "x"
	}), "ferry-lease")
	denied(t, "a finalizer", own(func(md, _ map[string]any) { md["finalizers"] = []any{"example.com/keep"} }), "ferry-lease")
	var other map[string]any
	if err := a.Raw(ctx, "GET", leasesPath+"/node-b", "", nil, &other); err != nil {
		t.Fatal(err)
	}
	denied(t, "another node's Lease", a.Raw(ctx, "PUT", leasesPath+"/node-b", "application/json", other, nil), "ferry-lease")
	denied(t, "deleting its own Lease", a.Raw(ctx, "DELETE", leasesPath+"/node-a", "", nil, nil), "ferry-lease")
	denied(t, "deleting another's Lease", a.Raw(ctx, "DELETE", leasesPath+"/node-b", "", nil, nil), "ferry-lease")
	// Nor may it read what a kubelet may not (the cluster-wide reads are
	// gone): every Node, every pod.
	denied(t, "listing the Nodes", a.Raw(ctx, "GET", "/api/v1/nodes", "", nil, nil), "")
	denied(t, "listing every pod", a.Raw(ctx, "GET", "/api/v1/pods", "", nil, nil), "")
}
