package kube

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/fixture"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// A bundle's path, 4.13.6 (the cluster) → 4.14.2 → 4.15.1, as an
// EUS-to-EUS update runs it: the version operator and the machine config
// operator are played as the other tests play them.

// pathBundle makes one bundle of two releases sharing most layers with
// ferry bundle create.
func pathBundle(t *testing.T, versions ...string) (string, *bundle.Metadata) {
	t.Helper()
	reg := fixture.NewRegistry(t)
	args := []string{"bundle", "create", "--quiet", "--mirror", reg.Mirror(), "--cert-dir", reg.CertsDir, "--signature-store", ""}
	for i, v := range versions {
		o := fixture.ReleaseOptions{Version: v, Arch: "x86_64", PayloadImages: 3, Seed: 7}
		if i > 0 {
			o.Shares, o.Own = versions[0], 1
		}
		rel, _ := reg.PushRelease(t, o)
		args = append(args, "--release", rel)
	}
	out := t.TempDir()
	args = append(args, "--output", out)
	if b, err := exec.Command(ferryenv.Binary(t), args...).CombinedOutput(); err != nil {
		t.Fatalf("ferry bundle create: %v\n%s", err, b)
	}
	tarPath := filepath.Join(out, "upgrade-"+versions[len(versions)-1]+"-x86_64.tar")
	meta, err := bundle.InspectFile(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	return tarPath, meta
}

// pool is a MachineConfigPool's spec.paused and ferry's mark on it.
func pool(t *testing.T, e *kubeenv.Env, name string) (paused bool, mark string) {
	t.Helper()
	var p struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			Paused bool `json:"paused"`
		} `json:"spec"`
	}
	if err := e.Admin.Raw(context.Background(), "GET", "/apis/machineconfiguration.openshift.io/v1/machineconfigpools/"+name, "", nil, &p); err != nil {
		t.Fatal(err)
	}
	return p.Spec.Paused, p.Metadata.Annotations[kube.PausedForAnnotation]
}

func desiredImage(e *kubeenv.Env) string {
	if du := e.DesiredUpdate(); du != nil {
		s, _ := du["image"].(string)
		return s
	}
	return ""
}

func pathPools(e *kubeenv.Env) {
	e.InstallMachineConfigPools()
	e.LabelNode("node-a", map[string]string{workerRole: ""})
	e.SetPool(kubeenv.MachineConfigPool{Name: "master", NodeSelector: map[string]string{"node-role.kubernetes.io/master": ""}, Target: "rendered-master-1", Current: "rendered-master-1"})
	e.SetPool(kubeenv.MachineConfigPool{Name: "worker", NodeSelector: map[string]string{workerRole: ""}, Target: oldConfig, Current: oldConfig, Machines: 1, Updated: 1})
	e.SetMachineConfig("node-a", "Done", oldConfig, oldConfig)
}

// TestAgent_APathRunsHopByHopWithTheWorkerPoolPaused: one node with a
// real CRI-O and ferry's RBAC, one bundle 4.14.2 → 4.15.1 from a cluster
// at 4.13.6. Before the first desiredUpdate every image of both releases
// is pinned; the worker pool is paused (master is not); desiredUpdate
// names 4.14.2, and 4.15.1 only once 4.14.2 is Completed; the pool is
// unpaused once 4.15.1 is; the node keeps its mirror until the MCO is
// done with it, then cleans up, its pins staying.
func TestAgent_APathRunsHopByHopWithTheWorkerPoolPaused(t *testing.T) {
	c := crioenv.Start(t)
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "127.0.0.1")
	e.InstallFerry()
	pathPools(e)
	tarPath, meta := pathBundle(t, "4.14.2", "4.15.1")
	hops := meta.Hops()
	for _, h := range hops {
		e.ApproveRelease(h.Release)
	}

	a := nodeAgent(t, e, tarPath, func(cfg *agent.Config) { c.Configure(cfg) })
	waitUntil(t, "the first hop asked for", func() bool { return desiredImage(e) != "" })
	if got := desiredImage(e); got != hops[0].Release {
		t.Fatalf("the first desiredUpdate is %s, want the first hop %s", got, hops[0].Release)
	}
	cl := c.Client(t)
	for _, ref := range bundle.PullRefs(meta.AllImages()) {
		if present, pinned, err := cl.Status(context.Background(), ref); err != nil || !present || !pinned {
			t.Errorf("%s: present %v pinned %v (%v) when the first hop was asked: every hop's images are pinned first", ref, present, pinned, err)
		}
	}
	if paused, mark := pool(t, e, "worker"); !paused || mark == "" {
		t.Errorf("worker pool: paused %v, mark %q; want it paused for the path", paused, mark)
	}
	if paused, _ := pool(t, e, "master"); paused {
		t.Error("the master pool is paused")
	}

	// The first hop runs: desiredUpdate stays on it.
	e.SetHistory(kubeenv.History{State: "Partial", Image: hops[0].Release, Version: hops[0].Version}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	a.WaitPhase(bound, agent.PhaseUpgrading)
	if got := desiredImage(e); got != hops[0].Release {
		t.Fatalf("while the first hop runs, desiredUpdate is %s", got)
	}
	// Completed: the second hop is asked, never before.
	e.SetHistory(kubeenv.History{State: "Completed", Image: hops[0].Release, Version: hops[0].Version}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	waitUntil(t, "the second hop asked for", func() bool { return desiredImage(e) == hops[1].Release })
	if paused, _ := pool(t, e, "worker"); !paused {
		t.Error("the worker pool was unpaused before the last hop")
	}
	e.SetHistory(kubeenv.History{State: "Partial", Image: hops[1].Release, Version: hops[1].Version},
		kubeenv.History{State: "Completed", Image: hops[0].Release, Version: hops[0].Version}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	a.Wait(bound, "the second hop followed", func(s agent.Status) bool {
		return strings.Contains(s.Message, "hop 2 of 2: the cluster is upgrading to 4.15.1")
	})
	e.SetHistory(kubeenv.History{State: "Completed", Image: hops[1].Release, Version: hops[1].Version},
		kubeenv.History{State: "Completed", Image: hops[0].Release, Version: hops[0].Version}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	waitUntil(t, "the worker pool unpaused", func() bool { paused, mark := pool(t, e, "worker"); return !paused && mark == "" })

	// Cleanup waits for the MCO.
	e.SetPool(kubeenv.MachineConfigPool{Name: "worker", NodeSelector: map[string]string{workerRole: ""}, Target: newConfig, Current: oldConfig, Machines: 1})
	e.SetMachineConfig("node-a", "Working", oldConfig, newConfig)
	keepsTheBundle(t, e, a, c, agent.ReasonNodeUpdating)
	e.SetMachineConfig("node-a", "Done", newConfig, newConfig)
	e.SetPool(kubeenv.MachineConfigPool{Name: "worker", NodeSelector: map[string]string{workerRole: ""}, Target: newConfig, Current: newConfig, Machines: 1, Updated: 1})
	a.Wait(bound, "cleaned up", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseUpgraded) && s.Reason == agent.ReasonUpgraded
	})
	for _, ref := range bundle.PullRefs(meta.AllImages()) {
		if present, pinned, err := cl.Status(context.Background(), ref); err != nil || !present || !pinned {
			t.Errorf("%s: present %v pinned %v (%v): every hop's pins stay until the next upgrade", ref, present, pinned, err)
		}
	}
}

// TestClient_APathWithThePoolsLeftAsTheAdministratorChose: spec.pausePools
// false: with a node's credential and ferry's RBAC, AdvancePath asks each
// hop in turn, after the one before is Completed, never pausing a pool;
// Events mark each hop on the UpgradeBundle.
func TestClient_APathWithThePoolsLeftAsTheAdministratorChose(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	e.InstallFerry()
	installBundles(e)
	pathPools(e)
	name := "4.15.1-x86-64"
	e.Create("/apis/ferry.io/v1alpha1/upgradebundles", map[string]any{"apiVersion": "ferry.io/v1alpha1", "kind": "UpgradeBundle",
		"metadata": map[string]any{"name": name}, "spec": map[string]any{"pausePools": false}})
	rel := func(c string) string {
		return "quay.io/openshift-release-dev/ocp-release@sha256:" + strings.Repeat(c, 64)
	}
	p := cluster.Path{Bundle: name, Node: "node-a", Hops: []cluster.Upgrade{{Release: rel("2"), Version: "4.14.2"}, {Release: rel("3"), Version: "4.15.1"}}}
	for _, h := range p.Hops {
		e.ApproveRelease(h.Release)
	}
	c := nodeClient(t, e, "node-a")
	ctx := t.Context()
	advance := func(want cluster.UpgradeState) cluster.UpgradeStatus {
		t.Helper()
		st, err := c.AdvancePath(ctx, p)
		if err != nil || st.State != want {
			t.Fatalf("AdvancePath: %+v, %v; want %q", st, err, want)
		}
		return st
	}
	advance(cluster.UpgradePending)
	if got := desiredImage(e); got != p.Hops[0].Release {
		t.Fatalf("desiredUpdate %s, want the first hop", got)
	}
	e.SetHistory(kubeenv.History{State: "Partial", Image: p.Hops[0].Release, Version: "4.14.2"}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	advance(cluster.UpgradeRunning)
	if got := desiredImage(e); got != p.Hops[0].Release {
		t.Fatalf("desiredUpdate %s while the first hop runs", got)
	}
	e.SetHistory(kubeenv.History{State: "Completed", Image: p.Hops[0].Release, Version: "4.14.2"}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	advance(cluster.UpgradePending)
	if got := desiredImage(e); got != p.Hops[1].Release {
		t.Fatalf("desiredUpdate %s after the first hop, want the second", got)
	}
	e.SetHistory(kubeenv.History{State: "Completed", Image: p.Hops[1].Release, Version: "4.15.1"},
		kubeenv.History{State: "Completed", Image: p.Hops[0].Release, Version: "4.14.2"}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	advance(cluster.UpgradeCompleted)
	for _, name := range []string{"worker", "master"} {
		if paused, mark := pool(t, e, name); paused || mark != "" {
			t.Errorf("pool %s: paused %v, mark %q; the administrator chose not to pause", name, paused, mark)
		}
	}
	// A node's credential may touch a pool's spec.paused and its own mark
	// only, never master's, and never unpause a pool the administrator
	// paused (packaging/admission.yaml, ferry-machineconfigpools).
	e.SetPool(kubeenv.MachineConfigPool{Name: "infra", NodeSelector: map[string]string{"node-role.kubernetes.io/infra": ""}, Paused: true, Target: "rendered-infra-1", Current: "rendered-infra-1"})
	mark := map[string]any{kube.PausedForAnnotation: "sha256-" + strings.Repeat("3", 64)}
	pools := "/apis/machineconfiguration.openshift.io/v1/machineconfigpools/"
	for _, tc := range []struct {
		what, pool string
		patch      map[string]any
	}{
		{"pause master", "master", map[string]any{"metadata": map[string]any{"annotations": mark}, "spec": map[string]any{"paused": true}}},
		{"pause unmarked", "worker", map[string]any{"spec": map[string]any{"paused": true}}},
		{"change a pool's configuration", "worker", map[string]any{"spec": map[string]any{"configuration": map[string]any{"name": "rendered-worker-evil"}}}},
		{"unpause the administrator's pause", "infra", map[string]any{"spec": map[string]any{"paused": false}}},
	} {
		if err := merge(t, c, pools+tc.pool, tc.patch); !errors.Is(err, kube.ErrForbidden) {
			t.Errorf("%s with a node's credential: %v, want Forbidden", tc.what, err)
		}
	}
	if paused, _ := pool(t, e, "infra"); !paused {
		t.Error("the administrator's paused pool was unpaused")
	}
	evs := e.Events(name)
	asked := slices.DeleteFunc(slices.Clone(evs), func(s string) bool { return !strings.Contains(s, "PathHopAsked") })
	if len(asked) != 2 || !strings.Contains(strings.Join(asked, "\n"), "hop 1 of 2: asking the cluster for 4.14.2") || !strings.Contains(strings.Join(asked, "\n"), "hop 2 of 2: asking the cluster for 4.15.1") {
		t.Errorf("events:\n%s\nwant one PathHopAsked for each hop", strings.Join(evs, "\n"))
	}
}

// TestAgent_APathWithAGapIsRefusedBeforeAnyByteMoves: a cluster at
// 4.13.6 and a bundle 4.15.1 → 4.16.0: the node refuses it, naming the
// missing minor, before it is extracted or shared.
func TestAgent_APathWithAGapIsRefusedBeforeAnyByteMoves(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "127.0.0.1")
	e.InstallFerry()
	tarPath, meta := pathBundle(t, "4.15.1", "4.16.0")
	a := nodeAgent(t, e, tarPath, nil)
	s := a.WaitPhase(bound, agent.PhaseRejected)
	if s.Reason != agent.ReasonPreflightRefused || !strings.Contains(s.Message, "skips 4.14") {
		t.Fatalf("reason %s: %q; want the preflight's refusal naming 4.14", s.Reason, s.Message)
	}
	if _, err := statDir(a.Cfg.Paths.ExtractDir, meta.DirName()); err == nil {
		t.Error("the refused bundle was extracted")
	}
	if got := desiredImage(e); got != "" {
		t.Errorf("desiredUpdate set to %s", got)
	}
}
