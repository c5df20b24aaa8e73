package kube

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/ferry-edge/ferry/api/v1alpha1"
	"github.com/ferry-edge/ferry/cluster"
)

// The resource's JSON becomes ferry's types here: a duration parsed, a
// condition's lastTransitionTime a time, and back the same way.
func TestUpgradeBundle_TheWireFormatStaysInKube(t *testing.T) {
	var o v1alpha1.UpgradeBundle
	if err := json.Unmarshal([]byte(`{"metadata":{"name":"4.13.7-x86-64","uid":"u1"},
	 "spec":{"approvedDigest":"sha256:aa","schedule":"Manual","proceed":true,"excludedNodes":["b"],"notReadyTimeout":"90s","cleanup":true},
	 "status":{"nodes":{"a":{"phase":"loaded","digest":"sha256:aa","reason":"Loaded","message":"m","excluded":"x",
	  "conditions":[{"type":"Loaded","status":"True","reason":"Loaded","lastTransitionTime":"2026-11-22T07:00:00Z"}]}}}}`), &o); err != nil {
		t.Fatal(err)
	}
	since := time.Date(2026, 11, 22, 7, 0, 0, 0, time.UTC)
	want := cluster.BundleView{UID: "u1",
		Policy: cluster.BundlePolicy{ApprovedDigest: "sha256:aa", Schedule: "Manual", Proceed: true, ExcludedNodes: []string{"b"}, NotReadyTimeout: 90 * time.Second, Cleanup: true},
		Nodes: map[string]cluster.BundleNodeEntry{"a": {Phase: "loaded", Digest: "sha256:aa", Reason: "Loaded", Message: "m", Excluded: "x",
			Conditions: []cluster.BundleCondition{{Type: "Loaded", Status: "True", Reason: "Loaded", Since: since}}}}}
	if got := view(&o); !reflect.DeepEqual(got, want) {
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
// entry and comes back the same, and each source carries every node's
// record, for the agent to take only its puller's (issue 41).
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
	var o v1alpha1.UpgradeBundle
	o.Name = "4.13.8-x86-64"
	o.Spec.Source = &v1alpha1.BundleSource{Release: rec.Release, ExtraImages: []string{"quay.io/x/y:v1"}}
	var n v1alpha1.NodeStatus
	if err := json.Unmarshal(b, &n); err != nil {
		t.Fatal(err)
	}
	o.Status.Nodes = map[string]v1alpha1.NodeStatus{"node-0": n, "node-1": {Phase: "pulling"}}
	if got := view(&o).Nodes["node-0"].Pull; !reflect.DeepEqual(got, rec) {
		t.Fatalf("read back %+v, want %+v", got, rec)
	}
	srcs := sourcesOf([]v1alpha1.UpgradeBundle{o})
	if len(srcs) != 1 || len(srcs[0].Pulled) != 1 || !reflect.DeepEqual(srcs[0].Pulled["node-0"], *rec) {
		t.Fatalf("sources %+v", srcs)
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
