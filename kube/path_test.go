package kube

import (
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/cluster"
)

// TestAdvancePath_ARefusedHopStopsThePathAndSaysSo: the second hop
// refused by the version operator: the path is refused, naming the hop
// and where it stops, in the operator's words.
func TestAdvancePath_ARefusedHopStopsThePathAndSaysSo(t *testing.T) {
	rel := func(c string) string {
		return "quay.io/openshift-release-dev/ocp-release@sha256:" + strings.Repeat(c, 64)
	}
	cv := map[string]any{
		"spec": map[string]any{"desiredUpdate": map[string]any{"image": rel("3"), "version": "4.18.10"}},
		"status": map[string]any{
			"history": []any{
				map[string]string{"state": "Completed", "image": rel("2"), "version": "4.17.20"},
				map[string]string{"state": "Completed", "image": rel("1"), "version": "4.16.3"},
			},
			"conditions": []any{map[string]string{"type": "ReleaseAccepted", "status": "False", "message": "The update cannot be verified: no signature"}},
		},
	}
	c := fakeAPI(t, map[string]any{clusterVersionPath: cv})
	p := cluster.Path{Hops: []cluster.Upgrade{{Release: rel("2"), Version: "4.17.20"}, {Release: rel("3"), Version: "4.18.10"}}}
	st, err := c.AdvancePath(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	// The whole text, golden: the hop, where the path stops, the
	// operator's words.
	if st.State != cluster.UpgradeRefused || st.Reason != "hop 2 of 2 (4.18.10) failed: the path stops at 4.17.20: The update cannot be verified: no signature" {
		t.Errorf("AdvancePath = %+v; want refused, naming the hop, where it stops and the operator's words", st)
	}
	if st.Path == nil || st.Path.From != "4.16.3" || len(st.Path.Hops) != 2 || st.Path.Hops[0].State != cluster.HopCompleted ||
		st.Path.Hops[1].State != cluster.HopFailed || st.Path.Hops[1].Message != st.Reason {
		t.Errorf("the path's progress: %+v; want from 4.16.3, hop 1 Completed, hop 2 Failed saying why", st.Path)
	}
}

// TestAdvancePath_UpgradeableFalseHoldsTheNextMinorHop: the first hop
// Completed, the operator says Upgradeable=False: the second hop waits,
// in the operator's words, and is not asked.
func TestAdvancePath_UpgradeableFalseHoldsTheNextMinorHop(t *testing.T) {
	rel := func(c string) string {
		return "quay.io/openshift-release-dev/ocp-release@sha256:" + strings.Repeat(c, 64)
	}
	cv := map[string]any{
		"spec": map[string]any{"desiredUpdate": map[string]any{"image": rel("2"), "version": "4.17.20"}},
		"status": map[string]any{
			"history": []any{
				map[string]string{"state": "Completed", "image": rel("2"), "version": "4.17.20"},
				map[string]string{"state": "Completed", "image": rel("1"), "version": "4.16.3"},
			},
			"conditions": []any{map[string]string{"type": "Upgradeable", "status": "False", "reason": "AdminAckRequired", "message": "Kubernetes 1.31 removes APIs in use"}},
		},
	}
	c := fakeAPI(t, map[string]any{clusterVersionPath: cv})
	p := cluster.Path{Hops: []cluster.Upgrade{{Release: rel("2"), Version: "4.17.20"}, {Release: rel("3"), Version: "4.18.10"}}}
	st, err := c.AdvancePath(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != cluster.UpgradePending ||
		st.Reason != "hop 2 of 2 (4.18.10) waits: the cluster is not upgradeable to a new minor version (Upgradeable=False, AdminAckRequired): Kubernetes 1.31 removes APIs in use" {
		t.Errorf("AdvancePath = %+v; want the second hop waiting, in the operator's words", st)
	}
	if st.Path == nil || st.Path.Hops[1].State != cluster.HopHeld || st.Path.Hops[1].Message != st.Reason || st.Path.Current() != 1 {
		t.Errorf("the path's progress: %+v; want hop 2 Held, in progress, saying why", st.Path)
	}
	// A node that only reads the path says the same.
	if ro, err := c.PathStatus(t.Context(), p); err != nil || ro.Reason != st.Reason || ro.Path == nil || ro.Path.Hops[1].State != cluster.HopHeld {
		t.Errorf("PathStatus = %+v, %v; want hop 2 held as AdvancePath says it", ro, err)
	}
}

// TestPathStatus_TakesNoStep: a node that did not start the path (or
// before the upgrade is asked for) only reads: nothing asked yet is
// UpgradeNotAsked, and it writes nothing, though AdvancePath would pause
// the worker pool.
func TestPathStatus_TakesNoStep(t *testing.T) {
	rel := func(c string) string {
		return "quay.io/openshift-release-dev/ocp-release@sha256:" + strings.Repeat(c, 64)
	}
	objs := map[string]any{
		clusterVersionPath: map[string]any{"status": map[string]any{"history": []any{map[string]string{"state": "Completed", "image": rel("1"), "version": "4.16.3"}}}},
		poolsPath: map[string]any{"items": []any{
			map[string]any{"metadata": map[string]any{"name": "master"}, "spec": map[string]any{}},
			map[string]any{"metadata": map[string]any{"name": "worker"}, "spec": map[string]any{}},
		}},
	}
	var writes []string
	c := fakeAPIWrites(t, objs, &writes)
	p := cluster.Path{Hops: []cluster.Upgrade{{Release: rel("2"), Version: "4.17.20"}, {Release: rel("3"), Version: "4.18.10"}}}
	st, err := c.PathStatus(t.Context(), p)
	if err != nil || st.State != cluster.UpgradeNotAsked || len(writes) > 0 {
		t.Fatalf("PathStatus: %+v, %v, writes %v; want not asked, nothing written", st, err, writes)
	}
	c.AdvancePath(t.Context(), p) // the fake answers its write 404: only the write counts
	if len(writes) == 0 || writes[0] != "PATCH "+poolsPath+"/worker" {
		t.Errorf("AdvancePath writes %v; want the worker pool paused first", writes)
	}
}
