package machine

import (
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
)

// pathRecord is the held bundle with a path 4.17.20 → 4.18.10.
func pathRecord(m *Machine) *Record {
	r := m.Active
	md := *r.Metadata
	md.Version, md.Path = "4.18.10", []bundle.Hop{{Version: "4.17.20", Release: "quay.io/r@sha256:" + strings.Repeat("2", 64)}, {Version: "4.18.10", Release: md.Release}}
	r.Metadata = &md
	return r
}

// TestPathSummary_SaysThePathTheHopInProgressAndEachHop: the summary's
// path fields, from the metadata alone before a reading, then as the
// readings go.
func TestPathSummary_SaysThePathTheHopInProgressAndEachHop(t *testing.T) {
	m := machineIn(t, PhaseClusterReady)
	r := pathRecord(m)
	for _, tc := range []struct {
		read        *PathRead
		path, hop   string
		states      string
		firstSaidBy string
	}{
		{nil, "4.17.20 → 4.18.10", "0/2", "Pending Pending", ""},
		{&PathRead{From: "4.16.3", Hops: []HopRead{{State: "Held", Message: "hop 1 of 2 (4.17.20) waits: …"}, {State: "Pending"}}}, "4.16.3 → 4.17.20 → 4.18.10", "1/2", "Held Pending", "hop 1 of 2 (4.17.20) waits: …"},
		{&PathRead{From: "4.16.3", Hops: []HopRead{{State: "Upgrading"}, {State: "Pending"}}}, "4.16.3 → 4.17.20 → 4.18.10", "1/2", "Upgrading Pending", ""},
		{&PathRead{From: "4.16.3", Hops: []HopRead{{State: "Completed"}, {State: "Pending"}}}, "4.16.3 → 4.17.20 → 4.18.10", "2/2", "Completed Pending", ""},
		{&PathRead{From: "4.16.3", Hops: []HopRead{{State: "Completed"}, {State: "Completed"}}}, "4.16.3 → 4.17.20 → 4.18.10", "2/2", "Completed Completed", ""},
	} {
		r.Path = tc.read
		var sum cluster.BundleSummary
		pathSummary(r, &sum)
		var states []string
		for _, h := range sum.Hops {
			states = append(states, h.State)
		}
		if sum.Path != tc.path || sum.Hop != tc.hop || strings.Join(states, " ") != tc.states || sum.Hops[0].Message != tc.firstSaidBy ||
			sum.Hops[0].Release != r.Metadata.Path[0].Release || sum.Hops[1].Version != "4.18.10" {
			t.Errorf("read %+v: summary %q %q %+v; want %q %q %s", tc.read, sum.Path, sum.Hop, sum.Hops, tc.path, tc.hop, tc.states)
		}
	}
	var one cluster.BundleSummary
	pathSummary(heldRecord(), &one)
	if one.Path != "" || one.Hop != "" || one.Hops != nil {
		t.Errorf("a bundle of one release: %+v, want no path", one)
	}
}

// TestPathSeen_AFailedHopStopsThePathUntilAPersonResumesIt: on the node
// that takes the path's steps, a refused hop stops it: later readings
// that say otherwise do not move it on; ferry proceed asks again; so does
// spec.proceed written after the stop, not one standing from before.
func TestPathSeen_AFailedHopStopsThePathUntilAPersonResumesIt(t *testing.T) {
	m := machineIn(t, PhaseClusterReady)
	m.HasAPI = true
	r := pathRecord(m)
	r.Upgrade = &UpgradeRun{Requested: m.Now(), Accepted: m.Now()}
	m.bundleName, m.bundleGeneration = ResourceName("4.18.10", "x86_64"), 3
	m.bundlePolicy = &cluster.BundlePolicy{Proceed: true}
	failed := "hop 1 of 2 (4.17.20) failed: the path stops at 4.16.3: no signature"
	path := func(s cluster.HopState) *cluster.PathProgress {
		return &cluster.PathProgress{From: "4.16.3", Hops: []cluster.HopProgress{{State: s}, {State: cluster.HopPending}}}
	}
	m.Step(EvUpgradeSeen{Release: r.Metadata.Release, St: cluster.UpgradeStatus{State: cluster.UpgradeRefused, Reason: failed, Path: path(cluster.HopFailed)}})
	if r.Upgrade.Stopped != failed || r.Upgrade.StoppedAt != 3 || r.Condition.Reason != ReasonReleaseRefused || r.Path.Hops[0].State != "Failed" {
		t.Fatalf("after the refusal: upgrade %+v, condition %+v, path %+v; want the path stopped at generation 3", r.Upgrade, r.Condition, r.Path)
	}
	// desiredUpdate cleared, the operator quiet: still stopped.
	m.Step(EvUpgradeSeen{Release: r.Metadata.Release, St: cluster.UpgradeStatus{State: cluster.UpgradePending, Path: path(cluster.HopPending)}})
	if r.Condition.Reason != ReasonReleaseRefused || r.Upgrade.Stopped == "" {
		t.Fatalf("a quiet reading moved a stopped path on: %+v, %+v", r.Condition, r.Upgrade)
	}
	// spec.proceed standing from before the stop: nothing.
	if effs := m.Step(EvCluster{Policy: &PolicyRead{Name: m.bundleName, Policy: cluster.BundlePolicy{Proceed: true}, Generation: 3}}); hasAsk(effs) {
		t.Fatal("a spec.proceed from before the stop resumed the path")
	}
	// Written after it: asked again.
	if effs := m.Step(EvCluster{Policy: &PolicyRead{Name: m.bundleName, Policy: cluster.BundlePolicy{Proceed: true}, Generation: 4}}); !hasAsk(effs) || r.Upgrade.Stopped != "" {
		t.Fatalf("spec.proceed written after the stop: effects %v, upgrade %+v; want the path asked again", effs, r.Upgrade)
	}
	m.Step(EvUpgradeAsked{ID: r.ID})
	// Stopped again, then ferry proceed.
	m.Step(EvUpgradeSeen{Release: r.Metadata.Release, St: cluster.UpgradeStatus{State: cluster.UpgradeRefused, Reason: failed, Path: path(cluster.HopFailed)}})
	if r.Upgrade.Stopped != failed || r.Upgrade.StoppedAt != 4 {
		t.Fatalf("stopped again: %+v", r.Upgrade)
	}
	if effs := m.Step(EvRequest{Kind: reqProceed, Reply: ReplyID(7)}); !hasAsk(effs) {
		t.Fatalf("ferry proceed on a stopped path: %v; want it asked again", effs)
	}
}

func hasAsk(effs []Effect) bool {
	for _, e := range effs {
		if _, ok := e.(EffAskUpgrade); ok {
			return true
		}
	}
	return false
}

// TestUpgradeSeen_AHeldHopSaysTheAdministratorsWordAsItIs: a hop held by
// an admin gate is said in the gate's words with the command, not as a
// wait for the version operator.
func TestUpgradeSeen_AHeldHopSaysTheAdministratorsWordAsItIs(t *testing.T) {
	m := machineIn(t, PhaseUpgrading)
	m.HasAPI = true
	r := pathRecord(m)
	held := "hop 2 of 2 (4.18.10) waits: the cluster requires an administrator's acknowledgement first: … give it with oc -n openshift-config patch cm admin-acks --type=merge -p '{}'"
	m.Step(EvUpgradeSeen{Release: r.Metadata.Release, St: cluster.UpgradeStatus{State: cluster.UpgradePending, Reason: held,
		Path: &cluster.PathProgress{From: "4.16.3", Hops: []cluster.HopProgress{{State: cluster.HopCompleted}, {State: cluster.HopHeld, Message: held}}}}})
	if r.Condition.Reason != ReasonUpgradePending || r.Condition.Message != held || r.Phase != PhaseUpgrading {
		t.Errorf("condition %+v in %s; want the held hop's words as they are", r.Condition, r.Phase)
	}
}
