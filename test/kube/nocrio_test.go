package kube

import (
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/test/crioenv"
)

// TestAgents_ANodeWithoutCRIOHoldsTheGateSayingSoUntilExcluded: two real
// agents with their kubelet identities share a bundle over TLS; node-a
// has a real CRI-O, node-b none (crio.socket = ""). node-b verifies and
// extracts the bundle and loads nothing; node-a, loaded, says the cluster
// cannot upgrade because node-b has no CRI-O, rather than wait as if it
// were still loading; once the administrator lists node-b in
// spec.excludedNodes, node-a is cluster-ready.
func TestAgents_ANodeWithoutCRIOHoldsTheGateSayingSoUntilExcluded(t *testing.T) {
	c := crioenv.Start(t)
	e := twoNodeCluster(t)
	tarPath, meta := releaseBundle(t)
	name := agent.ResourceName(meta.Version, meta.Arch)
	agents := kubeletAgents(t, e, []string{"node-a", "node-b"}, func(n string, cfg *agent.Config) {
		if n == "node-a" {
			c.Configure(cfg)
		}
		cfg.Cluster.Schedule = "Manual" // the gate is what is tested, not the upgrade
	})
	if agents["node-b"].Cfg.CRIO.Socket != "" {
		t.Fatalf("node-b has a CRI-O socket %q", agents["node-b"].Cfg.CRIO.Socket)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the UpgradeBundle: %v", e.Bundle(name))
		}
	})
	if out, err := agents["node-a"].Ferry("load", tarPath); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	agents["node-b"].Wait(bound, "node-b: extracted, loading nothing", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseExtracted) && s.Reason == agent.ReasonLoadsNothing
	})
	s := agents["node-a"].Wait(bound, "node-a: loaded, saying the cluster cannot upgrade", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseLoaded) && s.Reason == agent.ReasonNodesWithoutCRIO
	})
	for _, want := range []string{"node-b", "spec.excludedNodes"} {
		if !strings.Contains(s.Message, want) {
			t.Errorf("node-a's message %q does not name %q", s.Message, want)
		}
	}
	waitUntil(t, "the reason on node-a's Node", func() bool {
		return strings.Contains(e.Annotations("node-a")[agent.AnnotationReason], "has no CRI-O")
	})

	// ferry proceed says the same, rather than that the cluster is not ready.
	if out, err := agents["node-a"].Ferry("proceed"); err == nil || !strings.Contains(out, "has no CRI-O") {
		t.Errorf("ferry proceed on node-a: %v\n%s", err, out)
	}

	e.PatchBundleSpec(name, map[string]any{"excludedNodes": []string{"node-b"}})
	agents["node-a"].WaitPhase(bound, agent.PhaseClusterReady)
}
