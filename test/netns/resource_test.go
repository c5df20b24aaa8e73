package netns

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/test/fixture"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// bundleStatus reads an UpgradeBundle's status as the administrator sees
// it (oc get upgradebundle NAME -o yaml), and each node's entry for it
// (oc get upgradebundlenodes -o yaml), by node, as JSON objects.
func bundleStatus(e *kubeenv.Env, name string) (status map[string]any, nodes map[string]any) {
	o := e.Bundle(name)
	if o == nil {
		return nil, nil
	}
	status, _ = o["status"].(map[string]any)
	b, err := json.Marshal(e.BundleNodes(name))
	if err == nil {
		err = json.Unmarshal(b, &nodes)
	}
	if err != nil {
		panic(err) // the API's own types always marshal
	}
	return status, nodes
}

// condition is one node's condition status (True, False, Unknown, "").
func condition(nodes map[string]any, node, typ string) string {
	n, _ := nodes[node].(map[string]any)
	cs, _ := n["conditions"].([]any)
	for _, c := range cs {
		if c, _ := c.(map[string]any); c["type"] == typ {
			s, _ := c["status"].(string)
			return s
		}
	}
	return ""
}

// TestAgents_TheUpgradeBundleRunsTheClusterFromTheAPI: three agents,
// approval required, the real API server with ferry's CRD, RBAC and
// admission policies; the test plays the administrator (with what oc
// patch sends) and the version operator. Node C's agent is stopped for
// good. A stick on A: A creates the UpgradeBundle, extracts the bundle and
// waits for approval, loading nothing; the administrator's approvedDigest
// lets A and B load with no restart; the gate waits for C until its Node
// has been NotReady longer than the administrator's notReadyTimeout; the
// upgrade starts; C, restarted, catches up; the version operator finishes
// and every node's Updated condition is True.
func TestAgents_TheUpgradeBundleRunsTheClusterFromTheAPI(t *testing.T) {
	e, f, tarPath, meta, digest := bundleFleet(t)
	name := agent.ResourceName(meta.Version, meta.Arch)
	a, b, c := f.nodes[0], f.nodes[1], f.nodes[2]
	c.A.Stop()

	// Unapproved: extracted, shared, loaded nowhere. The administrator
	// made the resource, empty (a node creates none).
	e.CreateBundle(name)
	a.load(t, tarPath)
	a.A.Wait(agentBound, "waiting for approval", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseExtracted) && s.Reason == agent.ReasonAwaitingApproval && string(s.Digest) == digest
	})
	waitFor(t, "A's entry in the UpgradeBundle, waiting for approval", func() bool {
		st, nodes := bundleStatus(e, name)
		return st != nil && st["approved"] == "waiting for approval" && condition(nodes, a.Name, "Extracted") == "True" && condition(nodes, a.Name, "Loaded") == "False"
	})
	if spec, _ := e.Bundle(name)["spec"].(map[string]any); fmt.Sprint(spec) != "map[cleanup:false]" {
		t.Fatalf("ferry wrote the spec: %v, want the administrator's (CreateBundle)", spec)
	}
	// Turns of both loops after the wait was published load nothing.
	a.A.TurnsRefused(2, "proceed")
	b.A.TurnsRefused(2, "proceed")
	a.checkPinned(t, meta, false)
	b.checkPinned(t, meta, false)
	if s, _ := b.A.Status(t.Context()); s.Phase != string(agent.PhaseIdle) && s.Phase != string(agent.PhaseRejected) {
		t.Fatalf("B took an unapproved bundle: %+v", s)
	}

	// Approved in the API, with no restart: B fetches it; neither loads
	// while C, down, cannot say it holds the same bundle.
	e.PatchBundleSpec(name, map[string]any{"approvedDigest": digest})
	for _, n := range []*anode{a, b} {
		n.A.Wait(agentBound, "extracted, waiting for C", func(s agent.Status) bool {
			return s.Phase == string(agent.PhaseExtracted) && string(s.Digest) == digest && s.Reason == agent.ReasonPeersNotHolding
		})
	}
	a.checkPinned(t, meta, false)
	if du := e.DesiredUpdate(); du != nil && du["image"] == meta.Release {
		t.Fatal("the upgrade was asked for while C was neither loaded nor excluded")
	}

	// C's Node has been NotReady for an hour, and its record, with its
	// ferry down, not renewed (the peers read readiness from the
	// records: a kubelet reads no other Node); the administrator's
	// notReadyTimeout leaves it out: A and B load, the gate opens, the
	// upgrade starts, and the resource says why C is left out.
	e.SetNodeReady(c.Name, false, time.Now().Add(-time.Hour))
	e.ExpireLease(c.Name, time.Now().Add(-time.Hour))
	for _, n := range []*anode{a, b} {
		e.SetNodeReady(n.Name, true, time.Now())
	}
	e.PatchBundleSpec(name, map[string]any{"notReadyTimeout": "10m"})
	for _, n := range []*anode{a, b} {
		n.waitHolds(t, agent.PhaseClusterReady, digest)
	}
	waitFor(t, "desiredUpdate to name the release", func() bool { du := e.DesiredUpdate(); return du != nil && du["image"] == meta.Release })
	waitFor(t, "NODES READY 2/2, C left out as NotReady", func() bool {
		st, _ := bundleStatus(e, name)
		ex, _ := st["excluded"].([]any)
		return st["nodesReady"] == "2/2" && len(ex) == 1 && strings.HasPrefix(fmt.Sprint(ex[0]), c.Name+": NotReady since")
	})

	// C comes back and catches up: approved by the resource, fetched from
	// its peers, loaded.
	e.SetNodeReady(c.Name, true, time.Now())
	c.A.Restart()
	c.waitHolds(t, agent.PhaseClusterReady, digest)
	c.checkPinned(t, meta, true)
	waitFor(t, "NODES READY 3/3", func() bool { st, _ := bundleStatus(e, name); return st["nodesReady"] == "3/3" })

	versionOperatorFinishes(t, e, f, name, meta.Release)
	events := strings.Join(e.Events(name), "\n")
	for _, want := range []string{"Normal Extracted: " + a.Name, "Normal ClusterReady: " + b.Name, "Normal Upgraded: " + c.Name} {
		if !strings.Contains(events, want) {
			t.Errorf("no event %q among:\n%s", want, events)
		}
	}
	t.Logf("events:\n%s", events)
}

// versionOperatorFinishes plays the version operator upgrading the
// cluster to release, and waits for every node's Updated condition and
// label.
func versionOperatorFinishes(t *testing.T, e *kubeenv.Env, f *fleet, name, release string) {
	t.Helper()
	e.SetHistory(kubeenv.History{State: "Partial", Image: release, Version: "4.13.7"}, kubeenv.History{State: "Completed", Image: runningRelease, Version: "4.13.6"})
	e.SetHistory(kubeenv.History{State: "Completed", Image: release, Version: "4.13.7"}, kubeenv.History{State: "Completed", Image: runningRelease, Version: "4.13.6"})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the UpgradeBundle at the end: %v", e.Bundle(name))
		}
	})
	waitFor(t, "every node Updated in the UpgradeBundle", func() bool {
		st, nodes := bundleStatus(e, name)
		for _, n := range f.nodes {
			if condition(nodes, n.Name, "Updated") != "True" {
				return false
			}
		}
		return st["phase"] == string(agent.PhaseUpgraded)
	})
	// Each label follows its node's entry on a write of its own.
	for _, n := range f.nodes {
		waitFor(t, n.Name+" labelled upgraded", func() bool {
			return e.NodeLabels(n.Name)[agent.LabelPhase] == string(agent.PhaseUpgraded)
		})
	}
	// Every node's entry, as ferry status --cluster reads them from the
	// nodes' UpgradeBundleNodes, by node name.
	out, err := f.nodes[0].A.Ferry("status", "--cluster")
	i := strings.Index(out, "every node's entries (oc get upgradebundlenodes)")
	if err != nil || i < 0 {
		t.Fatalf("ferry status --cluster on %s: %v\n%s", f.nodes[0].Name, err, out)
	}
	last := i
	for _, n := range f.nodes {
		row := strings.Index(out[i:], "\n"+n.Name+" ")
		if row < 0 || i+row < last || !strings.Contains(out[i+row:], name) {
			t.Errorf("ferry status --cluster lists %s's entry out of order or not at all:\n%s", n.Name, out)
		}
		last = i + row
	}
}

// TestAgents_ABundleApprovedAheadInItsUpgradeBundle: the administrator
// creates the UpgradeBundle with the engineer's approvedDigest before the
// technician arrives; three agents, approval required, nothing approved
// in their configs; C's agent is stopped. A stick on A: A and B extract
// it with no wait for approval and hold for C until the administrator
// lists C in excludedNodes; their Loaded conditions turn True, the
// upgrade is asked for; C, restarted, catches up though still excluded,
// and counts again once the administrator takes it off the list; the
// version operator finishes and every node is Updated.
func TestAgents_ABundleApprovedAheadInItsUpgradeBundle(t *testing.T) {
	e, f, tarPath, meta, digest := bundleFleet(t)
	name := agent.ResourceName(meta.Version, meta.Arch)
	e.PatchBundleSpec(name, map[string]any{"approvedDigest": digest, "schedule": "Automatic"})
	a, b, c := f.nodes[0], f.nodes[1], f.nodes[2]
	c.A.Stop()

	a.load(t, tarPath)
	for _, n := range []*anode{a, b} {
		n.A.Wait(agentBound, "extracted, approved, waiting for C", func(s agent.Status) bool {
			return s.Phase == string(agent.PhaseExtracted) && string(s.Digest) == digest && s.Reason == agent.ReasonPeersNotHolding
		})
	}
	waitFor(t, "status.approved to say how it was approved", func() bool {
		st, _ := bundleStatus(e, name)
		return st["approved"] == "digest" || st["approved"] == "peer"
	})
	if du := e.DesiredUpdate(); du != nil && du["image"] == meta.Release {
		t.Fatal("the upgrade was asked for while C was neither loaded nor excluded")
	}

	e.PatchBundleSpec(name, map[string]any{"excludedNodes": []string{c.Name}})
	for _, n := range []*anode{a, b} {
		n.waitHolds(t, agent.PhaseClusterReady, digest)
		n.checkPinned(t, meta, true)
	}
	waitFor(t, "A and B Loaded, C left out by the spec", func() bool {
		st, nodes := bundleStatus(e, name)
		ex, _ := st["excluded"].([]any)
		return condition(nodes, a.Name, "Loaded") == "True" && condition(nodes, b.Name, "Loaded") == "True" &&
			st["nodesReady"] == "2/2" && len(ex) == 1 && ex[0] == c.Name+": listed in spec.excludedNodes"
	})
	waitFor(t, "desiredUpdate to name the release", func() bool { du := e.DesiredUpdate(); return du != nil && du["image"] == meta.Release })

	c.A.Restart()
	c.waitHolds(t, agent.PhaseClusterReady, digest)
	c.checkPinned(t, meta, true)
	e.PatchBundleSpec(name, map[string]any{"excludedNodes": nil})
	waitFor(t, "NODES READY 3/3, C Loaded", func() bool {
		st, nodes := bundleStatus(e, name)
		return st["nodesReady"] == "3/3" && condition(nodes, c.Name, "Loaded") == "True"
	})
	versionOperatorFinishes(t, e, f, name, meta.Release)
}

// bundleFleet is three agents with real CRI-O, approval required and
// nothing approved in their configs, against the real API server with
// ferry's CRD, RBAC and admission policies; and a release bundle for them.
func bundleFleet(t *testing.T) (e *kubeenv.Env, f *fleet, tarPath string, meta *bundle.Metadata, digest string) {
	e = kubeenv.Start(t, runningRelease)
	e.InstallFerry()
	e.InstallUpgradeBundles(repoFile("packaging/upgradebundle-crd.yaml"))
	api := forwardAPI(t, e)
	f = newFleet(t, fleetOptions{Nodes: 3, CRIO: true, Setup: func(n *Node, cfg *agent.Config) {
		api(n, cfg)
		cfg.Approval = "required"
	}})
	// Every node's record is written before a test stops one: a node
	// with none is no node of the cluster's to the others.
	for _, n := range f.nodes {
		waitFor(t, n.Name+"'s record (its Lease)", func() bool { _, ok := e.Lease(n.Name); return ok })
	}
	tarPath, meta, digest = realBundle(t, fixture.NewRegistry(t), "4.13.7", 11, "--signature-store", "")
	e.ApproveRelease(meta.Release) // the administrator's one command (ferry bundle verify prints it)
	return e, f, tarPath, meta, digest
}
