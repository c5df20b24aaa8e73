package cluster

import (
	"slices"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
)

// The UpgradeBundle resource (group ferry.io, packaging/
// upgradebundle-crd.yaml): its spec is the administrator's, its status
// ferry's, each node writing its own entry.

// BundleView is the resource as read: its spec, its summary's
// conditions, and the nodes' entries (from their UpgradeBundleNodes).
type BundleView struct {
	UID string
	// Generation is metadata.generation: it counts the spec's changes,
	// which the summary's conditions echo (observedGeneration).
	Generation int64
	Policy     BundlePolicy
	// Nodes are the nodes' entries, by node: every node's for the
	// summary's writer (it follows them all), else this node's own.
	Nodes map[string]BundleNodeEntry
	// Conditions are the top-level conditions as last written, so that
	// a condition that did not change keeps its transition time.
	Conditions []BundleCondition
}

// BundlePolicy is an UpgradeBundle's spec: the administrator's word.
type BundlePolicy struct {
	ApprovedDigest  string
	Schedule        string // Automatic | Manual | "" (the node's config)
	Proceed         bool
	ExcludedNodes   []string
	NotReadyTimeout time.Duration // 0: never
	Cleanup         bool          // take the bundle out, as ferry cleanup does
	// KeepPools (spec.pausePools false): a path across minor versions
	// leaves the machine config pools as they are; by default ferry
	// pauses the non-master ones for the path.
	KeepPools bool
}

// Equal reports whether p and q say the same, field for field (the agent's
// state machine compares them without reflect).
func (p BundlePolicy) Equal(q BundlePolicy) bool {
	return p.ApprovedDigest == q.ApprovedDigest && p.Schedule == q.Schedule && p.Proceed == q.Proceed &&
		slices.Equal(p.ExcludedNodes, q.ExcludedNodes) && p.NotReadyTimeout == q.NotReadyTimeout &&
		p.Cleanup == q.Cleanup && p.KeepPools == q.KeepPools
}

// BundleNodeEntry is one node's entry for the resource, in that node's
// UpgradeBundleNode.
type BundleNodeEntry struct {
	Phase  string
	Digest digest.Digest
	// Reason is the node's machine reason (agent's Status.Reason), a
	// CamelCase word; Message says it to a person.
	Reason, Message, Excluded string
	Conditions                []BundleCondition
	// Pull is what the node that pulls a release from the registry
	// publishes of it (registry mode); nil on the others. Written only
	// with that node's credential, it is what the others bind its pull
	// to: they take no other bundle of it, and no other tag.
	Pull *PullRecord
}

// PullRecord is the pulling node's word on its pull, in its own entry.
type PullRecord struct {
	Release string        // the release pulled, by digest
	Digest  digest.Digest // the bundle made; "" until made
	// Extras are the digests the extra images given by tag resolved to,
	// by the extra as spec.source names it (at most MaxPullExtras).
	Extras map[string]digest.Digest
}

// MaxPullExtras bounds a PullRecord's extras, as the CRD does
// spec.source.extraImages.
const MaxPullExtras = 256

// BundleCondition is one of a node's conditions (Extracted, Loaded,
// Updated) or of the resource's own (BundleSummary.Conditions).
type BundleCondition struct {
	Type, Status, Reason, Message string
	Since                         time.Time // the last transition; zero when unknown
	// ObservedGeneration is the spec's generation the condition was
	// decided from (the resource's own conditions only).
	ObservedGeneration int64
}

// BundleSummary is the resource's status: the bundle and the cluster's
// view of it, written by one node (the summary's writer).
type BundleSummary struct {
	Version, Arch, Release      string
	Digest                      digest.Digest
	Size                        string
	Images                      int
	Phase, NodesReady, Approved string
	Warnings                    []string
	Excluded                    []string // "node: why", sorted
	// Behind names the nodes the gate waits for that are not loaded yet
	// ("worker-2, worker-3"), for oc get -o wide.
	Behind string
	// Conditions are the resource's own (Approved, Loaded, Upgrading,
	// Upgraded, Degraded), for oc wait; ObservedGeneration the spec's
	// generation they were decided from.
	Conditions         []BundleCondition
	ObservedGeneration int64
	// Path, for a bundle of several releases, is its versions from the
	// cluster's ("4.16.3 → 4.17.20 → 4.18.10"); Hop the hop in progress
	// of how many ("1/2"); Hops each hop's state.
	Path, Hop string
	Hops      []PathHop
}

// PathHop is one hop of a bundle's path as the summary says it.
type PathHop struct {
	Version, Release string
	State            string // a HopState
	Message          string // why it is held or failed
}

// Approval is one UpgradeBundle's spec.approvedDigest: it approves only
// the bundle that resource is named for (agent.ResourceName).
type Approval struct {
	Bundle string // the resource's name
	Digest string // as the administrator wrote it
}

// RegistrySource is an UpgradeBundle's spec.source (registry mode): a
// release by digest and extra images, pulled once from the site's
// registry by one node.
type RegistrySource struct {
	Bundle    string // the resource's name
	Release   string // by digest
	Extras    []string
	Node      string // the node that pulls; "" the first Ready node by name
	RateLimit string // bytes per second over the link ("2MiB")
	Window    string // local time, "22:00-06:00"
	// Created is the resource's creation time: the bundle's
	// metadata.created on every node that makes it.
	Created time.Time
}
