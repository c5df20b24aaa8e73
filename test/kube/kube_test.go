// Package kube tests ferry's Kubernetes client against a real
// kube-apiserver with OpenShift's ClusterVersion CRD (test/kubeenv), with
// only the rights packaging/rbac.yaml grants and the admission policies of
// packaging/admission.yaml, as one node's credential; the test plays the
// cluster version operator.
package kube

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/test/kubeenv"
	"github.com/ferry-edge/ferry/test/releasesig"
)

const (
	current = "quay.io/openshift-release-dev/ocp-release@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	next    = "quay.io/openshift-release-dev/ocp-release@sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

// Each test's API server starts while the test before it runs.
func TestMain(m *testing.M) { os.Exit(kubeenv.Main(m)) }

func repoFile(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", name)
}

// ferryClient is ferry's client on node-a: a token of ferry's
// ServiceAccount bound to Node node-a, with only the rights and the
// admission policies ferry ships.
func ferryClient(t *testing.T, e *kubeenv.Env) *kube.Client {
	e.Create("/api/v1/nodes", map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": "node-a"}})
	e.InstallFerry()
	c, err := kube.New(e.NodeKubeconfig("node-a"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestClient_TheUpgradeLoopWithOnlyFerrysRBAC(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	e.AddNode("node-b", "10.0.0.2")
	c := ferryClient(t, e)
	ctx := t.Context()

	// Node annotations: set, then one removed with an empty value.
	if err := c.Annotate(ctx, "node-a", map[string]string{"ferry.io/phase": "loaded", "ferry.io/reason": "waiting"}, map[string]string{"ferry.io/phase": "loaded"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Annotate(ctx, "node-a", map[string]string{"ferry.io/phase": "cluster-ready", "ferry.io/reason": ""}, nil); err != nil {
		t.Fatal(err)
	}
	ann := e.Annotations("node-a")
	if ann["ferry.io/phase"] != "cluster-ready" || ann["ferry.io/reason"] != "" {
		t.Fatalf("annotations %v", ann)
	}
	// The peers come from the nodes' records (lease_test.go): a Node
	// whose ferry wrote none is no peer.
	addrs, err := c.NodeAddresses(ctx)
	if err != nil || len(addrs) != 0 {
		t.Fatalf("node addresses with no records: %v, %v", addrs, err)
	}

	// Not asked yet.
	if u, err := c.UpgradeStatus(ctx, next); err != nil || u.State != cluster.UpgradeNotAsked {
		t.Fatalf("before: %+v, %v", u, err)
	}
	sigs := append(releasesig.Signatures(next, "4.13.7"), releasesig.NewKey().SignRelease(next, "4.13.7", "x86_64"))
	req := cluster.Upgrade{Release: next, Version: "4.13.7", Signatures: sigs}
	if err := c.StartUpgrade(ctx, req); !errors.Is(err, cluster.ErrReleaseUnapproved) {
		t.Fatalf("before the administrator approves the release: %v", err)
	}
	e.ApproveRelease(next)
	if err := c.StartUpgrade(ctx, req); err != nil {
		t.Fatal(err)
	}
	hex := strings.TrimPrefix(next[strings.Index(next, "@")+1:], "sha256:")
	labels, data, ok := e.ConfigMap(kube.SignatureNamespace, "sha256-"+hex)
	if !ok {
		t.Fatal("no signature ConfigMap")
	}
	if _, ok := labels[kube.SignatureLabel]; !ok {
		t.Errorf("labels %v lack %s", labels, kube.SignatureLabel)
	}
	if !bytes.Equal(data["sha256-"+hex+"-1"], sigs[0]) || !bytes.Equal(data["sha256-"+hex+"-2"], sigs[1]) || len(data) != 2 {
		t.Errorf("binaryData %q", data)
	}
	du := e.DesiredUpdate()
	if du["image"] != next || du["version"] != "4.13.7" || du["force"] != false {
		t.Fatalf("desiredUpdate %v", du)
	}
	gen := e.Generation()
	// Asking again changes nothing.
	if err := c.StartUpgrade(ctx, req); err != nil {
		t.Fatal(err)
	}
	if g := e.Generation(); g != gen {
		t.Errorf("asking again patched ClusterVersion (generation %d → %d)", gen, g)
	}
	if u, _ := c.UpgradeStatus(ctx, next); u.State != cluster.UpgradePending {
		t.Errorf("after the request: %+v", u)
	}

	// The version operator at work.
	e.SetHistory(kubeenv.History{State: "Partial", Image: next, Version: "4.13.7"}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	const working = "Working towards 4.13.7: 106 of 841 done (12% complete)"
	e.SetConditions(kubeenv.Condition{Type: "Progressing", Status: "True", Reason: "", Message: working})
	u, err := c.UpgradeStatus(ctx, next)
	if err != nil || u.State != cluster.UpgradeRunning || u.Message != working {
		t.Fatalf("upgrading: %+v, %v", u, err)
	}
	e.SetHistory(kubeenv.History{State: "Completed", Image: next, Version: "4.13.7"}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	e.SetConditions(kubeenv.Condition{Type: "Progressing", Status: "False", Message: "Cluster version is 4.13.7"})
	if u, _ := c.UpgradeStatus(ctx, next); u.State != cluster.UpgradeCompleted {
		t.Fatalf("completed: %+v", u)
	}
}

func TestClient_ARefusedReleaseSaysWhyInTheOperatorsWords(t *testing.T) {
	e := kubeenv.Start(t, current)
	c := ferryClient(t, e)
	e.ApproveRelease(next)
	if err := c.StartUpgrade(t.Context(), cluster.Upgrade{Release: next, Version: "4.13.7"}); err != nil {
		t.Fatal(err)
	}
	refused := "Retrieving payload failed version=\"4.13.7\" image=\"" + next + "\" failure=The update cannot be verified: unable to verify sha256:2222 against keyrings: verifier-public-key-redhat"
	e.SetConditions(kubeenv.Condition{Type: "ReleaseAccepted", Status: "False", Reason: "RetrievePayload", Message: refused})
	u, err := c.UpgradeStatus(t.Context(), next)
	if err != nil || u.State != cluster.UpgradeRefused || u.Reason != refused {
		t.Fatalf("%+v, %v", u, err)
	}
}

func TestClient_WithoutRightsFailsNamingWhatIsMissing(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	c, err := kube.New(e.NobodyKubeconfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Annotate(t.Context(), "node-a", map[string]string{"ferry.io/phase": "loaded"}, nil)
	if !errors.Is(err, kube.ErrForbidden) || !strings.Contains(err.Error(), `cannot patch resource "nodes"`) || !strings.Contains(err.Error(), "rbac.yaml") {
		t.Fatalf("annotate without rights: %v", err)
	}
	err = c.StartUpgrade(t.Context(), cluster.Upgrade{Release: next, Version: "4.13.7", Signatures: releasesig.Signatures(next, "4.13.7")})
	if !errors.Is(err, kube.ErrForbidden) || !strings.Contains(err.Error(), "configmaps") {
		t.Fatalf("start without rights: %v", err)
	}
}

func TestClient_TheAPIServerDownForAWhileIsRetried(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	c := ferryClient(t, e)
	e.StopAPIServer()
	if err := c.Annotate(t.Context(), "node-a", map[string]string{"ferry.io/phase": "loaded"}, nil); err == nil || !strings.Contains(err.Error(), "cannot be reached") {
		t.Fatalf("with the API down: %v", err)
	}
	e.StartAPIServer()
	if err := c.Annotate(t.Context(), "node-a", map[string]string{"ferry.io/phase": "loaded"}, nil); err != nil {
		t.Fatalf("once it is back: %v", err)
	}
}
