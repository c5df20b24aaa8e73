package kube

import (
	"cmp"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/api/v1alpha1"
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

func pathPools(e *kubeenv.Env, nodes ...string) {
	e.InstallMachineConfigPools()
	for _, n := range nodes {
		e.LabelNode(n, map[string]string{workerRole: ""})
		e.SetMachineConfig(n, "Done", oldConfig, oldConfig)
	}
	e.SetPool(kubeenv.MachineConfigPool{Name: "master", NodeSelector: map[string]string{"node-role.kubernetes.io/master": ""}, Target: "rendered-master-1", Current: "rendered-master-1"})
	e.SetPool(kubeenv.MachineConfigPool{Name: "worker", NodeSelector: map[string]string{workerRole: ""}, Target: oldConfig, Current: oldConfig, Machines: len(nodes), Updated: len(nodes)})
}

// pathSays waits until the UpgradeBundle's status says the path, the hop
// in progress and each hop's state as want ("Asked Pending").
func pathSays(t *testing.T, e *kubeenv.Env, name, path, hop, states string) v1alpha1.UpgradeBundleStatus {
	t.Helper()
	var st v1alpha1.UpgradeBundleStatus
	read := func() string {
		var got []string
		for _, h := range st.Hops {
			got = append(got, h.State)
		}
		return st.Path + " | " + st.Hop + " | " + strings.Join(got, " ")
	}
	want := path + " | " + hop + " | " + states
	deadline := time.Now().Add(bound)
	for {
		o, _ := e.UpgradeBundle(name)
		if st = o.Status; read() == want {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("the UpgradeBundle's path says %q, want %q", read(), want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestAgents_APathRunsHopByHopWithTheWorkerPoolPaused: two nodes, each
// with a real CRI-O and only its kubelet's identity, one bundle 4.14.2 →
// 4.15.1 from a cluster at 4.13.6, plugged into node-a, schedule Manual.
// Before the first desiredUpdate (nothing asked until proceed) every
// image of both releases is pinned on both nodes and each says so; the worker pool is paused (master is not); desiredUpdate
// names 4.14.2, and 4.15.1 only once 4.14.2 is Completed; the pool is
// unpaused once 4.15.1 is; each node keeps its mirror until the MCO is
// done with it, then cleans up, its pins staying. The UpgradeBundle says
// the path, the hop in progress (oc get's Hop column) and each hop's
// state; Events mark each hop. A hop that fails stops the path where it
// is, saying so, however the cluster moves after; spec.proceed (the first
// hop) and ferry proceed (the second) resume it.
func TestAgents_APathRunsHopByHopWithTheWorkerPoolPaused(t *testing.T) {
	e := twoNodeCluster(t)
	nodes := []string{"node-a", "node-b"}
	pathPools(e, nodes...)
	tarPath, meta := pathBundle(t, "4.14.2", "4.15.1")
	hops := meta.Hops()
	for _, h := range hops {
		e.ApproveRelease(h.Release)
	}
	name := agent.ResourceName(meta.Version, meta.Arch)
	// Manual: every node loaded, the path waits for proceed, and what
	// every node holds then is what the cluster is first asked with.
	e.PatchBundleSpec(name, map[string]any{"schedule": "Manual"})
	crios := map[string]*crioenv.CRIO{}
	agents := kubeletAgents(t, e, nodes, func(n string, cfg *agent.Config) {
		crios[n] = crioenv.Start(t)
		crios[n].Configure(cfg)
	})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the UpgradeBundle: %v\nits events:\n%s", e.Bundle(name), strings.Join(e.Events(name), "\n"))
		}
	})
	if out, err := agents["node-a"].Ferry("load", tarPath); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	for _, n := range nodes {
		agents[n].WaitPhase(bound, agent.PhaseClusterReady)
	}
	if got := desiredImage(e); got != "" {
		t.Fatalf("desiredUpdate %s before proceed", got)
	}
	for _, n := range nodes {
		cl := crios[n].Client(t)
		for _, ref := range bundle.PullRefs(meta.AllImages()) {
			if present, pinned, err := cl.Status(context.Background(), ref); err != nil || !present || !pinned {
				t.Errorf("%s: %s present %v pinned %v (%v) before the first hop is asked: every hop's images are pinned on every node first", n, ref, present, pinned, err)
			}
		}
		// Each node says so: every image of the path (its status line:
		// "N images pinned, every hop's (4.14.2 → 4.15.1)").
		s, err := agents[n].Status(context.Background())
		if err != nil || s.Phase != string(agent.PhaseClusterReady) || s.Progress == nil || s.Progress.Total != int64(len(meta.AllImages())) ||
			!slices.Equal(s.Path, []string{"4.14.2", "4.15.1"}) {
			t.Errorf("%s: %+v (%v); want cluster-ready with the %d images of the path 4.14.2 → 4.15.1 pinned", n, s, err, len(meta.AllImages()))
		}
	}
	const path = "4.13.6 → 4.14.2 → 4.15.1"
	pathSays(t, e, name, path, "0/2", "Pending Pending")
	if paused, _ := pool(t, e, "worker"); paused {
		t.Error("the worker pool is paused before the path starts")
	}
	e.PatchBundleSpec(name, map[string]any{"proceed": true})
	waitUntil(t, "the first hop asked for", func() bool { return desiredImage(e) != "" })
	if got := desiredImage(e); got != hops[0].Release {
		t.Fatalf("the first desiredUpdate is %s, want the first hop %s", got, hops[0].Release)
	}
	if paused, mark := pool(t, e, "worker"); !paused || mark == "" {
		t.Errorf("worker pool: paused %v, mark %q; want it paused for the path", paused, mark)
	}
	if paused, _ := pool(t, e, "master"); paused {
		t.Error("the master pool is paused")
	}
	pathSays(t, e, name, path, "1/2", "Asked Pending")
	if out, err := kubectl(t, e, "get", "upgradebundles"); err != nil || !regexp.MustCompile(`(?m)^NAME .* HOP .*\n`+regexp.QuoteMeta(name)+` .* 1/2 `).MatchString(out) {
		t.Errorf("kubectl get upgradebundles: %v\n%s\nwant a HOP column saying 1/2", err, out)
	}

	// The first hop refused: the path stops, saying so on the node that
	// takes its steps; the administrator clears desiredUpdate and the
	// operator accepts again: ferry asks nothing until spec.proceed is
	// written again (it stands true from the start: false, then true).
	refused := kubeenv.Condition{Type: "ReleaseAccepted", Status: "False", Reason: "RetrievePayload", Message: "The update cannot be verified: no signature"}
	e.SetConditions(refused)
	s := agents["node-a"].Wait(bound, "the path stopped at the first hop", func(s agent.Status) bool {
		return s.Reason == agent.ReasonReleaseRefused && strings.Contains(s.Message, "hop 1 of 2 (4.14.2) failed: the path stops at 4.13.6: The update cannot be verified")
	})
	for _, want := range []string{"ferry proceed", `oc patch upgradebundle ` + name + ` --type=merge -p '{"spec":{"proceed":true}}'`} {
		if !strings.Contains(s.Message, want) {
			t.Errorf("node-a's message %q does not say %q", s.Message, want)
		}
	}
	pathSays(t, e, name, path, "1/2", "Failed Pending")
	clearDesiredUpdate(t, e)
	e.SetConditions(kubeenv.Condition{Type: "ReleaseAccepted", Status: "True", Reason: "PayloadLoaded"})
	pathSays(t, e, name, path, "0/2", "Pending Pending") // read by node-a, the summary's writer, which took no step
	if got := desiredImage(e); got != "" {
		t.Fatalf("desiredUpdate %s after the path stopped: ferry asked again with no one's word", got)
	}
	e.PatchBundleSpec(name, map[string]any{"proceed": false})
	e.PatchBundleSpec(name, map[string]any{"proceed": true})
	waitUntil(t, "the first hop asked again on spec.proceed", func() bool { return desiredImage(e) == hops[0].Release })

	// The first hop runs: desiredUpdate stays on it.
	e.SetHistory(kubeenv.History{State: "Partial", Image: hops[0].Release, Version: hops[0].Version}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	agents["node-a"].WaitPhase(bound, agent.PhaseUpgrading)
	pathSays(t, e, name, path, "1/2", "Upgrading Pending")
	if got := desiredImage(e); got != hops[0].Release {
		t.Fatalf("while the first hop runs, desiredUpdate is %s", got)
	}
	// Completed: the second hop is asked, never before.
	e.SetHistory(kubeenv.History{State: "Completed", Image: hops[0].Release, Version: hops[0].Version}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	waitUntil(t, "the second hop asked for", func() bool { return desiredImage(e) == hops[1].Release })
	pathSays(t, e, name, path, "2/2", "Completed Asked")
	if paused, _ := pool(t, e, "worker"); !paused {
		t.Error("the worker pool was unpaused before the last hop")
	}

	// The second hop refused: stopped again; spec.proceed, standing from
	// before, does not resume it; ferry proceed does.
	e.SetConditions(refused)
	agents["node-a"].Wait(bound, "the path stopped at the second hop", func(s agent.Status) bool {
		return s.Reason == agent.ReasonReleaseRefused && strings.Contains(s.Message, "hop 2 of 2 (4.15.1) failed: the path stops at 4.14.2")
	})
	clearDesiredUpdate(t, e)
	e.SetConditions(kubeenv.Condition{Type: "ReleaseAccepted", Status: "True", Reason: "PayloadLoaded"})
	pathSays(t, e, name, path, "2/2", "Completed Pending")
	if got := desiredImage(e); got != "" {
		t.Fatalf("desiredUpdate %s after the path stopped again", got)
	}
	if out, err := agents["node-a"].Ferry("proceed"); err != nil {
		t.Fatalf("ferry proceed: %v\n%s", err, out)
	}
	waitUntil(t, "the second hop asked again on ferry proceed", func() bool { return desiredImage(e) == hops[1].Release })

	e.SetHistory(kubeenv.History{State: "Partial", Image: hops[1].Release, Version: hops[1].Version},
		kubeenv.History{State: "Completed", Image: hops[0].Release, Version: hops[0].Version}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	for _, n := range nodes {
		agents[n].Wait(bound, n+": the second hop followed", func(s agent.Status) bool {
			return strings.Contains(s.Message, "hop 2 of 2: the cluster is upgrading to 4.15.1")
		})
	}
	e.SetHistory(kubeenv.History{State: "Completed", Image: hops[1].Release, Version: hops[1].Version},
		kubeenv.History{State: "Completed", Image: hops[0].Release, Version: hops[0].Version}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	waitUntil(t, "the worker pool unpaused", func() bool { paused, mark := pool(t, e, "worker"); return !paused && mark == "" })
	pathSays(t, e, name, path, "2/2", "Completed Completed")

	// Cleanup waits for the MCO.
	for _, n := range nodes {
		e.SetMachineConfig(n, "Working", oldConfig, newConfig)
	}
	e.SetPool(kubeenv.MachineConfigPool{Name: "worker", NodeSelector: map[string]string{workerRole: ""}, Target: newConfig, Current: oldConfig, Machines: 2})
	// The node's words while the MCO works on it, not those of a reading
	// before (still on the old config), which keepsTheBundle would take.
	agents["node-a"].Wait(bound, "node-a: waiting for the MCO at work", func(s agent.Status) bool {
		return s.Reason == agent.ReasonNodeUpdating && strings.Contains(s.Message, "(state Working, "+oldConfig+" → "+newConfig+")")
	})
	keepsTheBundle(t, e, agents["node-a"], crios["node-a"], agent.ReasonNodeUpdating)
	// The pool first: the nodes' own change wakes the agents, which
	// read the pool afresh with it (pools are not watched).
	e.SetPool(kubeenv.MachineConfigPool{Name: "worker", NodeSelector: map[string]string{workerRole: ""}, Target: newConfig, Current: newConfig, Machines: 2, Updated: 2})
	for _, n := range nodes {
		e.SetMachineConfig(n, "Done", newConfig, newConfig)
	}
	for _, n := range nodes {
		agents[n].Wait(bound, n+": cleaned up", func(s agent.Status) bool {
			return s.Phase == string(agent.PhaseUpgraded) && s.Reason == agent.ReasonUpgraded
		})
		cl := crios[n].Client(t)
		for _, ref := range bundle.PullRefs(meta.AllImages()) {
			if present, pinned, err := cl.Status(context.Background(), ref); err != nil || !present || !pinned {
				t.Errorf("%s: %s present %v pinned %v (%v): every hop's pins stay until the next upgrade", n, ref, present, pinned, err)
			}
		}
	}
	evs := strings.Join(e.Events(name), "\n")
	for _, want := range []string{"PathPoolsPaused", "PathHopAsked: node-a: hop 1 of 2: asking the cluster for 4.14.2",
		"PathHopFailed: node-a: hop 1 of 2 (4.14.2) failed", "PathHopCompleted: node-a: hop 1 of 2: the cluster is at 4.14.2 (Completed)",
		"PathHopAsked: node-a: hop 2 of 2: asking the cluster for 4.15.1", "PathHopFailed: node-a: hop 2 of 2 (4.15.1) failed",
		"PathHopCompleted: node-a: hop 2 of 2: the cluster is at 4.15.1 (Completed)", "PathPoolsUnpaused"} {
		if !strings.Contains(evs, want) {
			t.Errorf("no Event %q in:\n%s", want, evs)
		}
	}
}

// clearDesiredUpdate is oc adm upgrade --clear, as the administrator.
func clearDesiredUpdate(t *testing.T, e *kubeenv.Env) {
	t.Helper()
	if err := e.Admin.Raw(context.Background(), "PATCH", "/apis/config.openshift.io/v1/clusterversions/version", "application/merge-patch+json",
		map[string]any{"spec": map[string]any{"desiredUpdate": nil}}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestClient_PathsHopByHopAsTheVersionOperatorAllows: two paths, one
// after the other on one API server, each with a node's credential and
// ferry's RBAC.
func TestClient_PathsHopByHopAsTheVersionOperatorAllows(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	e.InstallFerry()
	installBundles(e)
	pathPools(e, "node-a")
	c := nodeClient(t, e, "node-a")
	aPathWithThePoolsLeftAsTheAdministratorChose(t, e, c)
	aPathTo5_0FollowsTheVersionOperatorsRulesHopByHop(t, e, c)
}

// aPathWithThePoolsLeftAsTheAdministratorChose: spec.pausePools false:
// AdvancePath asks each hop in turn, after the one before is Completed,
// never pausing a pool; Events mark each hop on the UpgradeBundle.
func aPathWithThePoolsLeftAsTheAdministratorChose(t *testing.T, e *kubeenv.Env, c *kube.Client) {
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

// aPathTo5_0FollowsTheVersionOperatorsRulesHopByHop: the cluster at
// 4.21.7 and a path 4.22.9 → 5.0.2 (4.last → 5.0): the preflight takes
// it and refuses a path that goes back or crosses to 5.1; the worker pool
// is paused for it; Upgradeable=False holds the first (minor) hop until
// the operator says otherwise; an admin gate of 4.22 holds the second
// (major) hop once the first is Completed, every reading saying the
// gate and the command that acknowledges it, and the hop goes on once
// acknowledged with that command.
func aPathTo5_0FollowsTheVersionOperatorsRulesHopByHop(t *testing.T, e *kubeenv.Env, c *kube.Client) {
	// The cluster as one at 4.21.7 would be, nothing asked.
	e.SetHistory(kubeenv.History{State: "Completed", Image: current, Version: "4.21.7"})
	clearDesiredUpdate(t, e)
	name := "5.0.2-x86-64"
	e.CreateBundle(name)
	rel := func(c string) string {
		return "quay.io/openshift-release-dev/ocp-release@sha256:" + strings.Repeat(c, 64)
	}
	p := cluster.Path{Bundle: name, Node: "node-a", Hops: []cluster.Upgrade{{Release: rel("4"), Version: "4.22.9"}, {Release: rel("5"), Version: "5.0.2"}}}
	for _, h := range p.Hops {
		e.ApproveRelease(h.Release)
	}
	ctx := t.Context()

	for _, tc := range []struct {
		path []string
		says string // "" taken
	}{
		{[]string{"4.22.9", "5.0.2"}, ""},
		{[]string{"4.21.3", "4.22.9"}, "4.21.3 is older than the cluster's 4.21.7: OpenShift does not downgrade"},
		{[]string{"4.22.9", "5.1.0"}, "4.22.9 to 5.1.0 crosses a major version"},
		{[]string{"4.22.9", "4.24.1"}, "4.22.9 to 4.24.1 skips 4.23"},
	} {
		pf, err := c.PreflightPath(ctx, "node-a", tc.path, nil)
		got := strings.Join(pf.Refusals, "; ")
		if err != nil || tc.says == "" && got != "" || tc.says != "" && !strings.Contains(got, tc.says) {
			t.Errorf("preflight of %v: %q, %v; want %q", tc.path, got, err, cmp.Or(tc.says, "taken"))
		}
	}

	advance := func(want cluster.UpgradeState, states ...cluster.HopState) cluster.UpgradeStatus {
		t.Helper()
		st, err := c.AdvancePath(ctx, p)
		if err != nil || st.State != want || st.Path == nil || len(st.Path.Hops) != len(states) {
			t.Fatalf("AdvancePath: %+v, %v; want %q", st, err, want)
		}
		for i, h := range st.Path.Hops {
			if h.State != states[i] {
				t.Fatalf("AdvancePath: hop %d %s (%s), want %s", i+1, h.State, h.Message, states[i])
			}
		}
		return st
	}
	e.SetConditions(kubeenv.Condition{Type: "Upgradeable", Status: "False", Reason: "ClusterOperatorsNotUpgradeable", Message: "Cluster operator storage should not be upgraded between minor versions"})
	st := advance(cluster.UpgradePending, cluster.HopHeld, cluster.HopPending)
	if want := "hop 1 of 2 (4.22.9) waits: the cluster is not upgradeable to a new minor version (Upgradeable=False, ClusterOperatorsNotUpgradeable): Cluster operator storage should not be upgraded between minor versions"; st.Reason != want {
		t.Errorf("held hop: %q, want %q", st.Reason, want)
	}
	if got := desiredImage(e); got != "" {
		t.Fatalf("desiredUpdate %s while Upgradeable=False", got)
	}
	if paused, _ := pool(t, e, "worker"); !paused {
		t.Error("the worker pool is not paused for a path to 5.0")
	}
	e.SetConditions(kubeenv.Condition{Type: "Upgradeable", Status: "True", Reason: "AsExpected"})
	advance(cluster.UpgradePending, cluster.HopAsked, cluster.HopPending)
	if got := desiredImage(e); got != p.Hops[0].Release {
		t.Fatalf("desiredUpdate %s, want the first hop", got)
	}

	const gate = "ack-4.22-kube-1.35-api-removals-in-5.0"
	e.SetConfigMap("openshift-config-managed", "admin-gates", map[string]string{gate: "Kubernetes 1.35 removes v1beta1 APIs in use"})
	e.SetConfigMap("openshift-config", "admin-acks", map[string]string{})
	e.SetHistory(kubeenv.History{State: "Completed", Image: p.Hops[0].Release, Version: "4.22.9"}, kubeenv.History{State: "Completed", Image: current, Version: "4.21.7"})
	st = advance(cluster.UpgradePending, cluster.HopCompleted, cluster.HopHeld)
	wantCmd := `oc -n openshift-config patch cm admin-acks --type=merge -p '{"data":{"` + gate + `":"true"}}'`
	if want := "hop 2 of 2 (5.0.2) waits: the cluster requires an administrator's acknowledgement first: " + gate +
		" (Kubernetes 1.35 removes v1beta1 APIs in use): once done what it asks, give it with " + wantCmd; st.Reason != want || st.Path.Hops[1].Message != st.Reason {
		t.Errorf("held hop: %q, want the gate and %s", st.Reason, wantCmd)
	}
	advance(cluster.UpgradePending, cluster.HopCompleted, cluster.HopHeld) // read again: no second Event for the same hold
	if ro, err := c.PathStatus(ctx, p); err != nil || ro.Reason != st.Reason {
		t.Errorf("PathStatus: %+v, %v; want the same words for a node that only reads", ro, err)
	}
	if got := desiredImage(e); got != p.Hops[0].Release {
		t.Fatalf("desiredUpdate %s while the admin gate is not acknowledged", got)
	}
	// The command as the message gives it (kubectl for oc).
	args := strings.Fields(strings.TrimPrefix(strings.TrimSuffix(wantCmd, `'{"data":{"`+gate+`":"true"}}'`), "oc "))
	if out, err := kubectl(t, e, append(args, `{"data":{"`+gate+`":"true"}}`)...); err != nil {
		t.Fatalf("kubectl %v: %v\n%s", args, err, out)
	}
	advance(cluster.UpgradePending, cluster.HopCompleted, cluster.HopAsked)
	if got := desiredImage(e); got != p.Hops[1].Release {
		t.Fatalf("desiredUpdate %s once acknowledged, want 5.0.2", got)
	}
	e.SetHistory(kubeenv.History{State: "Completed", Image: p.Hops[1].Release, Version: "5.0.2"},
		kubeenv.History{State: "Completed", Image: p.Hops[0].Release, Version: "4.22.9"}, kubeenv.History{State: "Completed", Image: current, Version: "4.21.7"})
	advance(cluster.UpgradeCompleted, cluster.HopCompleted, cluster.HopCompleted)
	if paused, mark := pool(t, e, "worker"); paused || mark != "" {
		t.Errorf("worker pool: paused %v, mark %q after the path", paused, mark)
	}
	held := slices.DeleteFunc(e.Events(name), func(s string) bool { return !strings.Contains(s, "PathHopHeld") })
	if len(held) != 2 {
		t.Errorf("PathHopHeld events:\n%s\nwant one for each hold", strings.Join(held, "\n"))
	}
}
