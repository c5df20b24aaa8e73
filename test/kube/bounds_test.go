package kube

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// A node's credential gone bad cannot grow the cluster beyond what ferry
// itself writes (issue 34, finding 2): each request here comes from
// node-a's own credential against exactly what ferry ships (rbac.yaml,
// admission.yaml, upgradebundle-crd.yaml).

// invalid fails the test unless err is the API server's refusal of an
// object its schema does not allow (422), naming field.
func invalid(t *testing.T, what string, err error, field string) {
	t.Helper()
	var ae *kube.APIError
	if !errors.As(err, &ae) || ae.Code != http.StatusUnprocessableEntity {
		t.Errorf("%s: %v, want 422 (the CRD's bounds)", what, err)
		return
	}
	if !strings.Contains(err.Error(), field) {
		t.Errorf("%s: refused, but not for %s: %v", what, field, err)
	}
}

func TestPolicy_SignatureConfigMapsAreBoundedAndNeverImmutable(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	e.InstallFerry()
	e.ApproveRelease(next) // its signatures are what is bounded here
	a := nodeClient(t, e, "node-a")
	ctx := t.Context()
	const managed = kube.SignatureNamespace
	name := "sha256-" + sigHex
	sig := func(n int) string { return base64.StdEncoding.EncodeToString([]byte(strings.Repeat("s", n))) }
	cm := func(binary map[string]any, extra map[string]any, meta map[string]any) map[string]any {
		md := map[string]any{"name": name, "namespace": managed, "labels": map[string]any{kube.SignatureLabel: ""}}
		for k, v := range meta {
			md[k] = v
		}
		o := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": md, "binaryData": binary}
		for k, v := range extra {
			o[k] = v
		}
		return o
	}
	keys := func(n, size int) map[string]any {
		m := map[string]any{}
		for i := 1; i <= n; i++ {
			m[fmt.Sprintf("%s-%d", name, i)] = sig(size)
		}
		return m
	}
	post := func(obj map[string]any) error {
		return a.Raw(ctx, "POST", "/api/v1/namespaces/"+managed+"/configmaps", "application/json", obj, nil)
	}
	put := func(obj map[string]any) error {
		return a.Raw(ctx, "PUT", "/api/v1/namespaces/"+managed+"/configmaps/"+name, "application/json", obj, nil)
	}

	denied(t, "immutable: true", post(cm(keys(1, 600), map[string]any{"immutable": true}, nil)), "ferry-release-signatures")
	denied(t, "a 17th signature", post(cm(keys(17, 600), nil, nil)), "ferry-release-signatures")
	denied(t, "signature -100", post(cm(map[string]any{name + "-100": sig(600)}, nil, nil)), "ferry-release-signatures")
	denied(t, "a signature over 16 KiB", post(cm(keys(1, 16<<10+3), nil, nil)), "ferry-release-signatures")
	denied(t, "16 signatures of 64 KiB (1 MiB)", post(cm(keys(16, 64<<10), nil, nil)), "ferry-release-signatures")
	denied(t, "an annotation", post(cm(keys(1, 600), nil, map[string]any{"annotations": map[string]any{"x": strings.Repeat("y", 200<<10)}})), "ferry-release-signatures")
	denied(t, "a finalizer", post(cm(keys(1, 600), nil, map[string]any{"finalizers": []any{"example.com/keep"}})), "ferry-release-signatures")
	if _, _, ok := e.ConfigMap(managed, name); ok {
		t.Fatal("a refused ConfigMap exists")
	}

	// What ferry writes (signatures as many and as large as it takes from
	// a store, 16 of at most 16 KiB) goes through, by ferry's own call.
	sigs := make([][]byte, 16)
	for i := range sigs {
		sigs[i] = []byte(strings.Repeat(fmt.Sprint(i%10), 16<<10))
	}
	if err := a.StartUpgrade(ctx, cluster.Upgrade{Release: next, Version: "4.13.7", Signatures: sigs}); err != nil {
		t.Fatalf("ferry's own signatures: %v", err)
	}
	// Made immutable afterwards, or grown, by a node (an unconditional
	// update: a node may not read it): refused too.
	denied(t, "making it immutable", put(cm(keys(1, 600), map[string]any{"immutable": true}, nil)), "ferry-release-signatures")
	denied(t, "growing a signature past 16 KiB", put(cm(keys(1, 16<<10+3), nil, nil)), "ferry-release-signatures")
	// ferry writes the release's signatures again, as on a retry.
	if err := a.StartUpgrade(ctx, cluster.Upgrade{Release: next, Version: "4.13.7", Signatures: sigs[:2]}); err != nil {
		t.Fatalf("ferry writing the signatures again: %v", err)
	}
	if _, data, _ := e.ConfigMap(managed, name); len(data) != 2 {
		t.Errorf("after ferry's second write: %d signatures, want 2", len(data))
	}
}

// TestPolicy_UpgradeBundlesAreBoundedByNameAndSize: the CRD takes only
// names ferry reads (for everyone, the administrator included), each
// name ferry spells; the administrator's resource (a node creates none:
// TestPolicy_ANodeCreatesNoUpgradeBundleHoweverOftenItAsks) then takes
// ferry's largest status and no larger one.
func TestPolicy_UpgradeBundlesAreBoundedByNameAndSize(t *testing.T) {
	e := kubeenv.Start(t, current)
	a := ferryClient(t, e)
	installBundles(e)
	ctx := t.Context()
	create := func(name string) error {
		return e.Admin.Raw(ctx, "POST", "/apis/ferry.io/v1alpha1/upgradebundles", "application/json",
			map[string]any{"apiVersion": "ferry.io/v1alpha1", "kind": "UpgradeBundle", "metadata": map[string]any{"name": name}}, nil)
	}
	// A name ferry would never read is refused for everyone, by the CRD.
	for _, name := range []string{"evil", "ferry-probe", "4.13.7-x86-64-and-more", strings.Repeat("4", 70) + "-x86-64", "4.13.7-riscv64", "4.13.7-amd64"} {
		invalid(t, "an UpgradeBundle named "+name, create(name), "as ferry spells it")
	}
	for _, v := range []struct{ version, arch string }{{"4.13.7", "x86_64"}, {"4.14.0-RC.1", "aarch64"}, {"4.13.7+build_1", "s390x"}, {strings.Repeat("9", 64), "ppc64le"}} {
		name := agent.ResourceName(v.version, v.arch)
		if err := create(name); err != nil {
			t.Errorf("creating %s (version %s, arch %s): %v", name, v.version, v.arch, err)
		}
	}

	// The status: ferry's own largest write fits; a larger one does not.
	long := strings.Repeat("x", 1024)
	warnings := make([]string, 16)
	for i := range warnings {
		warnings[i] = long
	}
	sum := cluster.BundleSummary{Version: "4.13.7", Arch: "x86_64", Release: "quay.io/" + strings.Repeat("r", 900) + "@sha256:" + sigHex,
		Digest: "sha256:" + sigHex, Size: "14.2 GiB", Images: 190, Phase: "loading", NodesReady: "0/1", Approved: "waiting for approval", Warnings: warnings}
	entry := cluster.BundleNodeEntry{Phase: "loading", Digest: "sha256:" + sigHex, Reason: strings.Repeat("R", 64), Message: long, Conditions: []cluster.BundleCondition{
		{Type: "Extracted", Status: "True", Reason: "Loading"}, {Type: "Loaded", Status: "False", Reason: "Loading", Message: long}, {Type: "Updated", Status: "False", Reason: "Loading", Message: long}}}
	const name = bundleName
	if err := a.PublishBundleStatus(ctx, name, sum, "node-a", entry); err != nil {
		t.Fatalf("ferry's largest status: %v", err)
	}
	grown := func(f func(s *cluster.BundleSummary, n *cluster.BundleNodeEntry)) error {
		s, n := sum, entry
		s.Warnings = append([]string(nil), sum.Warnings...)
		n.Conditions = append([]cluster.BundleCondition(nil), entry.Conditions...)
		f(&s, &n)
		return a.PublishBundleStatus(ctx, name, s, "node-a", n)
	}
	invalid(t, "a 17th warning", grown(func(s *cluster.BundleSummary, _ *cluster.BundleNodeEntry) { s.Warnings = append(s.Warnings, "w") }), "status.warnings")
	invalid(t, "a warning of 1 MiB", grown(func(s *cluster.BundleSummary, _ *cluster.BundleNodeEntry) { s.Warnings[0] = strings.Repeat("w", 1<<20) }), "status.warnings")
	invalid(t, "a size string of 64 KiB", grown(func(s *cluster.BundleSummary, _ *cluster.BundleNodeEntry) { s.Size = strings.Repeat("9", 64<<10) }), "status.size")
	invalid(t, "a release of 64 KiB", grown(func(s *cluster.BundleSummary, _ *cluster.BundleNodeEntry) { s.Release = strings.Repeat("r", 64<<10) }), "status.release")
	invalid(t, "257 excluded nodes", grown(func(s *cluster.BundleSummary, _ *cluster.BundleNodeEntry) {
		for i := range 257 {
			s.Excluded = append(s.Excluded, fmt.Sprintf("node-%d: listed in spec.excludedNodes", i))
		}
	}), "status.excluded")
	invalid(t, "its own reason of 65 bytes", grown(func(_ *cluster.BundleSummary, n *cluster.BundleNodeEntry) { n.Reason = strings.Repeat("R", 65) }), "reason")
	invalid(t, "its own reason in words", grown(func(_ *cluster.BundleSummary, n *cluster.BundleNodeEntry) { n.Reason = "waiting for approval" }), "reason")
	invalid(t, "its own message of 64 KiB", grown(func(_ *cluster.BundleSummary, n *cluster.BundleNodeEntry) { n.Message = strings.Repeat("m", 64<<10) }), "message")
	invalid(t, "its own excluded of 64 KiB", grown(func(_ *cluster.BundleSummary, n *cluster.BundleNodeEntry) { n.Excluded = strings.Repeat("r", 64<<10) }), "excluded")
	invalid(t, "a condition message of 64 KiB", grown(func(_ *cluster.BundleSummary, n *cluster.BundleNodeEntry) {
		n.Conditions[1].Message = strings.Repeat("m", 64<<10)
	}), "message")
	invalid(t, "a digest that is not one", grown(func(_ *cluster.BundleSummary, n *cluster.BundleNodeEntry) {
		n.Digest = digest.Digest(strings.Repeat("d", 4096))
	}), "digest")
	if ub, _, err := a.UpgradeBundle(ctx, name); err != nil || ub.Nodes["node-a"].Message != long {
		t.Errorf("after the refusals: %+v, %v", ub.Nodes["node-a"], err)
	}
}

// TestPolicy_ASummaryIsOfItsOwnBundleAndAnEventOfItsOwnNode: the summary
// of an UpgradeBundle's status is held to the version and arch the
// resource is named for and to no spec generation it has not reached
// (the nodes' entries are in their own objects, which the policy cannot
// read: docs/security.md), and a node records Events in its own name only
// (issue 34, finding 3).
func TestPolicy_ASummaryIsOfItsOwnBundleAndAnEventOfItsOwnNode(t *testing.T) {
	e := kubeenv.Start(t, current)
	a := ferryClient(t, e)
	e.AddNode("node-b", "10.0.0.2")
	b := nodeClient(t, e, "node-b")
	installBundles(e)
	ctx := t.Context()
	const name = bundleName
	e.CreateBundle(name)
	real := "sha256:" + strings.Repeat("a", 64)
	honest := cluster.BundleSummary{Version: "4.13.7", Arch: "x86_64", Digest: digest.Digest(real), Phase: "loaded", NodesReady: "1/2", Approved: "digest", ObservedGeneration: 1}
	if err := b.PublishBundleStatus(ctx, name, honest, "node-b", cluster.BundleNodeEntry{Phase: "loaded", Digest: digest.Digest(real)}); err != nil {
		t.Fatalf("node-b's honest status: %v", err)
	}
	publish := func(f func(s *cluster.BundleSummary)) error {
		s := honest
		f(&s)
		return a.PublishBundleSummary(ctx, name, "node-a", s)
	}
	const policy = "ferry-upgradebundle"
	denied(t, "another version", publish(func(s *cluster.BundleSummary) { s.Version = "4.13.9" }), policy)
	denied(t, "another arch", publish(func(s *cluster.BundleSummary) { s.Arch = "aarch64" }), policy)
	denied(t, "a generation the spec has not reached", publish(func(s *cluster.BundleSummary) { s.ObservedGeneration = 9 }), policy)
	denied(t, "a condition of a generation the spec has not reached", publish(func(s *cluster.BundleSummary) {
		s.Conditions = []cluster.BundleCondition{{Type: "Approved", Status: "True", Reason: "ApprovedDigest", Message: "m", ObservedGeneration: 9}}
	}), policy)
	invalid(t, "an approval the CRD does not know", publish(func(s *cluster.BundleSummary) { s.Approved = "approved by the administrator" }), "status.approved")
	invalid(t, "a hop the CRD does not take", publish(func(s *cluster.BundleSummary) { s.Hop = "two of three" }), "status.hop")
	o, _ := e.UpgradeBundle(name)
	if got := o.Status; got.Digest != real || got.NodesReady != "1/2" || got.Approved != "digest" {
		t.Fatalf("the summary after the refusals: %+v", got)
	}
	// The summary moves to the node that writes it now.
	if err := publish(func(s *cluster.BundleSummary) { s.NodesReady = "2/2" }); err != nil {
		t.Fatalf("node-a's summary: %v", err)
	}
	if o, _ := e.UpgradeBundle(name); o.Status.NodesReady != "2/2" {
		t.Errorf("the summary node-a wrote: %+v", o.Status)
	}

	// Events: only in its own name, about an UpgradeBundle, short.
	event := func(host, instance, msg string, involved map[string]any) error {
		return a.Raw(ctx, "POST", "/api/v1/namespaces/default/events", "application/json", map[string]any{
			"apiVersion": "v1", "kind": "Event", "metadata": map[string]any{"generateName": name + "."},
			"involvedObject": involved, "type": "Normal", "reason": "Loaded", "message": msg,
			"source": map[string]any{"component": "ferry", "host": host}, "reportingComponent": "ferry.io/agent", "reportingInstance": instance,
			"firstTimestamp": "2024-01-01T00:00:00Z", "lastTimestamp": "2024-01-01T00:00:00Z", "count": 1,
		}, nil)
	}
	ub := map[string]any{"apiVersion": "ferry.io/v1alpha1", "kind": "UpgradeBundle", "name": name}
	denied(t, "an Event as node-b", event("node-b", "node-b", "node-b: loaded", ub), "ferry-events")
	denied(t, "an Event saying node-b", event("node-a", "node-a", "node-b: loaded", ub), "ferry-events")
	denied(t, "an Event from node-a's source as node-b's instance", event("node-a", "node-b", "node-a: loaded", ub), "ferry-events")
	denied(t, "an Event on a Node", event("node-a", "node-a", "node-a: loaded", map[string]any{"apiVersion": "v1", "kind": "Node", "name": "node-b"}), "ferry-events")
	denied(t, "an Event of 64 KiB", event("node-a", "node-a", "node-a: "+strings.Repeat("x", 64<<10), ub), "ferry-events")
	if err := a.BundleEvent(ctx, name, "", "node-a", "Normal", "Loaded", "node-a: loaded"); err != nil {
		t.Fatalf("ferry's own Event: %v", err)
	}
	if evs := e.Events(name); len(evs) != 1 || evs[0] != "Normal Loaded: node-a: loaded" {
		t.Errorf("events %q", evs)
	}
}
