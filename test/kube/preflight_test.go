package kube

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// The test plays the version operator (ClusterVersion's history and
// Upgradeable), the MCO (a paused pool), an operator (a degraded
// ClusterOperator) and a workload (a pod pulling with Always), against
// OpenShift's real CRDs and with only ferry's RBAC.

func TestClient_PreflightWithOnlyFerrysRBAC(t *testing.T) {
	e := kubeenv.Start(t, current)
	c := ferryClient(t, e)
	ctx := t.Context()
	e.InstallMachineConfigPools()
	e.InstallClusterOperators()
	e.SetPool(kubeenv.MachineConfigPool{Name: "worker", NodeSelector: map[string]string{workerRole: ""}, Paused: true, Target: oldConfig, Current: oldConfig})
	e.SetClusterOperator("etcd", kubeenv.Condition{Type: "Available", Status: "True", Reason: "AsExpected"})
	e.SetClusterOperator("ingress", kubeenv.Condition{Type: "Degraded", Status: "True", Reason: "IngressDegraded", Message: "2 of 3 router replicas are unavailable"})
	const carried = "quay.io/my-company/app:v1@sha256:3333333333333333333333333333333333333333333333333333333333333333"
	e.CreatePod("shop", "front", "node-a", "quay.io/my-company/front:latest", "Always")
	e.CreatePod("shop", "app", "node-a", "quay.io/my-company/app:v1", "Always")
	e.CreatePod("shop", "cache", "node-a", "quay.io/my-company/cache:v2", "IfNotPresent")
	e.CreatePod("elsewhere", "other", "node-b", "quay.io/other/tenant:v1", "Always")

	// A z-stream update (4.13.6 → 4.13.7): no refusal, three warnings.
	p, err := c.Preflight(ctx, "node-a", "4.13.7", []string{next, carried})
	if err != nil {
		t.Fatal(err)
	}
	if p.Current != "4.13.6" || len(p.Refusals) != 0 {
		t.Fatalf("preflight %+v", p)
	}
	warnings := strings.Join(p.Warnings, "\n")
	for _, want := range []string{"machine config pool worker is paused", "ingress is degraded: 2 of 3 router replicas are unavailable",
		"1 container on node node-a pulls", "quay.io/my-company/front:latest"} {
		if !strings.Contains(warnings, want) {
			t.Errorf("warnings lack %q:\n%s", want, warnings)
		}
	}
	// The warnings go into the cluster-scoped UpgradeBundle: no tenant's
	// namespace or pod, and only this node's pods.
	for _, not := range []string{"etcd", "shop", "front/main", "app:v1", "cache", "elsewhere", "quay.io/other"} {
		if strings.Contains(warnings, not) {
			t.Errorf("warnings name %q:\n%s", not, warnings)
		}
	}
	if d := strings.Join(p.Details, "\n"); d != "shop/front/main (quay.io/my-company/front:latest)" {
		t.Errorf("details %q, want only this node's pod", d)
	}

	// A minor update while the operator says Upgradeable=False, and an
	// admin gate of the current minor not acknowledged.
	e.SetConditions(kubeenv.Condition{Type: "Upgradeable", Status: "False", Reason: "AdminAckRequired", Message: "Kubernetes 1.27 removes APIs in use"})
	e.SetConfigMap("openshift-config-managed", "admin-gates", map[string]string{"ack-4.13-kube-1.27-api-removals-in-4.14": "Kubernetes 1.27 removes v1beta1 APIs"})
	e.SetConfigMap("openshift-config", "admin-acks", map[string]string{})
	p, err = c.Preflight(ctx, "node-a", "4.14.1", []string{next})
	if err != nil {
		t.Fatal(err)
	}
	refusals := strings.Join(p.Refusals, "\n")
	if !strings.Contains(refusals, "Kubernetes 1.27 removes APIs in use") || !strings.Contains(refusals, "ack-4.13-kube-1.27-api-removals-in-4.14") {
		t.Fatalf("refusals:\n%s", refusals)
	}
	// The refusal does not hide what was found beside it.
	if warnings := strings.Join(p.Warnings, "\n"); !strings.Contains(warnings, "quay.io/my-company/front:latest") ||
		!strings.Contains(warnings, "machine config pool worker is paused") {
		t.Errorf("a refused preflight's warnings:\n%s", warnings)
	}
	// A downgrade and a skipped minor.
	for v, want := range map[string]string{"4.13.2": "does not downgrade", "4.15.0": "skips 4.14"} {
		if p, err := c.Preflight(ctx, "node-a", v, nil); err != nil || !strings.Contains(strings.Join(p.Refusals, " "), want) {
			t.Errorf("%s: %+v %v, want %q", v, p, err, want)
		}
	}
}

// TestAgent_PreflightRefusesAMinorUpdateTheClusterCannotTake: a real
// agent with only ferry's RBAC is given a 4.13.7 bundle while the cluster
// is at 4.12.9 and its version operator says Upgradeable=False: the
// bundle is rejected before it is extracted, in the operator's words,
// and the warning found beside the refusal (a workload pulling with
// Always) is shown with it, in the node's status and the UpgradeBundle.
func TestAgent_PreflightRefusesAMinorUpdateTheClusterCannotTake(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "127.0.0.1")
	e.InstallFerry()
	installBundles(e)
	e.SetHistory(kubeenv.History{State: "Completed", Image: current, Version: "4.12.9"})
	e.SetConditions(kubeenv.Condition{Type: "Upgradeable", Status: "False", Reason: "ClusterOperatorsNotUpgradeable",
		Message: "Cluster operator storage should not be upgraded between minor versions: the vSphere CSI driver needs a newer vCenter"})
	e.CreatePod("shop", "front", "node-a", "quay.io/my-company/front:latest", "Always")
	const alwaysPull = "quay.io/my-company/front:latest"
	tarPath, meta := releaseBundle(t)
	e.CreateBundle(agent.ResourceName(meta.Version, meta.Arch)) // the administrator's: a node creates none

	a := nodeAgent(t, e, "", nil)
	a.Ferry("load", tarPath) // refused: the status says why
	s := a.WaitPhase(bound, agent.PhaseRejected)
	// The refusal's words are the product: the cluster's own reasons.
	if s.Reason != agent.ReasonPreflightRefused || !strings.Contains(s.Message, "the vSphere CSI driver needs a newer vCenter") {
		t.Fatalf("reason %s: %q", s.Reason, s.Message)
	}
	if !strings.Contains(strings.Join(s.Preflight, "\n"), alwaysPull) {
		t.Errorf("the refused bundle's status lacks the warning found beside the refusal: %q", s.Preflight)
	}
	waitUntil(t, "the refusal on the Node", func() bool {
		return strings.Contains(e.Annotations("node-a")["ferry.io/reason"], "not upgradeable")
	})
	if _, err := statDir(a.Cfg.Paths.ExtractDir, meta.DirName()); err == nil {
		t.Error("the refused bundle was extracted")
	}
	name := agent.ResourceName(meta.Version, meta.Arch)
	waitUntil(t, "the refusal in the UpgradeBundle, and a Warning Event", func() bool {
		n := e.BundleNodes(name)["node-a"]
		return n.Phase == string(agent.PhaseRejected) && n.Reason == agent.ReasonPreflightRefused && strings.Contains(n.Message, "the vSphere CSI driver needs a newer vCenter") &&
			strings.Contains(strings.Join(e.Events(name), "\n"), "Warning")
	})
	waitUntil(t, "the warning found beside the refusal in the UpgradeBundle's status.warnings", func() bool {
		st, _ := e.Bundle(name)["status"].(map[string]any)
		ws, _ := st["warnings"].([]any)
		return strings.Contains(fmt.Sprint(ws...), alwaysPull)
	})
	if b := fmt.Sprint(e.Bundle(name)); strings.Contains(b, "shop/front") {
		t.Errorf("the UpgradeBundle names a tenant's pod: %s", b)
	}
	if !strings.Contains(a.Logs(), "shop/front/main (quay.io/my-company/front:latest)") {
		t.Errorf("the node's journal does not name the pod")
	}
}

// TestAgent_PreflightWarningsShowInTheStatusAndTheUpgradeBundle: a z-stream
// bundle while a pool is paused, an operator degraded and a workload pulls
// with Always an image the bundle does not carry: the bundle goes on, and
// each warning is in the node's status and the resource's
// status.warnings.
func TestAgent_PreflightWarningsShowInTheStatusAndTheUpgradeBundle(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "127.0.0.1")
	e.InstallFerry()
	installBundles(e)
	e.InstallMachineConfigPools()
	e.InstallClusterOperators()
	e.SetPool(kubeenv.MachineConfigPool{Name: "worker", NodeSelector: map[string]string{workerRole: ""}, Paused: true, Target: oldConfig, Current: oldConfig})
	e.SetClusterOperator("ingress", kubeenv.Condition{Type: "Degraded", Status: "True", Reason: "IngressDegraded", Message: "2 of 3 router replicas are unavailable"})
	e.CreatePod("shop", "front", "node-a", "quay.io/my-company/front:latest", "Always")
	tarPath, meta := releaseBundle(t)
	e.CreateBundle(agent.ResourceName(meta.Version, meta.Arch)) // the administrator's: a node creates none

	a := nodeAgent(t, e, tarPath, nil)
	waitUntil(t, "node-a's record for its peers, written by its agent", func() bool {
		l, ok := e.Lease("node-a")
		return ok && l["ferry.io/address"] == "127.0.0.1" && l["ferry.io/ready"] == "false" // no Ready condition
	})
	s := a.WaitPhase(bound, agent.PhaseExtracted)
	want := []string{"machine config pool worker is paused", "ingress is degraded: 2 of 3 router replicas are unavailable", "1 container on node node-a pulls", "quay.io/my-company/front:latest"}
	for _, w := range want {
		if !strings.Contains(strings.Join(s.Preflight, "\n"), w) {
			t.Errorf("the node's status lacks %q: %q", w, s.Preflight)
		}
	}
	name := agent.ResourceName(meta.Version, meta.Arch)
	waitUntil(t, "every warning in the UpgradeBundle", func() bool {
		st, _ := e.Bundle(name)["status"].(map[string]any)
		ws, _ := st["warnings"].([]any)
		var got []string
		for _, w := range ws {
			got = append(got, fmt.Sprint(w))
		}
		for _, w := range want {
			if !strings.Contains(strings.Join(got, "\n"), w) {
				return false
			}
		}
		return true
	})
}

func statDir(parts ...string) (string, error) {
	p := filepath.Join(parts...)
	_, err := os.Stat(p)
	return p, err
}
