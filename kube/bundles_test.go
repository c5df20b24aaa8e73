package kube

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/api/v1alpha1"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
)

// The resource's JSON becomes ferry's types here: a duration parsed, a
// condition's lastTransitionTime a time, and back the same way.
func TestUpgradeBundle_TheWireFormatStaysInKube(t *testing.T) {
	var o v1alpha1.UpgradeBundle
	if err := json.Unmarshal([]byte(`{"metadata":{"name":"4.13.7-x86-64","uid":"u1"},
	 "spec":{"approvedDigest":"sha256:aa","schedule":"Manual","proceed":true,"excludedNodes":["b"],"notReadyTimeout":"90s","cleanup":true}}`), &o); err != nil {
		t.Fatal(err)
	}
	var n v1alpha1.UpgradeBundleNode
	if err := json.Unmarshal([]byte(`{"metadata":{"name":"a"},"status":{"bundles":[{"name":"4.13.7-x86-64","phase":"loaded","digest":"sha256:aa","reason":"Loaded","message":"m","excluded":"x",
	  "conditions":[{"type":"Loaded","status":"True","reason":"Loaded","lastTransitionTime":"2026-11-22T07:00:00Z"}]},{"name":"4.13.6-x86-64","phase":"upgraded"}]}}`), &n); err != nil {
		t.Fatal(err)
	}
	since := time.Date(2026, 11, 22, 7, 0, 0, 0, time.UTC)
	want := cluster.BundleView{UID: "u1",
		Policy: cluster.BundlePolicy{ApprovedDigest: "sha256:aa", Schedule: "Manual", Proceed: true, ExcludedNodes: []string{"b"}, NotReadyTimeout: 90 * time.Second, Cleanup: true},
		Nodes: map[string]cluster.BundleNodeEntry{"a": {Phase: "loaded", Digest: "sha256:aa", Reason: "Loaded", Message: "m", Excluded: "x",
			Conditions: []cluster.BundleCondition{{Type: "Loaded", Status: "True", Reason: "Loaded", Since: since}}}}}
	if got := view(&o, entriesFor([]v1alpha1.UpgradeBundleNode{n}, o.Name)); !reflect.DeepEqual(got, want) {
		t.Fatalf("view\n%+v, want\n%+v", got, want)
	}
	// A transition ferry does not know is written as the write's time:
	// a metav1.Condition always has one.
	local, now := since.In(time.FixedZone("CET", 3600)), since.Add(time.Hour)
	b, err := json.Marshal(entryOf(cluster.BundleNodeEntry{Phase: "loaded", Conditions: []cluster.BundleCondition{{Type: "Loaded", Status: "True", Since: local}, {Type: "Updated", Status: "False"}}}, now))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"lastTransitionTime":"2026-11-22T07:00:00Z"`) || !strings.Contains(string(b), `"lastTransitionTime":"2026-11-22T08:00:00Z"`) {
		t.Fatalf("conditions as written: %s", b)
	}
	if b, _ := json.Marshal(entryOf(cluster.BundleNodeEntry{Phase: "idle"}, now)); strings.Contains(string(b), "conditions") {
		t.Fatalf("no conditions written as %s, want none (an apply then takes them out)", b)
	}
}

// The pulling node's record of its pull (registry mode) goes into its
// entry and comes back the same; the agent reads only its puller's
// (issue 41).
func TestUpgradeBundle_ThePullRecordRoundTrips(t *testing.T) {
	d, x := digest.Digest("sha256:"+strings.Repeat("a", 64)), digest.Digest("sha256:"+strings.Repeat("b", 64))
	rec := &cluster.PullRecord{Release: "quay.io/r@" + string(d), Digest: d, Extras: map[string]digest.Digest{"quay.io/x/y:v1": x}}
	b, err := json.Marshal(entryOf(cluster.BundleNodeEntry{Phase: "pulling", Pull: rec}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"extras":[{"image":"quay.io/x/y:v1","digest":"sha256:bbbb`) {
		t.Fatalf("written as %s", b)
	}
	var n v1alpha1.NodeStatus
	if err := json.Unmarshal(b, &n); err != nil {
		t.Fatal(err)
	}
	objs := []v1alpha1.UpgradeBundleNode{{Status: v1alpha1.UpgradeBundleNodeStatus{Bundles: []v1alpha1.BundleNodeStatus{{Name: "4.13.8-x86-64", NodeStatus: n}}}},
		{Status: v1alpha1.UpgradeBundleNodeStatus{Bundles: []v1alpha1.BundleNodeStatus{{Name: "4.13.8-x86-64", NodeStatus: v1alpha1.NodeStatus{Phase: "pulling"}}}}}}
	objs[0].Name, objs[1].Name = "node-0", "node-1"
	got := entriesFor(objs, "4.13.8-x86-64")
	if !reflect.DeepEqual(got["node-0"].Pull, rec) || got["node-1"].Pull != nil {
		t.Fatalf("read back %+v, want %+v", got, rec)
	}
	if e := entryOf(cluster.BundleNodeEntry{Phase: "loaded"}, time.Now()); e.Pull != nil {
		t.Fatalf("no record written as %+v", e.Pull)
	}
}

// Each approval comes with the resource that holds it: the agent counts
// only the bundle's own (issue 45, item 1).
func TestApprovedOf_SaysWhichResourceApproves(t *testing.T) {
	var a, b, c v1alpha1.UpgradeBundle
	a.Name, a.Spec.ApprovedDigest = "4.19.8-x86-64", "sha256:aa"
	b.Name, b.Spec.ApprovedDigest = "4.19.8-amd64", "sha256:aa"
	c.Name = "4.19.9-x86-64"
	want := []cluster.Approval{{Bundle: "4.19.8-x86-64", Digest: "sha256:aa"}, {Bundle: "4.19.8-amd64", Digest: "sha256:aa"}}
	if got := approvedOf([]v1alpha1.UpgradeBundle{a, b, c}); !reflect.DeepEqual(got, want) {
		t.Fatalf("approvedOf = %+v, want %+v", got, want)
	}
}

// A node's entries: the one written now first, the pull record kept once
// written, the entries of UpgradeBundles that are gone dropped, at most
// MaxBundleEntries.
func TestWithEntry_KeepsThePullRecordAndDropsTheGone(t *testing.T) {
	rec := &v1alpha1.PullStatus{Release: "quay.io/r@sha256:" + strings.Repeat("a", 64)}
	old := []v1alpha1.BundleNodeStatus{{Name: "b1", NodeStatus: v1alpha1.NodeStatus{Phase: "upgraded"}}, {Name: "b2", NodeStatus: v1alpha1.NodeStatus{Phase: "pulling", Pull: rec}},
		{Name: "gone", NodeStatus: v1alpha1.NodeStatus{Phase: "upgraded"}}}
	got := withEntry(old, "b2", v1alpha1.NodeStatus{Phase: "loaded"}, func(b string) bool { return b != "gone" })
	if len(got) != 2 || got[0].Name != "b2" || got[0].Phase != "loaded" || got[0].Pull != rec || got[1].Name != "b1" {
		t.Fatalf("withEntry = %+v", got)
	}
	for i := range 2 * MaxBundleEntries {
		got = withEntry(got, fmt.Sprint("n", i), v1alpha1.NodeStatus{Phase: "idle"}, nil)
	}
	if len(got) != MaxBundleEntries || got[0].Name != fmt.Sprint("n", 2*MaxBundleEntries-1) {
		t.Fatalf("after %d bundles: %d entries, first %s", 2*MaxBundleEntries, len(got), got[0].Name)
	}
}
