package kube

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferry-edge/ferry/api/v1alpha1"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
)

// The UpgradeBundle resource (group ferry.io, packaging/
// upgradebundle-crd.yaml): its spec is the administrator's, its status
// ferry's summary; each node's entry is in its UpgradeBundleNode
// (bundlenodes.go).

const bundlesPath = "/apis/" + v1alpha1.APIVersion + "/" + v1alpha1.Resource

// typeMeta is what every UpgradeBundle ferry sends says it is.
var typeMeta = metav1.TypeMeta{APIVersion: v1alpha1.APIVersion, Kind: v1alpha1.Kind}

// pullRecord is p as ferry reads it.
func pullRecord(p *v1alpha1.PullStatus) *cluster.PullRecord {
	if p == nil {
		return nil
	}
	r := &cluster.PullRecord{Release: p.Release, Digest: digest.Digest(p.Digest), Extras: map[string]digest.Digest{}}
	for _, e := range p.Extras {
		r.Extras[e.Image] = digest.Digest(e.Digest)
	}
	return r
}

// pullOf is r as the API holds it, its extras sorted, at most
// cluster.MaxPullExtras (the CRD's bound).
func pullOf(r *cluster.PullRecord) *v1alpha1.PullStatus {
	if r == nil {
		return nil
	}
	p := &v1alpha1.PullStatus{Release: r.Release, Digest: string(r.Digest)}
	for _, img := range slices.Sorted(maps.Keys(r.Extras)) {
		p.Extras = append(p.Extras, v1alpha1.PulledImage{Image: img, Digest: string(r.Extras[img])})
	}
	p.Extras = p.Extras[:min(len(p.Extras), cluster.MaxPullExtras)]
	return p
}

// UpgradeBundle reads the UpgradeBundle name, with every node's entry
// for it; ok is false when there is none (or no CRD).
func (c *Client) UpgradeBundle(ctx context.Context, name string) (cluster.BundleView, bool, error) {
	var o v1alpha1.UpgradeBundle
	err := c.do(ctx, "GET", bundlesPath+"/"+url.PathEscape(name), "", nil, &o)
	if IsNotFound(err) {
		return cluster.BundleView{}, false, nil
	}
	if err != nil {
		return cluster.BundleView{}, false, fmt.Errorf("reading upgradebundle %s: %w", name, err)
	}
	objs, err := c.listBundleNodes(ctx)
	if err != nil {
		return cluster.BundleView{}, false, err
	}
	return view(&o, entriesFor(objs, name)), true, nil
}

// view is the resource o, with the nodes' entries for it, as ferry reads
// it.
func view(o *v1alpha1.UpgradeBundle, entries map[string]cluster.BundleNodeEntry) cluster.BundleView {
	s := o.Spec
	v := cluster.BundleView{UID: string(o.UID), Generation: o.Generation, Nodes: entries, Policy: cluster.BundlePolicy{
		ApprovedDigest: s.ApprovedDigest, Schedule: s.Schedule, Proceed: s.Proceed, ExcludedNodes: s.ExcludedNodes, Cleanup: s.Cleanup,
		KeepPools: s.PausePools != nil && !*s.PausePools}}
	if s.NotReadyTimeout != "" {
		// The CRD's pattern admits only Go durations.
		v.Policy.NotReadyTimeout, _ = time.ParseDuration(s.NotReadyTimeout)
	}
	if v.Nodes == nil {
		v.Nodes = map[string]cluster.BundleNodeEntry{}
	}
	v.Conditions = conditionsOf(o.Status.Conditions)
	return v
}

// conditionsOf is conditions as ferry reads them.
func conditionsOf(conditions []metav1.Condition) []cluster.BundleCondition {
	var out []cluster.BundleCondition
	for _, c := range conditions {
		out = append(out, cluster.BundleCondition{Type: c.Type, Status: string(c.Status), Reason: c.Reason, Message: c.Message,
			Since: c.LastTransitionTime.UTC(), ObservedGeneration: c.ObservedGeneration})
	}
	return out
}

// conditionsIn is conditions as the API holds them, written at now: a
// metav1.Condition always has a lastTransitionTime, so one ferry does not
// know is the time of the write, as the API conventions allow.
func conditionsIn(conditions []cluster.BundleCondition, now time.Time) []metav1.Condition {
	var out []metav1.Condition
	for _, c := range conditions {
		since := c.Since
		if since.IsZero() {
			since = now
		}
		out = append(out, metav1.Condition{Type: c.Type, Status: metav1.ConditionStatus(c.Status), Reason: c.Reason, Message: c.Message,
			ObservedGeneration: c.ObservedGeneration, LastTransitionTime: metav1.NewTime(since.UTC().Truncate(time.Second))})
	}
	return out
}

// entryOf is a node's entry as the API holds it.
func entryOf(e cluster.BundleNodeEntry, now time.Time) v1alpha1.NodeStatus {
	return v1alpha1.NodeStatus{Phase: e.Phase, Digest: string(e.Digest), Reason: e.Reason, Message: e.Message, Excluded: e.Excluded, Pull: pullOf(e.Pull),
		Conditions: conditionsIn(e.Conditions, now)}
}

// summaryOf is the summary as the API holds it.
func summaryOf(sum cluster.BundleSummary, now time.Time) v1alpha1.UpgradeBundleStatus {
	return v1alpha1.UpgradeBundleStatus{Version: sum.Version, Arch: sum.Arch, Release: sum.Release, Digest: string(sum.Digest), Size: sum.Size,
		Images: sum.Images, Phase: sum.Phase, NodesReady: sum.NodesReady, Approved: sum.Approved, Warnings: sum.Warnings, Excluded: sum.Excluded,
		Behind: sum.Behind, Conditions: conditionsIn(sum.Conditions, now), ObservedGeneration: sum.ObservedGeneration,
		Path: sum.Path, Hop: sum.Hop, Hops: hopsOf(sum.Hops)}
}

// hopsOf is a path's hops as the API holds them (path.go).
func hopsOf(hops []cluster.PathHop) []v1alpha1.PathHop {
	var out []v1alpha1.PathHop
	for _, h := range hops {
		out = append(out, v1alpha1.PathHop{Version: h.Version, Release: h.Release, State: h.State, Message: h.Message})
	}
	return out
}

// BundleEvent records an Event on the UpgradeBundle (uid may be empty),
// as oc describe shows it: eventType "Normal" or "Warning".
func (c *Client) BundleEvent(ctx context.Context, name, uid, node, eventType, reason, message string) error {
	now := time.Now().UTC().Format(time.RFC3339)
	ev := map[string]any{
		"apiVersion": "v1", "kind": "Event",
		"metadata":       map[string]any{"generateName": name + "."},
		"involvedObject": map[string]any{"apiVersion": "ferry.io/v1alpha1", "kind": "UpgradeBundle", "name": name, "uid": uid},
		"type":           eventType, "reason": reason, "message": message,
		"source":         map[string]any{"component": "ferry", "host": node},
		"firstTimestamp": now, "lastTimestamp": now, "count": 1,
		"reportingComponent": "ferry.io/agent", "reportingInstance": node,
	}
	if err := c.do(ctx, "POST", "/api/v1/namespaces/default/events", jsonType, ev, nil); err != nil {
		return fmt.Errorf("recording an event on upgradebundle %s: %w", name, err)
	}
	return nil
}

// Approvals is every UpgradeBundle's spec.approvedDigest, with the
// resource that holds it (none without the CRD).
func (c *Client) Approvals(ctx context.Context) ([]cluster.Approval, error) {
	bs, err := c.listBundles(ctx)
	return approvedOf(bs), err
}

// Sources is every UpgradeBundle's spec.source (none without the CRD).
func (c *Client) Sources(ctx context.Context) ([]cluster.RegistrySource, error) {
	bs, err := c.listBundles(ctx)
	return sourcesOf(bs), err
}

// listBundles is every UpgradeBundle (none without the CRD).
func (c *Client) listBundles(ctx context.Context) ([]v1alpha1.UpgradeBundle, error) {
	var list v1alpha1.UpgradeBundleList
	err := c.do(ctx, "GET", bundlesPath, "", nil, &list)
	if IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the upgradebundles: %w", err)
	}
	return list.Items, nil
}

func sourcesOf(bundles []v1alpha1.UpgradeBundle) []cluster.RegistrySource {
	var out []cluster.RegistrySource
	for _, b := range bundles {
		if s := b.Spec.Source; s != nil && s.Release != "" && !b.Spec.Cleanup {
			out = append(out, cluster.RegistrySource{Bundle: b.Name, Release: s.Release, Extras: s.ExtraImages,
				Node: s.Node, RateLimit: s.RateLimit, Window: s.Window, Created: b.CreationTimestamp.UTC()})
		}
	}
	return out
}

func approvedOf(bundles []v1alpha1.UpgradeBundle) []cluster.Approval {
	var out []cluster.Approval
	for _, b := range bundles {
		if b.Spec.ApprovedDigest != "" {
			out = append(out, cluster.Approval{Bundle: b.Name, Digest: b.Spec.ApprovedDigest})
		}
	}
	return out
}

// ApproveBundle writes the administrator's approval of d, and schedule
// when not empty, into the spec of the UpgradeBundle name, creating it
// when it does not exist (ferry approve; a node never creates one).
// before is the spec it held (nil when it was created here).
func (c *Client) ApproveBundle(ctx context.Context, name string, d digest.Digest, schedule string) (before *cluster.BundlePolicy, err error) {
	spec := map[string]any{"approvedDigest": string(d)}
	if schedule != "" {
		spec["schedule"] = schedule
	}
	var o v1alpha1.UpgradeBundle
	err = c.do(ctx, "GET", bundlesPath+"/"+url.PathEscape(name), "", nil, &o)
	if IsNotFound(err) {
		obj := map[string]any{"apiVersion": "ferry.io/v1alpha1", "kind": "UpgradeBundle", "metadata": map[string]any{"name": name}, "spec": spec}
		err = c.do(ctx, "POST", bundlesPath, jsonType, obj, nil)
		if err == nil {
			return nil, nil
		}
		if !IsConflict(err) {
			return nil, fmt.Errorf("creating upgradebundle %s: %w", name, err)
		}
		// Created meanwhile (another ferry approve, an oc apply): write
		// the spec into that one.
		err = c.do(ctx, "GET", bundlesPath+"/"+url.PathEscape(name), "", nil, &o)
	}
	if err != nil {
		return nil, fmt.Errorf("reading upgradebundle %s: %w", name, err)
	}
	p := view(&o, nil).Policy
	if err := c.do(ctx, "PATCH", bundlesPath+"/"+url.PathEscape(name), mergePatch, map[string]any{"spec": spec}, nil); err != nil {
		return &p, fmt.Errorf("writing upgradebundle %s's spec: %w", name, err)
	}
	return &p, nil
}

// The ConfigMap in which the administrator approves releases
// (packaging/admission.yaml): one key sha256-<hex> per release.
const (
	AdmissionNamespace = LeaseNamespace
	AdmissionConfigMap = "ferry-admission"
)

// ApproveRelease approves a release in the admission ConfigMap: key is
// its sha256-<hex> (cluster.ApprovalKey), note the value; already is
// true when it was approved before.
func (c *Client) ApproveRelease(ctx context.Context, key, note string) (already bool, err error) {
	path := "/api/v1/namespaces/" + AdmissionNamespace + "/configmaps/" + AdmissionConfigMap
	var cm struct {
		Data map[string]string `json:"data"`
	}
	err = c.do(ctx, "GET", path, "", nil, &cm)
	if IsNotFound(err) {
		return false, fmt.Errorf("ConfigMap %s/%s does not exist: apply ferry's admission policies first (oc apply -f packaging/admission.yaml)", AdmissionNamespace, AdmissionConfigMap)
	}
	if err != nil {
		return false, fmt.Errorf("reading ConfigMap %s/%s: %w", AdmissionNamespace, AdmissionConfigMap, err)
	}
	if _, ok := cm.Data[key]; ok {
		return true, nil
	}
	if err := c.do(ctx, "PATCH", path, mergePatch, map[string]any{"data": map[string]string{key: note}}, nil); err != nil {
		return false, fmt.Errorf("approving release %s in ConfigMap %s/%s: %w", key, AdmissionNamespace, AdmissionConfigMap, err)
	}
	return false, nil
}
