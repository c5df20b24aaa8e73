package kube

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/internal/testca"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/kubeenv"
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
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "127.0.0.1")
	e.AddNode("node-b", "127.0.0.1")
	e.InstallFerry()
	installBundles(e)
	servingCA := testca.New(t, "kubelet-signer")
	e.Create("/api/v1/namespaces/openshift-config-managed/configmaps", map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "kubelet-serving-ca"}, "data": map[string]any{"ca-bundle.crt": string(servingCA.PEM)}})
	tarPath, meta := releaseBundle(t)
	name := agent.ResourceName(meta.Version, meta.Arch)
	ports := map[string]int{"node-a": freePort(t), "node-b": freePort(t)}
	agents := map[string]*ferryenv.Agent{}
	for _, n := range []string{"node-a", "node-b"} {
		cfg := ferryenv.Config(t.TempDir())
		cfg.NodeName = n
		if n == "node-a" {
			c.Configure(&cfg)
		}
		if err := os.MkdirAll(cfg.Paths.CertsDir, 0o755); err != nil {
			t.Fatal(err)
		}
		cfg.Cluster.Kubeconfig = e.NodeCertKubeconfig(n)
		cfg.Cluster.Schedule = "Manual" // the gate is what is tested, not the upgrade
		cert, key := servingCA.Serving(t, n, "127.0.0.1")
		cfg.Peer.Cert = testca.WriteCurrent(t, t.TempDir(), "kubelet-server", cert, key)
		cfg.Peer.Identity = "node"
		cfg.Peer.Listen = "127.0.0.1:" + strconv.Itoa(ports[n])
		for m, p := range ports {
			if m != n {
				cfg.Peer.Peers = []string{"127.0.0.1:" + strconv.Itoa(p)}
			}
		}
		agents[n] = ferryenv.Start(t, cfg)
	}
	if agents["node-b"].Cfg.CRIO.Socket != "" {
		t.Fatalf("node-b has a CRI-O socket %q", agents["node-b"].Cfg.CRIO.Socket)
	}
	for _, a := range agents {
		a.WaitPhase(bound, "idle")
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the UpgradeBundle: %v\nnode-a's log:\n%s\nnode-b's log:\n%s", e.Bundle(name), agents["node-a"].Logs(), agents["node-b"].Logs())
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
