package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// Issue 45, items 1 and 4: the administrator approves with one command
// before any node has the bundle, and follows it with kubectl wait on
// the UpgradeBundle's own conditions, each run as the real binary
// against the real API server.

// kubectl runs the real kubectl as the administrator.
func kubectl(t *testing.T, e *kubeenv.Env, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(e.Kubectl(), append([]string{"--kubeconfig", e.AdminKC}, args...)...).CombinedOutput()
	return string(out), err
}

// condition is the UpgradeBundle name's top-level condition of type typ
// (nil when there is none).
func condition(e *kubeenv.Env, name, typ string) *metav1.Condition {
	o, _ := e.UpgradeBundle(name)
	return apimeta.FindStatusCondition(o.Status.Conditions, typ)
}

// TestAgent_FerryApproveBeforeAnyNodeThenTheStickGoesThroughAndKubectlWaitReturns:
// ferry approve FILE.sha256 (the bundle beside it) with the
// administrator's kubeconfig creates the UpgradeBundle before any node
// has the bundle and approves its release; the node given the bundle
// loads it and asks for the upgrade with no further step, and kubectl
// wait --for=condition=Approved, Loaded and Upgraded each return. A spec
// patch afterwards is seen read in observedGeneration.
func TestAgent_FerryApproveBeforeAnyNodeThenTheStickGoesThroughAndKubectlWaitReturns(t *testing.T) {
	var approveOut string
	n := startBundleNode(t, func(e *kubeenv.Env, b bundleNode) {
		if e.Bundle(b.name) != nil {
			t.Fatalf("UpgradeBundle %s exists before ferry approve", b.name)
		}
		out, err := exec.Command(ferryenv.Binary(t), "approve", strings.TrimSuffix(b.tar, ".tar")+".sha256",
			"--kubeconfig", e.AdminKC, "--schedule", "Automatic").CombinedOutput()
		if err != nil {
			t.Fatalf("ferry approve: %v\n%s", err, out)
		}
		approveOut = string(out)
		spec, _ := e.Bundle(b.name)["spec"].(map[string]any)
		if spec["approvedDigest"] != b.digest || spec["schedule"] != "Automatic" {
			t.Fatalf("ferry approve wrote the spec %v, want the engineer's digest %s", spec, b.digest)
		}
		var cm struct {
			Data map[string]string `json:"data"`
		}
		if err := e.Admin.Raw(context.Background(), "GET", "/api/v1/namespaces/openshift-ferry/configmaps/ferry-admission", "", nil, &cm); err != nil {
			t.Fatal(err)
		}
		if key := "sha256-" + b.meta.Release[strings.LastIndex(b.meta.Release, ":")+1:]; cm.Data[key] == "" {
			t.Fatalf("the release is not approved in ferry-admission (%s): %v\n%s", key, cm.Data, out)
		}
	})
	logOnFailure(t, n)
	for _, want := range []string{"upgradebundle " + n.name + " created: approvedDigest " + n.digest, "release " + n.meta.Release + " approved",
		"kubectl wait --for=condition=Approved upgradebundle/" + n.name} {
		if !strings.Contains(approveOut, want) {
			t.Errorf("ferry approve said:\n%s\nwant %q", approveOut, want)
		}
	}

	wait := func(cond string) {
		t.Helper()
		out, err := kubectl(t, n.e, "wait", "--for=condition="+cond, "upgradebundle/"+n.name, fmt.Sprintf("--timeout=%ds", int(bound/time.Second)))
		if err != nil {
			t.Fatalf("kubectl wait --for=condition=%s: %v\n%s", cond, err, out)
		}
		t.Logf("kubectl wait --for=condition=%s returned", cond)
	}
	wait("Approved")
	wait("Loaded")
	waitUntil(t, "the upgrade asked for", func() bool { du := n.e.DesiredUpdate(); return du != nil && du["image"] == n.meta.Release })
	if c := condition(n.e, n.name, agent.CondDegraded); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("Degraded %v on the way", c)
	}
	n.e.SetHistory(kubeenv.History{State: "Completed", Image: n.meta.Release, Version: n.meta.Version}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	wait("Upgraded")
	if c := condition(n.e, n.name, agent.CondApproved); c == nil || c.Status != metav1.ConditionTrue || c.Reason != "ApprovedDigest" {
		t.Errorf("Approved %v", c)
	}
	approvedEvent := false
	for _, ev := range n.e.Events(n.name) {
		approvedEvent = approvedEvent || strings.HasPrefix(ev, "Normal ApprovedDigest: node-a: ")
	}
	if !approvedEvent {
		t.Errorf("no Event says the approval was taken: %q", n.e.Events(n.name))
	}

	// The administrator tells that a patch was read: observedGeneration
	// follows metadata.generation.
	gen := func() (int64, int64) {
		o, _ := n.e.UpgradeBundle(n.name)
		return o.Generation, o.Status.ObservedGeneration
	}
	if g, og := gen(); og != g {
		t.Errorf("observedGeneration %d, metadata.generation %d", og, g)
	}
	n.e.PatchBundleSpec(n.name, map[string]any{"schedule": "Manual"})
	g, _ := gen()
	out, err := kubectl(t, n.e, "wait", fmt.Sprintf("--for=jsonpath={.status.observedGeneration}=%d", g), "upgradebundle/"+n.name, "--timeout=120s")
	if err != nil {
		t.Fatalf("the patch (generation %d) is never seen read: %v\n%s", g, err, out)
	}
	t.Logf("observedGeneration %d seen", g)
	if c := condition(n.e, n.name, agent.CondUpgraded); c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != g {
		t.Errorf("Upgraded after the patch: %v, want True at generation %d", c, g)
	}
	if out, err := kubectl(t, n.e, "get", "upgradebundle", n.name, "-o", "wide"); err != nil || !strings.Contains(out, "DIGEST") || !strings.Contains(out, n.digest) {
		t.Errorf("kubectl get -o wide: %v\n%s", err, out)
	}
}

// TestAgent_AnApprovalOfAnotherDigestIsSaidInTheColumnAConditionAndAnEvent:
// ferry approve with a .sha256 of another bundle of the same name (no
// tar beside it: it approves no release and says what else is needed);
// the node given this bundle does not load it, and the APPROVED column,
// the Approved condition and a Warning Event say that another digest is
// approved, not "waiting for approval". ferry approve with the engineer's
// file of this bundle then lets it load, saying what it replaced.
func TestAgent_AnApprovalOfAnotherDigestIsSaidInTheColumnAConditionAndAnEvent(t *testing.T) {
	other := "sha256:" + strings.Repeat("0f", 32)
	n := startBundleNode(t, func(e *kubeenv.Env, b bundleNode) {
		file := filepath.Join(t.TempDir(), filepath.Base(strings.TrimSuffix(b.tar, ".tar")+".sha256"))
		if err := os.WriteFile(file, []byte(bundle.FormatSHA256File(other, filepath.Base(b.tar))), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(ferryenv.Binary(t), "approve", file, "--kubeconfig", e.AdminKC).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "not done: the release is not approved yet") {
			t.Fatalf("ferry approve without the bundle: %v\n%s", err, out)
		}
	})
	logOnFailure(t, n)
	waitUntil(t, "the Approved condition saying another digest is approved", func() bool {
		c := condition(n.e, n.name, agent.CondApproved)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == "OtherDigestApproved" && strings.Contains(c.Message, "sha256:0f0f0f0f0f0f")
	})
	out, err := kubectl(t, n.e, "get", "upgradebundle", n.name)
	if err != nil || !strings.Contains(out, "approves another digest") {
		t.Errorf("kubectl get upgradebundle: %v\n%s", err, out)
	}
	waitUntil(t, "a Warning Event saying another digest is approved", func() bool {
		for _, ev := range n.e.Events(n.name) {
			if strings.HasPrefix(ev, "Warning OtherDigestApproved: node-a: spec.approvedDigest approves sha256:0f0f0f0f0f0f") {
				return true
			}
		}
		return false
	})
	if s, _ := n.a.Status(t.Context()); s.Phase != string(agent.PhaseExtracted) {
		t.Fatalf("phase %s with another digest approved, want extracted", s.Phase)
	}

	cmd := exec.Command(ferryenv.Binary(t), "approve", strings.TrimSuffix(n.tar, ".tar")+".sha256", "-o", "json")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+n.e.AdminKC) // the administrator's, as oc reads it
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("ferry approve: %v\n%s", err, b)
	}
	var res struct {
		UpgradeBundle string `json:"upgradeBundle"`
		Replaced      string `json:"replaced"`
		Release       string `json:"release"`
	}
	if err := json.Unmarshal(b, &res); err != nil || res.UpgradeBundle != "updated" || res.Replaced != other || res.Release != "approved" {
		t.Errorf("ferry approve -o json: %v %+v\n%s", err, res, b)
	}
	if out, err := kubectl(t, n.e, "wait", "--for=condition=Approved", "upgradebundle/"+n.name, fmt.Sprintf("--timeout=%ds", int(bound/time.Second))); err != nil {
		t.Fatalf("kubectl wait --for=condition=Approved: %v\n%s", err, out)
	}
	n.a.WaitPhase(bound, agent.PhaseClusterReady)
}

// TestPolicy_TheConditionsAreTheSummarysAndEchoNoGenerationAhead: the
// resource's conditions are part of the summary: a node writes them
// never claiming a spec generation the resource has not reached, and
// only the condition types and shape the CRD knows.
func TestPolicy_TheConditionsAreTheSummarysAndEchoNoGenerationAhead(t *testing.T) {
	e := kubeenv.Start(t, current)
	a := ferryClient(t, e)
	installBundles(e)
	ctx := t.Context()
	e.CreateBundle(bundleName)
	d := digest.Digest("sha256:" + strings.Repeat("a", 64))
	entry := cluster.BundleNodeEntry{Phase: "loaded", Digest: d}
	sum := func(gen int64, typ string) cluster.BundleSummary {
		return cluster.BundleSummary{Version: "4.13.7", Arch: "x86_64", Digest: d, Phase: "loaded", NodesReady: "1/1", Approved: "digest", ObservedGeneration: gen,
			Conditions: []cluster.BundleCondition{{Type: typ, Status: "True", Reason: "AllNodesLoaded", Message: "1/1 nodes loaded", Since: time.Now(), ObservedGeneration: gen}}}
	}
	const policy = "ferry-upgradebundle"
	denied(t, "a generation the spec has not reached", a.PublishBundleStatus(ctx, bundleName, sum(2, "Loaded"), "node-a", entry), policy)
	invalid(t, "a condition type the CRD does not know", a.PublishBundleStatus(ctx, bundleName, sum(1, "Happy"), "node-a", entry), "status.conditions")
	if err := a.PublishBundleStatus(ctx, bundleName, sum(1, agent.CondLoaded), "node-a", entry); err != nil {
		t.Fatalf("the conditions of generation 1: %v", err)
	}
	if c := condition(e, bundleName, agent.CondLoaded); c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != 1 {
		t.Errorf("Loaded %v", c)
	}
}

// TestAgents_TwoNodesOneWriterOfTheConditions: two real agents, each with
// its kubelet's credentials (peers by their node certificates), nothing
// loaded (no CRI-O: they verify, extract and share). ferry approve before either has
// the bundle; node-a is given it, node-b fetches it. The resource's
// conditions have one writer, the summary's (node-a, first by name): the
// API server's managedFields show that only ferry-node-a owns
// status.conditions, and one node alone records the approval's Event.
func TestAgents_TwoNodesOneWriterOfTheConditions(t *testing.T) {
	e := twoNodeCluster(t)
	tarPath, meta := releaseBundle(t)
	name := agent.ResourceName(meta.Version, meta.Arch)
	if out, err := exec.Command(ferryenv.Binary(t), "approve", strings.TrimSuffix(tarPath, ".tar")+".sha256", "--kubeconfig", e.AdminKC).CombinedOutput(); err != nil {
		t.Fatalf("ferry approve: %v\n%s", err, out)
	}
	agents := kubeletAgents(t, e, []string{"node-a", "node-b"}, func(_ string, cfg *agent.Config) { cfg.Approval = "required" })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the UpgradeBundle: %v", e.Bundle(name))
		}
	})
	if out, err := agents["node-a"].Ferry("load", tarPath); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	agents["node-b"].Wait(bound, "node-b to fetch the bundle from node-a", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseExtracted) && s.Version == meta.Version
	})
	if out, err := kubectl(t, e, "wait", "--for=condition=Approved", "upgradebundle/"+name, fmt.Sprintf("--timeout=%ds", int(bound/time.Second))); err != nil {
		t.Fatalf("kubectl wait --for=condition=Approved: %v\n%s", err, out)
	}
	waitUntil(t, "both nodes' entries", func() bool {
		entries := e.BundleNodes(name)
		_, a := entries["node-a"]
		_, b := entries["node-b"]
		return a && b
	})

	owners := func() []string {
		var out []string
		mfs, _ := e.Bundle(name)["metadata"].(map[string]any)["managedFields"].([]any)
		for _, mf := range mfs {
			m, _ := mf.(map[string]any)
			fields, _ := m["fieldsV1"].(map[string]any)
			status, _ := fields["f:status"].(map[string]any)
			if _, ok := status["f:conditions"]; ok && m["subresource"] == "status" {
				out = append(out, m["manager"].(string))
			}
		}
		return out
	}
	if o := owners(); len(o) != 1 || o[0] != "ferry-node-a" {
		t.Errorf("status.conditions owned by %q, want ferry-node-a alone", o)
	}
	var approvals []string
	for _, ev := range e.Events(name) {
		if strings.HasPrefix(ev, "Normal ApprovedDigest: ") {
			approvals = append(approvals, ev)
		}
	}
	if len(approvals) != 1 || !strings.HasPrefix(approvals[0], "Normal ApprovedDigest: node-a: ") {
		t.Errorf("the approval's Events: %q, want one, node-a's", approvals)
	}
}
