package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/api/v1alpha1"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// TestAgents_TwentyIdleNodesAskTheAPIAtMostTwiceAMinuteAndSeeAnApprovalAtOnce:
// twenty real agents, each with its own node's credential, holding one
// bundle that waits for approval (nothing moving), cost the API server
// at most 2 requests a minute each, by the server's own
// apiserver_request_total (the window with the agents less one without
// them); the approvedDigest the administrator then writes is seen by
// every one of them within 2 s.
func TestAgents_TwentyIdleNodesAskTheAPIAtMostTwiceAMinuteAndSeeAnApprovalAtOnce(t *testing.T) {
	const nodes, window, quiet = 20, 60 * time.Second, 20 * time.Second
	e := kubeenv.Start(t, current)
	e.InstallFerry()
	installBundles(e)
	tarPath, meta := releaseBundle(t)
	name, digest := agent.ResourceName(meta.Version, meta.Arch), sidecarDigest(t, tarPath)
	e.CreateBundle(name) // the administrator's, empty: a node creates none
	var names []string
	for i := range nodes {
		names = append(names, fmt.Sprintf("node-%02d", i))
		e.AddNode(names[i], fmt.Sprintf("10.0.1.%d", i+1))
	}
	kcs := map[string]string{}
	for _, n := range names {
		kcs[n] = e.NodeKubeconfig(n)
	}

	// The server on its own, scaled to the window.
	before := e.Requests()
	time.Sleep(quiet)
	alone := kubeenv.Delta(before, e.Requests())

	agents := map[string]*ferryenv.Agent{}
	for _, n := range names {
		cfg := ferryenv.Config(t.TempDir())
		cfg.NodeName, cfg.Cluster.Kubeconfig, cfg.Approval = n, kcs[n], "required"
		agents[n] = ferryenv.Start(t, cfg)
	}
	for _, n := range names {
		agents[n].WaitPhase(bound, "idle")
		if out, err := agents[n].Ferry("load", tarPath); err != nil {
			t.Fatalf("%s: ferry load: %v\n%s", n, err, out)
		}
	}
	for _, n := range names {
		agents[n].Wait(bound, "waiting for approval", func(s agent.Status) bool { return s.Reason == agent.ReasonAwaitingApproval })
	}
	// Settled: every node's entry is in, and the object has not changed
	// for 5 s (the nodes' first writes are not idling).
	waitUntil(t, "every node's entry", func() bool { return len(e.BundleNodes(name)) == nodes })
	for rv, since := "", time.Now(); time.Since(since) < 5*time.Second; time.Sleep(200 * time.Millisecond) {
		md, _ := e.Bundle(name)["metadata"].(map[string]any)
		if now, _ := md["resourceVersion"].(string); now != rv {
			rv, since = now, time.Now()
		}
	}

	before = e.Requests()
	time.Sleep(window)
	with := kubeenv.Delta(before, e.Requests())
	total, base := kubeenv.Sum(with), kubeenv.Sum(alone)*float64(window)/float64(quiet)
	perNode := (total - base) / nodes / window.Minutes()
	rss := int64(0)
	for _, n := range names {
		rss += vmRSS(t, agents[n].Cmd.Process.Pid)
	}
	t.Logf("requests in %s with %d agents waiting for approval: %.0f (the server alone, scaled: %.0f): %.2f per node per minute; mean agent RSS %.1f MiB\n  with: %s\n  alone: %s",
		window, nodes, total, base, perNode, float64(rss)/nodes/(1<<20), show(with), show(alone))
	if perNode > 2 {
		t.Errorf("%.2f API requests per idle node per minute, want at most 2", perNode)
	}

	// The administrator approves the engineer's digest: every node takes
	// it (its log names it) within 2 s, and goes on.
	start := time.Now()
	e.PatchBundleSpec(name, map[string]any{"approvedDigest": digest})
	seen := map[string]time.Duration{}
	for len(seen) < nodes && time.Since(start) < 30*time.Second {
		for _, n := range names {
			if _, ok := seen[n]; !ok && strings.Contains(agents[n].Logs(), "approved digests from the cluster's UpgradeBundles") {
				seen[n] = time.Since(start)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	slowest := time.Duration(0)
	for _, n := range names {
		d, ok := seen[n]
		if !ok {
			t.Errorf("%s never saw the approval:\n%s", n, agents[n].Logs())
			continue
		}
		slowest = max(slowest, d)
	}
	t.Logf("the approval seen by %d nodes; the slowest after %s", len(seen), slowest.Round(time.Millisecond))
	if slowest > 2*time.Second {
		t.Errorf("a node saw the approval only after %s, want at most 2 s", slowest.Round(time.Millisecond))
	}
	for _, n := range names {
		agents[n].Wait(bound, "approved", func(s agent.Status) bool {
			return s.Phase != string(agent.PhaseIdle) && s.Reason != agent.ReasonAwaitingApproval
		})
	}
}

func sidecarDigest(t *testing.T, tarPath string) string {
	t.Helper()
	b, err := os.ReadFile(strings.TrimSuffix(tarPath, ".tar") + ".sha256")
	if err != nil {
		t.Fatal(err)
	}
	return "sha256:" + strings.Fields(string(b))[0]
}

// TestAgents_ANodesWriteReachesNoOtherNodesObjectAndTheBundleOnlyWithTheSummary
// (issue 43, item 1): three agents write their entries of one
// UpgradeBundle as their bundle moves (waiting for approval, approved,
// going on). Every version of a node's UpgradeBundleNode the
// administrator's watch sees changes that node's own entries (written by
// it alone): no node's write is an event on another node's object. Every
// version of the UpgradeBundle changes the spec (the administrator) or
// the summary (or who owns it, as the writer moves): a node's entry is no
// event there. The summary counts the three nodes and names the digest
// their entries name.
func TestAgents_ANodesWriteReachesNoOtherNodesObjectAndTheBundleOnlyWithTheSummary(t *testing.T) {
	nodes := []string{"node-a", "node-b", "node-c"}
	e := kubeenv.Start(t, current)
	e.InstallFerry()
	installBundles(e)
	tarPath, meta := releaseBundle(t)
	name, digest := agent.ResourceName(meta.Version, meta.Arch), sidecarDigest(t, tarPath)
	e.PatchBundleSpec(name, map[string]any{"schedule": "Manual"})
	bundles := watchVersions(t, e, "/apis/ferry.io/v1alpha1/upgradebundles", "metadata.name="+name)
	objects := watchVersions(t, e, "/apis/ferry.io/v1alpha1/upgradebundlenodes", "")

	agents := map[string]*ferryenv.Agent{}
	for _, n := range nodes {
		e.AddNode(n, "127.0.0.1")
		cfg := ferryenv.Config(t.TempDir())
		cfg.NodeName, cfg.Cluster.Kubeconfig, cfg.Approval = n, e.NodeKubeconfig(n), "required"
		agents[n] = ferryenv.Start(t, cfg)
		agents[n].WaitPhase(bound, "idle")
	}
	for n, a := range agents {
		if out, err := a.Ferry("load", tarPath); err != nil {
			t.Fatalf("%s: ferry load: %v\n%s", n, err, out)
		}
	}
	for _, a := range agents {
		a.Wait(bound, "waiting for approval", func(s agent.Status) bool { return s.Reason == agent.ReasonAwaitingApproval })
	}
	waitUntil(t, "3/3 nodes in the summary", func() bool { o, _ := e.UpgradeBundle(name); return strings.HasSuffix(o.Status.NodesReady, "/3") })
	e.PatchBundleSpec(name, map[string]any{"approvedDigest": digest})
	for _, a := range agents {
		a.Wait(bound, "approved", func(s agent.Status) bool {
			return s.Phase != string(agent.PhaseIdle) && s.Reason != agent.ReasonAwaitingApproval
		})
	}
	waitUntil(t, "every node approved in its UpgradeBundleNode", func() bool {
		entries := e.BundleNodes(name)
		for _, n := range nodes {
			if en, ok := entries[n]; !ok || en.Reason == agent.ReasonAwaitingApproval {
				return false
			}
		}
		return true
	})
	waitUntil(t, "the summary approved", func() bool {
		o, _ := e.UpgradeBundle(name)
		return apimeta.IsStatusConditionTrue(o.Status.Conditions, "Approved")
	})

	ubn := objects.stop()
	writes := 0
	for _, obj := range ubn {
		for i, v := range obj {
			var o v1alpha1.UpgradeBundleNode
			if err := json.Unmarshal(v, &o); err != nil {
				t.Fatal(err)
			}
			for _, m := range o.ManagedFields {
				if m.Manager != kube.FieldManager(o.Name) {
					t.Errorf("%s's UpgradeBundleNode written by %s", o.Name, m.Manager)
				}
			}
			if i == 0 {
				continue
			}
			var prev v1alpha1.UpgradeBundleNode
			json.Unmarshal(obj[i-1], &prev)
			if reflect.DeepEqual(prev.Status, o.Status) {
				t.Errorf("%s's UpgradeBundleNode: version %d changes none of its entries (another node's write?)", o.Name, i)
			}
			writes++
		}
	}
	if len(ubn) != len(nodes) || writes < len(nodes) {
		t.Fatalf("the watch saw %d UpgradeBundleNodes, %d changes, want each of the %d nodes' writes", len(ubn), writes, len(nodes))
	}
	ub := bundles.stop()[name]
	for i := 1; i < len(ub); i++ {
		var prev, o v1alpha1.UpgradeBundle
		json.Unmarshal(ub[i-1], &prev)
		json.Unmarshal(ub[i], &o)
		if reflect.DeepEqual(prev.Spec, o.Spec) && reflect.DeepEqual(prev.Status, o.Status) && reflect.DeepEqual(statusManagers(prev), statusManagers(o)) {
			t.Errorf("version %d of the UpgradeBundle changes neither the spec nor the summary (a node's entry?)", i)
		}
		if d := o.Status.Digest; d != "" && d != digest {
			t.Errorf("version %d: the summary names digest %s, the entries %s", i, d, digest)
		}
		if r := o.Status.NodesReady; r != "" && !strings.HasSuffix(r, "/3") && !strings.HasSuffix(r, "/2") && !strings.HasSuffix(r, "/1") {
			t.Errorf("version %d: nodesReady %q of three nodes", i, r)
		}
	}
	// Only the summary's writer (node-a, first by name) says in its
	// record that it reports on the bundle: every node watches every
	// record, so the others' would reach every node for nothing. node-c
	// waits two turns (agent's writerStagger) before it would, and
	// node-a's record is there long before.
	if ann, _ := e.Lease("node-a"); ann[kube.AnnotationBundle] != name {
		t.Errorf("node-a's record: %v, want %s=%s (the summary's writer)", ann, kube.AnnotationBundle, name)
	}
	if ann, _ := e.Lease("node-c"); ann[kube.AnnotationBundle] != "" {
		t.Errorf("node-c's record: %v, want no %s (not the summary's writer)", ann, kube.AnnotationBundle)
	}
	t.Logf("%d changes of the nodes' UpgradeBundleNodes; %d versions of the UpgradeBundle", writes, len(ub))
}

// statusManagers are the field managers of o's status.
func statusManagers(o v1alpha1.UpgradeBundle) []string {
	var out []string
	for _, m := range o.ManagedFields {
		if m.Subresource == "status" {
			out = append(out, m.Manager)
		}
	}
	slices.Sort(out)
	return out
}

// versions is every version of the objects of a collection the
// administrator's watch saw, by name, from the watch's start.
type versions struct {
	mu     sync.Mutex
	byName map[string][]json.RawMessage
	cancel context.CancelFunc
	done   chan struct{}
}

// watchVersions watches path (those fieldSelector picks) as the
// administrator from now on, until stop.
func watchVersions(t *testing.T, e *kubeenv.Env, path, fieldSelector string) *versions {
	t.Helper()
	var list struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items []json.RawMessage `json:"items"`
	}
	q := ""
	if fieldSelector != "" {
		q = "?fieldSelector=" + url.QueryEscape(fieldSelector)
	}
	if err := e.Admin.Raw(t.Context(), "GET", path+q, "", nil, &list); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	v := &versions{byName: map[string][]json.RawMessage{}, cancel: cancel, done: make(chan struct{})}
	add := func(raw json.RawMessage) {
		var m struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if json.Unmarshal(raw, &m) == nil {
			v.mu.Lock()
			v.byName[m.Metadata.Name] = append(v.byName[m.Metadata.Name], raw)
			v.mu.Unlock()
		}
	}
	for _, o := range list.Items {
		add(o)
	}
	go func() {
		defer close(v.done)
		err := e.Admin.Watch(ctx, path, fieldSelector, list.Metadata.ResourceVersion, 10*time.Minute, func(ev kube.Event) error {
			if ev.Type == "ADDED" || ev.Type == "MODIFIED" {
				add(ev.Object)
			}
			return nil
		})
		if ctx.Err() == nil {
			t.Errorf("the administrator's watch of %s ended: %v", path, err)
		}
	}()
	t.Cleanup(func() { v.stop() })
	return v
}

// stop ends the watch and returns what it saw.
func (v *versions) stop() map[string][]json.RawMessage {
	v.cancel()
	<-v.done
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.byName
}

func show(m map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%.0f", k, m[k]))
	}
	return strings.Join(parts, " ")
}
