package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
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
	alone := delta(before, e.Requests())

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
	waitUntil(t, "every node's entry", func() bool {
		st, _ := e.Bundle(name)["status"].(map[string]any)
		ns, _ := st["nodes"].(map[string]any)
		return len(ns) == nodes
	})
	for rv, since := "", time.Now(); time.Since(since) < 5*time.Second; time.Sleep(200 * time.Millisecond) {
		md, _ := e.Bundle(name)["metadata"].(map[string]any)
		if now, _ := md["resourceVersion"].(string); now != rv {
			rv, since = now, time.Now()
		}
	}

	before = e.Requests()
	time.Sleep(window)
	with := delta(before, e.Requests())
	total, base := sum(with), sum(alone)*float64(window)/float64(quiet)
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

// TestAgents_ANodesStatusWriteChangesOnlyItsOwnEntry: two agents write
// their entries of one UpgradeBundle as their bundle moves; in every
// version of the object the administrator's watch sees, at most one
// node's entry differs from the version before, no entry ever goes, and
// the summary names only what the entries back (the digest they name,
// the two nodes).
func TestAgents_ANodesStatusWriteChangesOnlyItsOwnEntry(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.InstallFerry()
	installBundles(e)
	tarPath, meta := releaseBundle(t)
	name, digest := agent.ResourceName(meta.Version, meta.Arch), sidecarDigest(t, tarPath)
	e.PatchBundleSpec(name, map[string]any{"schedule": "Manual"})

	first := e.Bundle(name)
	md, _ := first["metadata"].(map[string]any)
	rv, _ := md["resourceVersion"].(string)
	var mu sync.Mutex
	versions := []map[string]any{first}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := e.Admin.Watch(ctx, "/apis/ferry.io/v1alpha1/upgradebundles", "metadata.name="+name, rv, 10*time.Minute, func(ev kube.Event) error {
			var o map[string]any
			if err := json.Unmarshal(ev.Object, &o); err == nil && ev.Type != "BOOKMARK" {
				mu.Lock()
				versions = append(versions, o)
				mu.Unlock()
			}
			return nil
		})
		if ctx.Err() == nil {
			t.Errorf("the administrator's watch ended: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })

	agents := map[string]*ferryenv.Agent{}
	for _, n := range []string{"node-a", "node-b"} {
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
	e.PatchBundleSpec(name, map[string]any{"approvedDigest": digest})
	for _, a := range agents {
		a.Wait(bound, "approved", func(s agent.Status) bool {
			return s.Phase != string(agent.PhaseIdle) && s.Reason != agent.ReasonAwaitingApproval
		})
	}
	waitUntil(t, "both nodes approved in the UpgradeBundle", func() bool {
		st, _ := e.Bundle(name)["status"].(map[string]any)
		ns, _ := st["nodes"].(map[string]any)
		for _, n := range []string{"node-a", "node-b"} {
			en, _ := ns[n].(map[string]any)
			if en == nil || en["reason"] == agent.ReasonAwaitingApproval {
				return false
			}
		}
		return true
	})
	cancel()
	<-done

	mu.Lock()
	defer mu.Unlock()
	entries := func(o map[string]any) map[string]any {
		st, _ := o["status"].(map[string]any)
		ns, _ := st["nodes"].(map[string]any)
		return ns
	}
	writes := 0
	for i := 1; i < len(versions); i++ {
		prev, cur := entries(versions[i-1]), entries(versions[i])
		var changed []string
		for n, en := range cur {
			if !reflect.DeepEqual(prev[n], en) {
				changed = append(changed, n)
			}
		}
		for n := range prev {
			if _, ok := cur[n]; !ok {
				t.Errorf("version %d: %s's entry went", i, n)
			}
		}
		if len(changed) > 1 {
			t.Errorf("version %d: one write changed the entries of %v", i, changed)
		}
		writes++
		st, _ := versions[i]["status"].(map[string]any)
		if d, _ := st["digest"].(string); d != "" && d != digest {
			t.Errorf("version %d: the summary names digest %s, the entries %s", i, d, digest)
		}
		if r, _ := st["nodesReady"].(string); r != "" && !strings.HasSuffix(r, "/2") {
			t.Errorf("version %d: nodesReady %q of two nodes", i, r)
		}
	}
	if writes < 4 {
		t.Fatalf("the watch saw %d versions of the UpgradeBundle, want the nodes' writes", len(versions))
	}
	t.Logf("%d versions of the UpgradeBundle, each changing at most one node's entry", len(versions))
}

func delta(a, b map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range b {
		if d := v - a[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func sum(m map[string]float64) float64 {
	s := 0.0
	for _, v := range m {
		s += v
	}
	return s
}

func show(m map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%.0f", k, m[k]))
	}
	return strings.Join(parts, " ")
}
