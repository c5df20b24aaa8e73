package kube

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/ferry-edge/ferry/cluster"
)

// The UpgradeBundle resource (group ferry.io, packaging/
// upgradebundle-crd.yaml): its spec is the administrator's, its status
// ferry's, each node writing its own entry.

const bundlesPath = "/apis/ferry.io/v1alpha1/upgradebundles"

// bundleSpec is an UpgradeBundle's spec as the API holds it.
type bundleSpec struct {
	ApprovedDigest  string   `json:"approvedDigest,omitempty"`
	Schedule        string   `json:"schedule,omitempty"`
	Proceed         bool     `json:"proceed,omitempty"`
	ExcludedNodes   []string `json:"excludedNodes,omitempty"`
	NotReadyTimeout string   `json:"notReadyTimeout,omitempty"`
	Cleanup         bool     `json:"cleanup,omitempty"`
	// Source, when set, has the release pulled from the site's registry
	// (registry mode) instead of brought on a stick.
	Source *bundleSource `json:"source,omitempty"`
}

// bundleSource is an UpgradeBundle's spec.source.
type bundleSource struct {
	Release     string   `json:"release"`
	ExtraImages []string `json:"extraImages,omitempty"`
	Node        string   `json:"node,omitempty"`
	RateLimit   string   `json:"rateLimit,omitempty"`
	Window      string   `json:"window,omitempty"`
}

// bundleNode is one node's entry in an UpgradeBundle's status.
type bundleNode struct {
	Phase      string            `json:"phase,omitempty"`
	Digest     string            `json:"digest,omitempty"`
	Reason     string            `json:"reason,omitempty"`
	Message    string            `json:"message,omitempty"`
	Excluded   string            `json:"excluded,omitempty"`
	Conditions []bundleCondition `json:"conditions,omitempty"`
	Pull       *bundlePull       `json:"pull,omitempty"`
}

// bundlePull is the pulling node's record of its pull (registry mode).
type bundlePull struct {
	Release string      `json:"release,omitempty"`
	Digest  string      `json:"digest,omitempty"`
	Extras  []pullExtra `json:"extras,omitempty"`
}

// pullExtra is an extra image given by tag and the digest it resolved to.
type pullExtra struct {
	Image  string `json:"image"`
	Digest string `json:"digest"`
}

// record is p as ferry reads it.
func (p *bundlePull) record() *cluster.PullRecord {
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
func pullOf(r *cluster.PullRecord) *bundlePull {
	if r == nil {
		return nil
	}
	p := &bundlePull{Release: r.Release, Digest: string(r.Digest)}
	for _, img := range slices.Sorted(maps.Keys(r.Extras)) {
		p.Extras = append(p.Extras, pullExtra{Image: img, Digest: string(r.Extras[img])})
	}
	p.Extras = p.Extras[:min(len(p.Extras), cluster.MaxPullExtras)]
	return p
}

// bundleCondition is one of a node's conditions.
type bundleCondition struct {
	Type               string `json:"type"`
	Status             string `json:"status"`
	Reason             string `json:"reason,omitempty"`
	Message            string `json:"message,omitempty"`
	LastTransitionTime string `json:"lastTransitionTime,omitempty"`
	// ObservedGeneration: the resource's own conditions only.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

type upgradeBundle struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name              string    `json:"name"`
		UID               string    `json:"uid,omitempty"`
		CreationTimestamp time.Time `json:"creationTimestamp,omitzero"`
		Generation        int64     `json:"generation,omitempty"`
	} `json:"metadata"`
	Spec   bundleSpec `json:"spec"`
	Status struct {
		Nodes      map[string]bundleNode `json:"nodes"`
		Conditions []bundleCondition     `json:"conditions,omitempty"`
	} `json:"status"`
}

// UpgradeBundle reads the UpgradeBundle name; ok is false when there is
// none (or no CRD).
func (c *Client) UpgradeBundle(ctx context.Context, name string) (cluster.BundleView, bool, error) {
	var o upgradeBundle
	err := c.do(ctx, "GET", bundlesPath+"/"+url.PathEscape(name), "", nil, &o)
	if IsNotFound(err) {
		return cluster.BundleView{}, false, nil
	}
	if err != nil {
		return cluster.BundleView{}, false, fmt.Errorf("reading upgradebundle %s: %w", name, err)
	}
	return o.view(), true, nil
}

// view is the resource as ferry reads it.
func (o *upgradeBundle) view() cluster.BundleView {
	s := o.Spec
	v := cluster.BundleView{UID: o.Metadata.UID, Generation: o.Metadata.Generation, Nodes: map[string]cluster.BundleNodeEntry{}, Policy: cluster.BundlePolicy{
		ApprovedDigest: s.ApprovedDigest, Schedule: s.Schedule, Proceed: s.Proceed, ExcludedNodes: s.ExcludedNodes, Cleanup: s.Cleanup}}
	if s.NotReadyTimeout != "" {
		// The CRD's pattern admits only Go durations.
		v.Policy.NotReadyTimeout, _ = time.ParseDuration(s.NotReadyTimeout)
	}
	for n, e := range o.Status.Nodes {
		entry := cluster.BundleNodeEntry{Phase: e.Phase, Digest: digest.Digest(e.Digest), Reason: e.Reason, Message: e.Message, Excluded: e.Excluded, Pull: e.Pull.record()}
		entry.Conditions = conditionsOf(e.Conditions)
		v.Nodes[n] = entry
	}
	v.Conditions = conditionsOf(o.Status.Conditions)
	return v
}

// conditionsOf is conditions as ferry reads them.
func conditionsOf(conditions []bundleCondition) []cluster.BundleCondition {
	var out []cluster.BundleCondition
	for _, c := range conditions {
		since, _ := time.Parse(time.RFC3339, c.LastTransitionTime)
		out = append(out, cluster.BundleCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message, Since: since,
			ObservedGeneration: c.ObservedGeneration})
	}
	return out
}

// conditionsIn is conditions as the API holds them.
func conditionsIn(conditions []cluster.BundleCondition) []bundleCondition {
	var out []bundleCondition
	for _, c := range conditions {
		bc := bundleCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message, ObservedGeneration: c.ObservedGeneration}
		if !c.Since.IsZero() {
			bc.LastTransitionTime = c.Since.UTC().Format(time.RFC3339)
		}
		out = append(out, bc)
	}
	return out
}

// entryOf is a node's entry as the API holds it.
func entryOf(e cluster.BundleNodeEntry) bundleNode {
	return bundleNode{Phase: e.Phase, Digest: string(e.Digest), Reason: e.Reason, Message: e.Message, Excluded: e.Excluded, Pull: pullOf(e.Pull),
		Conditions: conditionsIn(e.Conditions)}
}

// PublishBundleStatus writes the summary and node's own entry into the
// UpgradeBundle's status with one merge patch: other nodes' entries stay.
func (c *Client) PublishBundleStatus(ctx context.Context, name string, sum cluster.BundleSummary, node string, entry cluster.BundleNodeEntry) error {
	return c.publishBundle(ctx, name, &sum, node, entry)
}

// PublishBundleEntry writes node's own entry only: the summary is one
// other node's to write.
func (c *Client) PublishBundleEntry(ctx context.Context, name, node string, entry cluster.BundleNodeEntry) error {
	return c.publishBundle(ctx, name, nil, node, entry)
}

func (c *Client) publishBundle(ctx context.Context, name string, sum *cluster.BundleSummary, node string, e cluster.BundleNodeEntry) error {
	entry := entryOf(e)
	// A merge patch keeps what it does not name: a field now empty is
	// sent as null, or a reason from an earlier phase would stay.
	own := map[string]any{"phase": entry.Phase, "digest": entry.Digest, "reason": entry.Reason, "message": entry.Message, "excluded": entry.Excluded, "conditions": entry.Conditions}
	for k, v := range own {
		if v == "" {
			own[k] = nil
		}
	}
	// The pull's record stays once written (a merge patch keeps what it
	// does not name): the others bind the pull to it after the pull too.
	if entry.Pull != nil {
		own["pull"] = entry.Pull
	}
	status := map[string]any{"nodes": map[string]any{node: own}}
	if sum != nil {
		for k, v := range map[string]any{"version": sum.Version, "arch": sum.Arch, "release": sum.Release, "digest": string(sum.Digest),
			"size": sum.Size, "images": sum.Images, "phase": sum.Phase, "nodesReady": sum.NodesReady, "approved": sum.Approved, "warnings": sum.Warnings, "excluded": sum.Excluded,
			"behind": sum.Behind, "conditions": conditionsIn(sum.Conditions), "observedGeneration": sum.ObservedGeneration} {
			status[k] = v
		}
	}
	err := c.do(ctx, "PATCH", bundlesPath+"/"+url.PathEscape(name)+"/status", mergePatch, map[string]any{"status": status}, nil)
	if err != nil {
		return fmt.Errorf("writing upgradebundle %s status: %w", name, err)
	}
	return nil
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
func (c *Client) listBundles(ctx context.Context) ([]upgradeBundle, error) {
	var list struct {
		Items []upgradeBundle `json:"items"`
	}
	err := c.do(ctx, "GET", bundlesPath, "", nil, &list)
	if IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the upgradebundles: %w", err)
	}
	return list.Items, nil
}

func sourcesOf(bundles []upgradeBundle) []cluster.RegistrySource {
	var out []cluster.RegistrySource
	for _, b := range bundles {
		if s := b.Spec.Source; s != nil && s.Release != "" && !b.Spec.Cleanup {
			src := cluster.RegistrySource{Bundle: b.Metadata.Name, Release: s.Release, Extras: s.ExtraImages,
				Node: s.Node, RateLimit: s.RateLimit, Window: s.Window, Created: b.Metadata.CreationTimestamp}
			for n, e := range b.Status.Nodes {
				if r := e.Pull.record(); r != nil {
					if src.Pulled == nil {
						src.Pulled = map[string]cluster.PullRecord{}
					}
					src.Pulled[n] = *r
				}
			}
			out = append(out, src)
		}
	}
	return out
}

func approvedOf(bundles []upgradeBundle) []cluster.Approval {
	var out []cluster.Approval
	for _, b := range bundles {
		if b.Spec.ApprovedDigest != "" {
			out = append(out, cluster.Approval{Bundle: b.Metadata.Name, Digest: b.Spec.ApprovedDigest})
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
	var o upgradeBundle
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
	p := o.view().Policy
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
