package kube

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/test/kubeenv"
	"github.com/ferry-edge/ferry/test/releasesig"
)

// These tests apply exactly what ferry ships (packaging/rbac.yaml and
// packaging/admission.yaml) and play a node's credential gone bad: each
// thing ferry itself never does is refused by the API server.

const sigHex = "2222222222222222222222222222222222222222222222222222222222222222"

// nodeClient is ferry's client on node, with that node's own credential.
func nodeClient(t *testing.T, e *kubeenv.Env, node string) *kube.Client {
	t.Helper()
	c, err := kube.New(e.NodeKubeconfig(node), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Attempts = 1
	return c
}

func merge(t *testing.T, c *kube.Client, path string, patch map[string]any) error {
	t.Helper()
	return c.Raw(context.Background(), "PATCH", path, "application/merge-patch+json", patch, nil)
}

func meta(key string, m map[string]any) map[string]any {
	return map[string]any{"metadata": map[string]any{key: m}}
}

// denied fails the test unless err is the API server's refusal that
// names policy (or RBAC, for policy "").
func denied(t *testing.T, what string, err error, policy string) {
	t.Helper()
	if !errors.Is(err, kube.ErrForbidden) {
		t.Errorf("%s: %v, want 403", what, err)
		return
	}
	if policy != "" && !strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'") {
		t.Errorf("%s: refused, but not by policy %s: %v", what, policy, err)
	}
}

func TestPolicy_ANodesCredentialChangesOnlyItsOwnNodesFerryMetadata(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	e.AddNode("node-b", "10.0.0.2")
	e.InstallFerry()
	e.SetMachineConfig("node-a", "Done", "rendered-worker-1", "rendered-worker-1")
	e.LabelNode("node-a", map[string]string{workerRole: ""})
	a := nodeClient(t, e, "node-a")
	ctx := t.Context()

	// The API server itself names the node a token is bound to.
	var review struct {
		Status struct {
			UserInfo struct {
				Username string              `json:"username"`
				Extra    map[string][]string `json:"extra"`
			} `json:"userInfo"`
		} `json:"status"`
	}
	if err := a.Raw(ctx, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", "application/json",
		map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}, &review); err != nil {
		t.Fatal(err)
	}
	ui := review.Status.UserInfo
	if ui.Username != "system:serviceaccount:openshift-ferry:ferry" || strings.Join(ui.Extra["authentication.kubernetes.io/node-name"], ",") != "node-a" {
		t.Fatalf("node-a's token is %+v: want ferry's ServiceAccount with extra authentication.kubernetes.io/node-name [node-a]", ui)
	}

	// What ferry does: its own Node's ferry.io/* annotations and labels.
	if err := a.Annotate(ctx, "node-a", map[string]string{"ferry.io/phase": "loaded", "ferry.io/reason": "waiting"}, nil); err != nil {
		t.Fatalf("annotating its own Node: %v", err)
	}
	if err := a.Annotate(ctx, "node-a", map[string]string{"ferry.io/reason": ""}, nil); err != nil {
		t.Fatalf("removing its own annotation: %v", err)
	}
	if err := merge(t, a, "/api/v1/nodes/node-a", meta("labels", map[string]any{"ferry.io/phase": "loaded"})); err != nil {
		t.Fatalf("labelling its own Node ferry.io/phase: %v", err)
	}
	if got := e.Annotations("node-a"); got["ferry.io/phase"] != "loaded" || got["ferry.io/reason"] != "" {
		t.Fatalf("annotations %v", got)
	}

	// What it may not.
	denied(t, "annotating another Node", a.Annotate(ctx, "node-b", map[string]string{"ferry.io/phase": "loaded"}, nil), "ferry-node")
	denied(t, "a ferry.io label on another Node", merge(t, a, "/api/v1/nodes/node-b", meta("labels", map[string]any{"ferry.io/phase": "x"})), "ferry-node")
	denied(t, "a role label on its own Node", merge(t, a, "/api/v1/nodes/node-a", meta("labels", map[string]any{"node-role.kubernetes.io/master": ""})), "ferry-node")
	denied(t, "removing a label of its own Node", merge(t, a, "/api/v1/nodes/node-a", meta("labels", map[string]any{workerRole: nil})), "ferry-node")
	denied(t, "the MCO's annotation on its own Node", a.Annotate(ctx, "node-a", map[string]string{kube.MCODesiredConfig: "rendered-evil"}, nil), "ferry-node")
	denied(t, "removing the MCO's annotation", a.Annotate(ctx, "node-a", map[string]string{kube.MCOState: ""}, nil), "ferry-node")
	denied(t, "a taint on its own Node", merge(t, a, "/api/v1/nodes/node-a", map[string]any{"spec": map[string]any{"taints": []any{map[string]any{"key": "evil", "effect": "NoSchedule"}}}}), "ferry-node")
	denied(t, "cordoning its own Node", merge(t, a, "/api/v1/nodes/node-a", map[string]any{"spec": map[string]any{"unschedulable": true}}), "ferry-node")
	denied(t, "its own Node's status", merge(t, a, "/api/v1/nodes/node-a/status", map[string]any{"status": map[string]any{"addresses": []any{}}}), "")
	denied(t, "deleting a Node", a.Raw(ctx, "DELETE", "/api/v1/nodes/node-b", "", nil, nil), "")
	if got := e.Annotations("node-a"); got[kube.MCOState] != "Done" || got[kube.MCODesiredConfig] != "rendered-worker-1" {
		t.Errorf("the MCO's annotations changed: %v", got)
	}

	// A token of ferry's ServiceAccount bound to no Node writes nothing.
	loose, err := kube.New(e.ServiceAccountKubeconfig("openshift-ferry", "ferry"), nil)
	if err != nil {
		t.Fatal(err)
	}
	loose.Attempts = 1
	denied(t, "a token bound to no Node", loose.Annotate(ctx, "node-a", map[string]string{"ferry.io/phase": "x"}, nil), "ferry-node")
	denied(t, "a token bound to no Node starting an upgrade", loose.StartUpgrade(ctx, cluster.Upgrade{Release: next, Version: "4.13.7", Signatures: releasesig.Signatures(next, "4.13.7")}), "ferry-release-signatures")
}

const cvPath = "/apis/config.openshift.io/v1/clusterversions/version"

func desired(image string, force bool) map[string]any {
	return map[string]any{"spec": map[string]any{"desiredUpdate": map[string]any{"image": image, "version": "4.13.7", "force": force}}}
}

func TestPolicy_ClusterVersionTakesADesiredUpdateByDigestAndNothingElse(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	e.InstallFerry()
	a := nodeClient(t, e, "node-a")
	ctx := t.Context()

	denied(t, "a release by tag", merge(t, a, cvPath, desired("quay.io/openshift-release-dev/ocp-release:4.13.7-x86_64", false)), "ferry-clusterversion")
	denied(t, "a digest and a tag", merge(t, a, cvPath, desired("quay.io/openshift-release-dev/ocp-release:4.13.7@sha256:"+sigHex[:63], false)), "ferry-clusterversion")
	denied(t, "force: true", merge(t, a, cvPath, desired(next, true)), "ferry-clusterversion")
	denied(t, "force through ferry's own call", a.StartUpgrade(ctx, cluster.Upgrade{Release: next, Version: "4.13.7", Force: true}), "ferry-clusterversion")
	denied(t, "the channel", merge(t, a, cvPath, map[string]any{"spec": map[string]any{"channel": "fast-4.14"}}), "ferry-clusterversion")
	denied(t, "an upstream", merge(t, a, cvPath, map[string]any{"spec": map[string]any{"upstream": "https://evil.example/graph"}}), "ferry-clusterversion")
	denied(t, "overrides", merge(t, a, cvPath, map[string]any{"spec": map[string]any{"overrides": []any{map[string]any{
		"kind": "Deployment", "group": "apps", "name": "cluster-version-operator", "namespace": "openshift-cluster-version", "unmanaged": true}}}}), "ferry-clusterversion")
	denied(t, "the channel beside a good desiredUpdate", merge(t, a, cvPath, map[string]any{"spec": map[string]any{"channel": "", "desiredUpdate": map[string]any{"image": next, "version": "4.13.7"}}}), "ferry-clusterversion")
	denied(t, "a desiredUpdate by version and architecture", merge(t, a, cvPath, map[string]any{"spec": map[string]any{"desiredUpdate": map[string]any{"version": "4.13.7", "architecture": "Multi"}}}), "ferry-clusterversion")
	denied(t, "a label on ClusterVersion", merge(t, a, cvPath, meta("labels", map[string]any{"x": "y"})), "ferry-clusterversion")
	denied(t, "ClusterVersion's status", merge(t, a, cvPath+"/status", map[string]any{"status": map[string]any{"availableUpdates": nil}}), "")
	if du := e.DesiredUpdate(); du != nil {
		t.Fatalf("desiredUpdate set by a refused call: %v", du)
	}
	if g := e.Generation(); g != 1 {
		t.Errorf("ClusterVersion's spec changed (generation %d)", g)
	}

	// What ferry does is allowed, once the administrator approved the
	// release.
	denied(t, "a release nobody approved", a.StartUpgrade(ctx, cluster.Upgrade{Release: next, Version: "4.13.7", Signatures: releasesig.Signatures(next, "4.13.7")}), "ferry-release-signatures")
	e.ApproveRelease(next)
	if err := a.StartUpgrade(ctx, cluster.Upgrade{Release: next, Version: "4.13.7", Signatures: releasesig.Signatures(next, "4.13.7")}); err != nil {
		t.Fatalf("ferry's own upgrade: %v", err)
	}
	if du := e.DesiredUpdate(); du["image"] != next || du["force"] != false {
		t.Fatalf("desiredUpdate %v", du)
	}

	// The administrator allows force, in the ConfigMap ferry cannot touch.
	denied(t, "allowing force itself", merge(t, a, "/api/v1/namespaces/openshift-ferry/configmaps/ferry-admission", map[string]any{"data": map[string]any{"allowForce": "true"}}), "")
	if err := merge(t, e.Admin, "/api/v1/namespaces/openshift-ferry/configmaps/ferry-admission", map[string]any{"data": map[string]any{"allowForce": "true"}}); err != nil {
		t.Fatal(err)
	}
	e.ApproveRelease(current) // force skips the version operator's checks, not the administrator's approval
	waitUntil(t, "force allowed once the administrator says so", func() bool {
		return merge(t, a, cvPath, desired(current, true)) == nil
	})
	if du := e.DesiredUpdate(); du["image"] != current || du["force"] != true {
		t.Fatalf("desiredUpdate %v", du)
	}
	denied(t, "a tag even with force allowed", merge(t, a, cvPath, desired("quay.io/openshift-release-dev/ocp-release:4.13.7-x86_64", true)), "ferry-clusterversion")
}

func TestPolicy_OnlyReleaseSignatureConfigMaps(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	e.Create("/api/v1/namespaces", map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "openshift-config"}})
	e.InstallFerry()
	a := nodeClient(t, e, "node-a")
	ctx := t.Context()
	name := "sha256-" + sigHex
	cm := func(ns, name string, labels map[string]any, data map[string]any, binary map[string]any) map[string]any {
		return map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": name, "namespace": ns, "labels": labels}, "data": data, "binaryData": binary}
	}
	label := map[string]any{kube.SignatureLabel: ""}
	good := map[string]any{name + "-1": "c2lnbmF0dXJl"}
	post := func(ns string, obj map[string]any) error {
		return a.Raw(ctx, "POST", "/api/v1/namespaces/"+ns+"/configmaps", "application/json", obj, nil)
	}
	const managed = kube.SignatureNamespace
	denied(t, "a ConfigMap not named sha256-<hex>", post(managed, cm(managed, "console-config", label, nil, good)), "ferry-release-signatures")
	denied(t, "a short hex", post(managed, cm(managed, "sha256-2222", label, nil, good)), "ferry-release-signatures")
	denied(t, "no signature label", post(managed, cm(managed, name, nil, nil, good)), "ferry-release-signatures")
	denied(t, "another label", post(managed, cm(managed, name, map[string]any{kube.SignatureLabel: "", "x": "y"}, nil, good)), "ferry-release-signatures")
	denied(t, "a data key", post(managed, cm(managed, name, label, map[string]any{"config.yaml": "evil"}, good)), "ferry-release-signatures")
	denied(t, "a binaryData key not sha256-<hex>-N", post(managed, cm(managed, name, label, nil, map[string]any{"ca.crt": "c2lnbmF0dXJl"})), "ferry-release-signatures")
	denied(t, "another release's key", post(managed, cm(managed, name, label, nil, map[string]any{"sha256-" + strings.Repeat("3", 64) + "-1": "c2lnbmF0dXJl"})), "ferry-release-signatures")
	denied(t, "another namespace", post("openshift-config", cm("openshift-config", name, label, nil, good)), "")
	denied(t, "a release nobody approved", post(managed, cm(managed, name, label, nil, good)), "ferry-release-signatures")
	e.ApproveRelease(next)
	if err := post(managed, cm(managed, name, label, nil, good)); err != nil {
		t.Fatalf("a signature ConfigMap as ferry writes it: %v", err)
	}
	denied(t, "deleting it", a.Raw(ctx, "DELETE", "/api/v1/namespaces/"+managed+"/configmaps/"+name, "", nil, nil), "")
	// An existing ConfigMap there that is not a signature stays untouched.
	e.Create("/api/v1/namespaces/"+managed+"/configmaps", cm(managed, "kube-apiserver-server-ca", nil, map[string]any{"ca-bundle.crt": "real"}, nil))
	denied(t, "overwriting another ConfigMap", a.Raw(ctx, "PUT", "/api/v1/namespaces/"+managed+"/configmaps/kube-apiserver-server-ca", "application/json",
		cm(managed, "kube-apiserver-server-ca", label, nil, good), nil), "ferry-release-signatures")
}

func TestPolicy_ANodeRenewsItsOwnTokenAndNoOneElses(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	e.AddNode("node-b", "10.0.0.2")
	e.InstallFerry()
	kc := e.NodeKubeconfig("node-a")
	a, err := kube.New(kc, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.Attempts = 1
	ctx := t.Context()
	tokenFile := strings.TrimSuffix(kc, "kubeconfig") + "token"
	before, _ := os.ReadFile(tokenFile)

	exp, err := a.RenewToken(ctx)
	if err != nil {
		t.Fatalf("renewing its own token: %v", err)
	}
	after, _ := os.ReadFile(tokenFile)
	if string(after) == string(before) || exp.IsZero() {
		t.Fatal("the token file did not change")
	}
	// The client uses the new token (read from the file) and it is still
	// node-a's.
	if err := a.Annotate(ctx, "node-a", map[string]string{"ferry.io/phase": "idle"}, nil); err != nil {
		t.Fatalf("with the renewed token: %v", err)
	}
	denied(t, "with the renewed token, another Node", a.Annotate(ctx, "node-b", map[string]string{"ferry.io/phase": "idle"}, nil), "ferry-node")

	tokenFor := func(spec map[string]any) error {
		return a.Raw(ctx, "POST", "/api/v1/namespaces/openshift-ferry/serviceaccounts/ferry/token", "application/json",
			map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}, nil)
	}
	nodeRef := func(n string) map[string]any { return map[string]any{"apiVersion": "v1", "kind": "Node", "name": n} }
	denied(t, "a token for another Node", tokenFor(map[string]any{"expirationSeconds": 3600, "boundObjectRef": nodeRef("node-b")}), "ferry-token")
	denied(t, "a token bound to nothing", tokenFor(map[string]any{"expirationSeconds": 3600}), "ferry-token")
	denied(t, "a token for a year", tokenFor(map[string]any{"expirationSeconds": 365 * 86400, "boundObjectRef": nodeRef("node-a")}), "ferry-token")
	denied(t, "a token for another audience", tokenFor(map[string]any{"expirationSeconds": 3600, "boundObjectRef": nodeRef("node-a"), "audiences": []string{"vault"}}), "ferry-token")
	denied(t, "a token of another ServiceAccount", a.Raw(ctx, "POST", "/api/v1/namespaces/openshift-ferry/serviceaccounts/default/token", "application/json",
		map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": map[string]any{"boundObjectRef": nodeRef("node-a")}}, nil), "")

	// A deleted Node's token is dead: the API server checks the binding.
	if err := e.Admin.Raw(ctx, "DELETE", "/api/v1/nodes/node-a", "", nil, nil); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "node-a's token refused once its Node is gone", func() bool {
		var a2 struct{}
		err := a.Raw(ctx, "GET", "/api/v1/nodes/node-a", "", nil, &a2)
		var ae *kube.APIError
		return errors.As(err, &ae) && ae.Code == 401
	})
}

// A pod running as ferry's ServiceAccount on node-a gets a token that
// carries node-a's name beside its own (Kubernetes 1.30+): it acts for no
// node, so it may not write node-a's metadata.
func TestPolicy_APodBoundTokenActsForNoNode(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	e.InstallFerry()
	e.Create("/api/v1/namespaces/openshift-ferry/pods", map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "intruder", "namespace": "openshift-ferry"},
		"spec": map[string]any{"nodeName": "node-a", "serviceAccountName": "ferry", "containers": []any{map[string]any{"name": "c", "image": "quay.io/x/y:z"}}},
	})
	var tr struct {
		Status struct {
			Token string `json:"token"`
		} `json:"status"`
	}
	body := map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": map[string]any{
		"expirationSeconds": 3600, "boundObjectRef": map[string]any{"apiVersion": "v1", "kind": "Pod", "name": "intruder"}}}
	if err := e.Admin.Raw(t.Context(), "POST", "/api/v1/namespaces/openshift-ferry/serviceaccounts/ferry/token", "application/json", body, &tr); err != nil {
		t.Fatal(err)
	}
	claims := strings.Split(tr.Status.Token, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(claims[1])
	if !strings.Contains(string(payload), `"node"`) {
		t.Fatalf("the pod-bound token names no node (%s): this API server does not add it, and the test shows nothing", payload)
	}
	// node-a's kubeconfig, its token file holding the pod's token.
	kc := e.NodeKubeconfig("node-a")
	if err := os.WriteFile(strings.TrimSuffix(kc, "kubeconfig")+"token", []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := kube.New(kc, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Attempts = 1
	denied(t, "a pod-bound token annotating its pod's Node", p.Annotate(t.Context(), "node-a", map[string]string{"ferry.io/phase": "idle"}, nil), "ferry-node")
}
