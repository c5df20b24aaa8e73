package kube

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/test/kubeenv"
	"github.com/ferry-edge/ferry/test/releasesig"
)

// What a kubelet gains when ferry is installed (issue 41): ferry's
// narrow writes, nothing else, and no release the administrator has not
// approved.

// access is one question to the API server's authorizers (a
// SubjectAccessReview): the Node authorizer answers for a kubelet, then
// RBAC.
// A list or watch with fieldSelector metadata.name=N is asked as one
// with name N: the API server asks its authorizers so.
type access struct {
	verb, group, resource, sub, ns, name, fieldSelector string
}

func (a access) String() string {
	s := a.verb + " " + a.resource
	if a.sub != "" {
		s += "/" + a.sub
	}
	if a.group != "" {
		s += "." + a.group
	}
	if a.name != "" {
		s += "/" + a.name
	}
	if a.ns != "" {
		s += " in " + a.ns
	}
	if a.fieldSelector != "" {
		s += " where " + a.fieldSelector
	}
	return s
}

// allowed asks the API server whether user in groups may do a.
func allowed(t *testing.T, e *kubeenv.Env, user string, groups []string, a access) bool {
	t.Helper()
	ra := map[string]any{"verb": a.verb, "group": a.group, "resource": a.resource, "subresource": a.sub, "namespace": a.ns, "name": a.name}
	if a.fieldSelector != "" {
		ra["fieldSelector"] = map[string]any{"rawSelector": a.fieldSelector}
	}
	var sar struct {
		Status struct {
			Allowed bool   `json:"allowed"`
			Reason  string `json:"reason"`
		} `json:"status"`
	}
	if err := e.Admin.Raw(t.Context(), "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", "application/json", map[string]any{
		"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
		"spec": map[string]any{"user": user, "groups": groups, "resourceAttributes": ra}}, &sar); err != nil {
		t.Fatal(err)
	}
	return sar.Status.Allowed
}

// rulesOf is what RBAC grants c's user, as the API server reports it
// (SelfSubjectRulesReview), one "NAMESPACE VERB RESOURCE[.GROUP][/NAME]"
// each: "*" for what every namespace shows (cluster-wide rules).
func rulesOf(t *testing.T, c *kube.Client, namespaces []string) []string {
	t.Helper()
	in := map[string][]string{} // "VERB RESOURCE…" → the namespaces that show it
	for _, ns := range namespaces {
		var r struct {
			Status struct {
				ResourceRules []struct {
					Verbs         []string `json:"verbs"`
					APIGroups     []string `json:"apiGroups"`
					Resources     []string `json:"resources"`
					ResourceNames []string `json:"resourceNames"`
				} `json:"resourceRules"`
			} `json:"status"`
		}
		if err := c.Raw(t.Context(), "POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews", "application/json", map[string]any{
			"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": map[string]any{"namespace": ns}}, &r); err != nil {
			t.Fatal(err)
		}
		lines := map[string]bool{}
		for _, rule := range r.Status.ResourceRules {
			names := rule.ResourceNames
			if len(names) == 0 {
				names = []string{""}
			}
			for _, v := range rule.Verbs {
				for _, g := range rule.APIGroups {
					for _, res := range rule.Resources {
						for _, n := range names {
							line := v + " " + res
							if g != "" {
								line += "." + g
							}
							if n != "" {
								line += "/" + n
							}
							lines[line] = true
						}
					}
				}
			}
		}
		for l := range lines {
			in[l] = append(in[l], ns)
		}
	}
	var out []string
	for l, nss := range in {
		if len(nss) == len(namespaces) {
			out = append(out, "* "+l)
			continue
		}
		for _, ns := range nss {
			out = append(out, ns+" "+l)
		}
	}
	slices.Sort(out)
	return out
}

// kubeletGains is every right ferry's packaging/rbac.yaml gives group
// system:nodes, as the API server reports it: the rows of docs/security.md,
// "What each identity can do" (the kubelet after ferry). A change here is
// a change there. Each write is narrowed further by packaging/admission.yaml.
var kubeletGains = []string{
	// Its own UpgradeBundleNode (ferry-upgradebundlenode: one, its own,
	// owned by its Node, never deleted; delete is there only because
	// OwnerReferencesPermissionEnforcement asks it of whoever sets the
	// Node as owner). The summary's writer lists and watches them all.
	"* create upgradebundlenodes.ferry.io",
	"* delete upgradebundlenodes.ferry.io",
	"* get clusteroperators.config.openshift.io",
	"* get clusterversions.config.openshift.io",
	"* get machineconfigpools.machineconfiguration.openshift.io",
	"* get upgradebundlenodes.ferry.io",
	"* get upgradebundles.ferry.io",
	"* get upgradebundles/status.ferry.io",
	"* list clusteroperators.config.openshift.io",
	"* list clusterversions.config.openshift.io",
	"* list machineconfigpools.machineconfiguration.openshift.io",
	"* list upgradebundlenodes.ferry.io",
	"* list upgradebundles.ferry.io",
	"* patch clusterversions.config.openshift.io",
	"* patch machineconfigpools.machineconfiguration.openshift.io",
	"* patch nodes",
	"* patch upgradebundlenodes.ferry.io",
	"* patch upgradebundles/status.ferry.io",
	"* watch clusterversions.config.openshift.io",
	"* watch upgradebundlenodes.ferry.io",
	"* watch upgradebundles.ferry.io",
	"default create events",
	"kube-system get configmaps/extension-apiserver-authentication",
	"openshift-config get configmaps/admin-acks",
	"openshift-config-managed create configmaps",
	"openshift-config-managed get configmaps/admin-gates",
	"openshift-config-managed get configmaps/kubelet-serving-ca",
	"openshift-config-managed update configmaps",
	// Its own record (ferry-lease: one Lease, its own, never deleted;
	// delete is there only because OwnerReferencesPermissionEnforcement
	// asks it of whoever sets the Node as owner).
	"openshift-ferry create leases.coordination.k8s.io",
	"openshift-ferry delete leases.coordination.k8s.io",
	"openshift-ferry get leases.coordination.k8s.io",
	"openshift-ferry list leases.coordination.k8s.io",
	"openshift-ferry update leases.coordination.k8s.io",
	"openshift-ferry watch leases.coordination.k8s.io",
}

// TestRights_AKubeletGainsOnlyFerrysNarrowRights: before and after
// applying packaging/rbac.yaml and admission.yaml as shipped, kubelet w1
// (system:node:w1 in system:nodes) may not list every Pod, list or watch
// the Nodes, or read a Pod of another namespace; it may read its own Node
// and list its own Pods (the Node authorizer) both times; and what RBAC
// gives it after is kubeletGains exactly. ferry's ServiceAccount keeps
// its reads of every Node and the Pods.
func TestRights_AKubeletGainsOnlyFerrysNarrowRights(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("w1", "10.0.0.1")
	w1 := kubeletClient(t, e, "w1")
	kubelet := func(a access) bool {
		return allowed(t, e, "system:node:w1", []string{"system:nodes", "system:authenticated"}, a)
	}
	never := []access{
		{verb: "list", resource: "pods"},
		{verb: "watch", resource: "pods"},
		{verb: "list", resource: "nodes"},
		{verb: "watch", resource: "nodes"},
		{verb: "get", resource: "nodes", name: "w2"},
		{verb: "list", resource: "nodes", name: "w2"},
		{verb: "list", resource: "pods", fieldSelector: "spec.nodeName=w2"},
		{verb: "get", resource: "pods", ns: "openshift-etcd", name: "etcd-m1"},
		{verb: "list", resource: "pods", ns: "openshift-etcd"},
		{verb: "list", resource: "configmaps", ns: "openshift-config-managed"},
		{verb: "get", resource: "configmaps", ns: "openshift-config-managed", name: "sha256-" + sigHex},
		{verb: "get", resource: "configmaps", ns: "openshift-ferry", name: "ferry-admission"},
		{verb: "update", resource: "configmaps", ns: "openshift-ferry", name: "ferry-admission"},
		{verb: "get", resource: "secrets", ns: "openshift-config"},
		{verb: "create", resource: "serviceaccounts", sub: "token", ns: "openshift-ferry", name: "ferry"},
		{verb: "update", resource: "upgradebundles", group: "ferry.io", name: bundleName},
		{verb: "patch", resource: "upgradebundles", group: "ferry.io", name: bundleName},
		// Every UpgradeBundle is the administrator's (docs/security.md,
		// "How many objects one node can create").
		{verb: "create", group: "ferry.io", resource: "upgradebundles"},
		{verb: "delete", group: "ferry.io", resource: "upgradebundles", name: bundleName},
		{verb: "delete", resource: "configmaps", ns: "openshift-config-managed", name: "sha256-" + sigHex},
	}
	always := []access{
		{verb: "get", resource: "nodes", name: "w1"},
		{verb: "patch", resource: "nodes", name: "w1"},
		{verb: "list", resource: "nodes", name: "w1"},
		{verb: "watch", resource: "nodes", name: "w1"},
		{verb: "list", resource: "pods", fieldSelector: "spec.nodeName=w1"},
	}
	ferrys := []access{
		{verb: "patch", group: "config.openshift.io", resource: "clusterversions", name: "version"},
		{verb: "create", resource: "configmaps", ns: "openshift-config-managed"},
		{verb: "update", resource: "configmaps", ns: "openshift-config-managed", name: "sha256-" + sigHex},
		{verb: "get", resource: "configmaps", ns: "openshift-config-managed", name: "kubelet-serving-ca"},
		{verb: "patch", group: "ferry.io", resource: "upgradebundles", sub: "status", name: bundleName},
		{verb: "patch", group: "ferry.io", resource: "upgradebundlenodes", name: "w1"},
	}
	namespaces := []string{"default", "kube-system", "openshift-config", "openshift-config-managed", "openshift-ferry", "openshift-etcd"}

	before := rulesOf(t, w1, namespaces)
	for _, a := range append(never, ferrys...) {
		if kubelet(a) {
			t.Errorf("before ferry: a kubelet may %s", a)
		}
	}
	for _, a := range always {
		if !kubelet(a) {
			t.Errorf("before ferry: a kubelet may not %s (the Node authorizer should allow it)", a)
		}
	}

	e.InstallFerry()
	installBundles(e)
	for _, a := range never {
		if kubelet(a) {
			t.Errorf("with ferry: a kubelet may %s", a)
		}
	}
	for _, a := range append(always, ferrys...) {
		if !kubelet(a) {
			t.Errorf("with ferry: a kubelet may not %s", a)
		}
	}
	var gains []string
	for _, r := range rulesOf(t, w1, namespaces) {
		if !slices.Contains(before, r) {
			gains = append(gains, r)
		}
	}
	if !slices.Equal(gains, kubeletGains) {
		t.Errorf("ferry gives system:nodes:\n  %s\nwant (docs/security.md, \"What each identity can do\"):\n  %s", strings.Join(gains, "\n  "), strings.Join(kubeletGains, "\n  "))
	}

	// The ServiceAccount's token (no Node authorizer speaks for it).
	sa := func(a access) bool {
		return allowed(t, e, "system:serviceaccount:openshift-ferry:ferry", []string{"system:serviceaccounts", "system:serviceaccounts:openshift-ferry", "system:authenticated"}, a)
	}
	for _, a := range []access{{verb: "list", resource: "nodes"}, {verb: "watch", resource: "nodes"}, {verb: "list", resource: "pods"}, {verb: "create", resource: "serviceaccounts", sub: "token", ns: "openshift-ferry", name: "ferry"}} {
		if !sa(a) {
			t.Errorf("ferry's ServiceAccount may not %s", a)
		}
	}
	for _, a := range []access{{verb: "get", resource: "pods", ns: "openshift-etcd", name: "etcd-m1"}, {verb: "get", resource: "secrets", ns: "openshift-config"},
		{verb: "create", group: "ferry.io", resource: "upgradebundles"}} {
		if sa(a) {
			t.Errorf("ferry's ServiceAccount may %s", a)
		}
	}
}

const unapprovedHex = "3333333333333333333333333333333333333333333333333333333333333333"

// TestPolicy_AReleaseIsStartedOnlyOnceTheAdministratorApprovesIt: with
// a worker's kubelet credential, a well-formed signature ConfigMap and a
// desiredUpdate for a release nobody approved are refused, each refusal
// naming the one command that approves it; once the administrator ran
// it, both pass (the signatures written blind: a kubelet cannot read
// them), and another release is still refused.
func TestPolicy_AReleaseIsStartedOnlyOnceTheAdministratorApprovesIt(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("w1", "10.0.0.1")
	e.InstallFerry()
	w1 := kubeletClient(t, e, "w1")
	ctx := t.Context()
	release := "quay.io/openshift-release-dev/ocp-release@sha256:" + unapprovedHex
	name := "sha256-" + unapprovedHex
	approve := cluster.ApproveCommand(release)
	sigs := func(sig string) map[string]any {
		return map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata":   map[string]any{"name": name, "namespace": kube.SignatureNamespace, "labels": map[string]any{kube.SignatureLabel: ""}},
			"binaryData": map[string]any{name + "-1": sig}}
	}
	says := func(what string, err error, policy string) {
		t.Helper()
		denied(t, what, err, policy)
		if err != nil && !strings.Contains(err.Error(), approve) {
			t.Errorf("%s: %v\nwant the command that approves it: %s", what, err, approve)
		}
	}

	says("the signatures of a release nobody approved", w1.Raw(ctx, "POST", "/api/v1/namespaces/"+kube.SignatureNamespace+"/configmaps", "application/json", sigs(base64.StdEncoding.EncodeToString(releasesig.Signatures(release, "4.13.7")[0])), nil), "ferry-release-signatures")
	says("a desiredUpdate to a release nobody approved", merge(t, w1, cvPath, desired(release, false)), "ferry-clusterversion")
	err := w1.StartUpgrade(ctx, cluster.Upgrade{Release: release, Version: "4.13.7", Signatures: releasesig.Signatures(release, "4.13.7")})
	if !errors.Is(err, cluster.ErrReleaseUnapproved) {
		t.Errorf("ferry's own call: %v, want cluster.ErrReleaseUnapproved", err)
	}
	if _, _, ok := e.ConfigMap(kube.SignatureNamespace, name); ok {
		t.Error("the signature ConfigMap was written before the approval")
	}
	if du := e.DesiredUpdate(); du != nil {
		t.Fatalf("desiredUpdate set before the approval: %v", du)
	}
	// A kubelet cannot approve.
	denied(t, "a kubelet approving", merge(t, w1, "/api/v1/namespaces/openshift-ferry/configmaps/ferry-admission", map[string]any{"data": map[string]any{name: "approved"}}), "")

	// The administrator runs the command ferry printed.
	if !strings.Contains(approve, `-p '{"data":{"`+name+`":"approved"}}'`) {
		t.Fatalf("the command %s", approve)
	}
	e.ApproveRelease(release)
	if err := w1.StartUpgrade(ctx, cluster.Upgrade{Release: release, Version: "4.13.7", Signatures: releasesig.Signatures(release, "4.13.7")}); err != nil {
		t.Fatalf("after the approval: %v", err)
	}
	if du := e.DesiredUpdate(); du["image"] != release {
		t.Fatalf("desiredUpdate %v", du)
	}
	// Written again (the same release's signatures, read from another
	// bundle), without a read: a kubelet may not get the ConfigMap.
	denied(t, "reading the signatures back", w1.Raw(ctx, "GET", "/api/v1/namespaces/"+kube.SignatureNamespace+"/configmaps/"+name, "", nil, nil), "")
	again := append(releasesig.Signatures(release, "4.13.7"), releasesig.NewKey().SignRelease(release, "4.13.7", "x86_64"))
	if err := w1.StartUpgrade(ctx, cluster.Upgrade{Release: release, Version: "4.13.7", Signatures: again}); err != nil {
		t.Fatalf("writing the signatures again: %v", err)
	}
	if _, data, ok := e.ConfigMap(kube.SignatureNamespace, name); !ok || !bytes.Equal(data[name+"-2"], again[1]) {
		t.Errorf("the signatures after the second write: %q", data)
	}

	// Another release is still refused.
	other := "quay.io/openshift-release-dev/ocp-release@sha256:" + strings.Repeat("4", 64)
	err = merge(t, w1, cvPath, desired(other, false))
	denied(t, "another release", err, "ferry-clusterversion")
	if err != nil && !strings.Contains(err.Error(), cluster.ApproveCommand(other)) {
		t.Errorf("another release: %v, want its own command", err)
	}
}

// TestAgent_WaitsForTheAdministratorsApprovalOfTheRelease: the bundle is
// approved (its UpgradeBundle), the release is not: the agent reaches
// cluster-ready and waits, healthy, with the one command that approves
// the release in its status, on its Node and in its UpgradeBundle entry,
// asking again at a modest pace; once the administrator runs the
// command it starts the upgrade.
func TestAgent_WaitsForTheAdministratorsApprovalOfTheRelease(t *testing.T) {
	n := startBundleNode(t, func(e *kubeenv.Env, b bundleNode) {
		e.PatchBundleSpec(b.name, map[string]any{"approvedDigest": b.digest, "schedule": "Automatic"})
	})
	e, a, meta, name := n.e, n.a, n.meta, n.name
	t.Cleanup(func() {
		if t.Failed() {
			s, _ := a.Status(context.Background())
			t.Logf("the UpgradeBundle: %v\nthe agent: %+v\nits log:\n%s", e.Bundle(name), s, a.Logs())
		}
	})
	approve := cluster.ApproveCommand(meta.Release)
	s := a.Wait(bound, "waiting for the release's approval", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseClusterReady) && s.Reason == agent.ReasonReleaseUnapproved
	})
	// The command that approves it is what the administrator acts on.
	if !s.Healthy || !strings.Contains(s.Message, approve) {
		t.Errorf("status %+v: waiting for the administrator is healthy and names the command %s", s, approve)
	}
	waitUntil(t, "the command on the Node", func() bool { return e.Annotations("node-a")["ferry.io/reason"] == s.Message })
	waitUntil(t, "the reason and the command in node-a's UpgradeBundle entry", func() bool {
		entry := e.BundleNodes(name)["node-a"]
		return entry.Reason == agent.ReasonReleaseUnapproved && entry.Message == s.Message
	})
	if du := e.DesiredUpdate(); du != nil {
		t.Fatalf("desiredUpdate before the approval: %v", du)
	}
	// Not an error storm: over 10 s, at most one more try (every 30 s).
	r0 := e.Requests()["POST configmaps"]
	time.Sleep(10 * time.Second)
	if d := e.Requests()["POST configmaps"] - r0; d > 1 {
		t.Errorf("%v signature writes in 10 s while waiting for the administrator", d)
	}

	e.ApproveRelease(meta.Release)
	waitUntil(t, "the upgrade asked for", func() bool { du := e.DesiredUpdate(); return du != nil && du["image"] == meta.Release })
	a.Wait(bound, "the wait over", func(s agent.Status) bool { return s.Reason != agent.ReasonReleaseUnapproved })
}
