package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Every string, list and map below is bounded (maxLength, maxItems,
// maxProperties): a node's credential cannot grow the resource beyond
// what ferry itself writes (agent.MaxReason for a reason or a message),
// and the admission policies' CEL (packaging/admission.yaml) is costed
// from these bounds.

// UpgradeBundle is an upgrade bundle that ferry spreads over the
// cluster's nodes, loads into CRI-O and upgrades the cluster to. There is
// one per bundle, named <version>-<arch> as ferry spells it (4.16.3-x86-64):
// spec is the administrator's (approving, scheduling, excluding nodes,
// cleaning up), status is ferry's summary, written by one node; each
// node's own view is in its UpgradeBundleNode.
//
// ferry reads a bundle's policy from the resource named as it spells it
// (agent.ResourceName) and from no other: a name it would never read is
// refused, saying the right spelling, rather than approving nothing in
// silence.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=ub
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.status.version`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Nodes Ready",type=string,JSONPath=`.status.nodesReady`
// +kubebuilder:printcolumn:name="Approved",type=string,JSONPath=`.status.approved`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Digest",type=string,JSONPath=`.status.digest`,priority=1
// +kubebuilder:printcolumn:name="Release",type=string,JSONPath=`.status.release`,priority=1
// +kubebuilder:printcolumn:name="Behind",type=string,JSONPath=`.status.behind`,priority=1,description="The nodes the gate waits for that are not loaded yet."
// +kubebuilder:validation:XValidation:rule=`self.metadata.name.matches('^[0-9a-z][0-9a-z.-]{0,63}-(x86-64|aarch64|ppc64le|s390x)$')`,messageExpression=`'UpgradeBundle ' + self.metadata.name + ' is not named <version>-<arch> as ferry spells it (4.16.3-x86-64, 4.16.3-aarch64, ppc64le, s390x), and ferry would never read it' + (self.metadata.name.contains('amd64') || self.metadata.name.contains('arm64') ? ': name it ' + self.metadata.name.replace('amd64', 'x86-64').replace('arm64', 'aarch64') : "")`
type UpgradeBundle struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   UpgradeBundleSpec   `json:"spec,omitempty"`
	Status UpgradeBundleStatus `json:"status,omitempty"`
}

// UpgradeBundleList is a list of UpgradeBundles.
//
// +kubebuilder:object:root=true
type UpgradeBundleList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []UpgradeBundle `json:"items"`
}

// UpgradeBundleSpec is the administrator's policy for this bundle. ferry
// never writes it.
type UpgradeBundleSpec struct {
	// approvedDigest is the bundle's sha256 digest (sha256:<64 hex>) an
	// engineer approved; only a bundle with this digest is loaded and
	// upgraded to. Approve the digest the engineer gives you, never one
	// read from status (docs/admin.md, "Approval").
	// +kubebuilder:validation:Pattern=`^sha256:[a-f0-9]{64}$`
	// +kubebuilder:validation:MaxLength=71
	// +optional
	ApprovedDigest string `json:"approvedDigest,omitempty"`

	// schedule: Automatic starts the cluster upgrade once every node is
	// loaded; Manual waits for proceed. Empty, each node's own config
	// decides.
	// +kubebuilder:validation:Enum=Automatic;Manual
	// +kubebuilder:validation:MaxLength=16
	// +optional
	Schedule string `json:"schedule,omitempty"`

	// proceed, with schedule Manual, starts the cluster upgrade (once
	// every node is loaded).
	// +optional
	Proceed bool `json:"proceed,omitempty"`

	// excludedNodes are nodes the gate does not wait for (down for good,
	// or held back on purpose); they fetch and load when they come back.
	// +listType=set
	// +kubebuilder:validation:MaxItems=2000
	// +kubebuilder:validation:items:MaxLength=253
	// +optional
	ExcludedNodes []string `json:"excludedNodes,omitempty"`

	// notReadyTimeout: a node NotReady for longer than this (a Go
	// duration, e.g. 30m) is left out of the gate; empty never leaves one
	// out.
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:MaxLength=32
	// +optional
	NotReadyTimeout string `json:"notReadyTimeout,omitempty"`

	// pausePools, absent or true, pauses the non-master machine config
	// pools for the whole of a path that crosses minor versions (an
	// EUS-to-EUS update, 4.y to 4.y+2; 4.last to 5.0), as the update docs'
	// EUS-to-EUS procedure does, so that the workers reboot once, at the
	// end; ferry unpauses the pools it paused once the last hop is
	// Completed. false leaves the pools as they are (the workers follow
	// each hop). Pools already paused are left as they are. No default:
	// absent means pause.
	// +optional
	PausePools *bool `json:"pausePools,omitempty"`

	// cleanup: every node takes this bundle out, as 'ferry cleanup' does
	// on a node, by the phase it is in there. detected, fetching: the copy
	// or fetch stops and its partial files go. extracted (waiting for
	// approval or for the peers), loading, loaded, cluster-ready, a bundle
	// the cluster never upgraded to: it is unloaded, its own pins, its
	// registries.conf.d mirror, its registry CA and its extracted tree go,
	// and the pins of the release the cluster runs stay. upgrading:
	// refused, the upgrade pulls its images; ferry takes it out by itself
	// once done. upgraded, waiting for the machine config operator: the
	// node stops waiting, its mirror and registry go, and its pins and
	// extracted tree stay as the running release's (until the next upgrade
	// is done; retention.keep_running_release). Phase cleaned on each node
	// once done. Remove it to load the bundle again.
	// +optional
	Cleanup bool `json:"cleanup,omitempty"`

	// source, in registry mode, has the release pulled from the site's
	// registry instead of brought on a stick.
	// +optional
	Source *BundleSource `json:"source,omitempty"`
}

// BundleSource is registry mode: pull the release from the site's
// registry instead of bringing it on a stick. One node (node, or the
// first Ready node by name) copies the release and the extra images once,
// through its registries.conf mirrors and pull secret, within rateLimit
// and window, into a bundle it verifies and shares with the other nodes
// as a stick's; every node loads and pins it; the upgrade then goes as
// for a bundle (schedule, proceed). The bundle is approved by this
// source: by what it holds (the release named here and the images it
// names, the extra images here), not by a digest. Name the resource
// <version>-<arch> (e.g. 4.13.8-x86-64) so that the nodes report here.
type BundleSource struct {
	// release is the release image by digest (NAME@sha256:<64 hex>), as
	// oc adm release info prints it.
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:Pattern=`^[^@\s]+@sha256:[a-f0-9]{64}$`
	Release string `json:"release"`

	// extraImages are custom images to pull too, by tag or digest.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=512
	// +optional
	ExtraImages []string `json:"extraImages,omitempty"`

	// node is the node that pulls; empty, the first Ready node by name.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Node string `json:"node,omitempty"`

	// rateLimit is the most bytes per second taken from the link (2MiB,
	// 20M); empty, the node's pull.rate_limit.
	// +kubebuilder:validation:MaxLength=32
	// +optional
	RateLimit string `json:"rateLimit,omitempty"`

	// window is when the link may be used, in the nodes' local time
	// (22:00-06:00); empty, the node's pull.window.
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^$|^[0-9]{1,2}:[0-9]{2}-[0-9]{1,2}:[0-9]{2}$`
	// +optional
	Window string `json:"window,omitempty"`
}

// UpgradeBundleStatus is ferry's view of the bundle: a summary of every
// node's entry (their UpgradeBundleNodes), written by one node alone (the
// first Ready one by name of the nodes that report this bundle), and only
// when it changes: its size does not grow with the cluster's, and a
// node's progress never rewrites it. It is what one node says: approve
// from the engineer's digest, never from it.
type UpgradeBundleStatus struct {
	// version is the bundle's OpenShift version.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Version string `json:"version,omitempty"`

	// arch is the bundle's architecture, as the release names it (x86_64).
	// +kubebuilder:validation:MaxLength=16
	// +optional
	Arch string `json:"arch,omitempty"`

	// release is the release image the bundle holds, by digest.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Release string `json:"release,omitempty"`

	// digest is the bundle's digest as the nodes read it, empty when their
	// entries disagree. Never approve from it, nor from anything else a
	// node writes; approve the digest the engineer gives you (docs/admin.md,
	// "Approval").
	// +kubebuilder:validation:Pattern=`^(sha256:[a-f0-9]{64})?$`
	// +kubebuilder:validation:MaxLength=71
	// +optional
	Digest string `json:"digest,omitempty"`

	// size is the bundle's size, for people (14.2 GiB).
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Size string `json:"size,omitempty"`

	// images is how many images the bundle holds.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	Images int `json:"images,omitempty"`

	// phase is the cluster's phase of this bundle, the least advanced
	// node's (excluded nodes aside).
	// +kubebuilder:validation:MaxLength=32
	// +optional
	Phase string `json:"phase,omitempty"`

	// nodesReady is the nodes loaded (or further) of the nodes the gate
	// waits for, e.g. 2/3.
	// +kubebuilder:validation:MaxLength=16
	// +optional
	NodesReady string `json:"nodesReady,omitempty"`

	// approved is how the bundle is approved (digest, signature, peer,
	// source, off), "waiting for approval", "approves another digest" when
	// spec.approvedDigest names another bundle, "rejected" when a node
	// refused it, or "digests disagree" when the nodes' entries name
	// different digests.
	// +kubebuilder:validation:Enum="";digest;signature;peer;source;"off";"waiting for approval";"approves another digest";rejected;"digests disagree"
	// +kubebuilder:validation:MaxLength=32
	// +optional
	Approved string `json:"approved,omitempty"`

	// warnings are the cluster's preflight warnings.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=1024
	// +optional
	Warnings []string `json:"warnings,omitempty"`

	// behind names the nodes the gate waits for that are not loaded (or
	// further) yet.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Behind string `json:"behind,omitempty"`

	// observedGeneration is the spec's generation (metadata.generation)
	// the summary and its conditions were decided from; behind
	// metadata.generation, the nodes have not read the newest spec yet.
	// +kubebuilder:validation:Minimum=0
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions are the resource's own, for oc wait --for=condition=TYPE:
	// Approved (the bundle may load), Loaded (every node the gate waits for
	// holds it loaded), Upgrading (the cluster version operator upgrades to
	// its release), Upgraded (the final state), Degraded (a person must
	// act: a refusal, a failure, a conflict). Each carries the spec's
	// generation it was decided from (observedGeneration). Written by one
	// node, the summary's writer.
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:XValidation:rule="self.all(c, c.type in ['Approved', 'Loaded', 'Upgrading', 'Upgraded', 'Degraded'])",message="a condition's type is Approved, Loaded, Upgrading, Upgraded or Degraded"
	// +kubebuilder:validation:XValidation:rule="self.all(c, size(c.reason) <= 64 && size(c.message) <= 1024)",message="a condition's reason is at most 64 characters, its message at most 1024"
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// excluded are the nodes the gate leaves out, and why
	// (spec.excludedNodes, or NotReady past spec.notReadyTimeout).
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=1024
	// +optional
	Excluded []string `json:"excluded,omitempty"`
}

// NodeStatus is one node's view of one bundle, written by that node in
// its UpgradeBundleNode.
type NodeStatus struct {
	// phase is the bundle's phase on this node (fetching, extracted,
	// loading, loaded, cluster-ready, upgrading, upgraded, ...).
	// +kubebuilder:validation:MaxLength=32
	// +optional
	Phase string `json:"phase,omitempty"`

	// digest is the bundle's digest as this node read it.
	// +kubebuilder:validation:Pattern=`^(sha256:[a-f0-9]{64})?$`
	// +kubebuilder:validation:MaxLength=71
	// +optional
	Digest string `json:"digest,omitempty"`

	// reason is why the node is where it is, for machines (CamelCase, e.g.
	// AwaitingApproval).
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^([A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?)?$`
	// +optional
	Reason string `json:"reason,omitempty"`

	// message is the reason in words, with what to do.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Message string `json:"message,omitempty"`

	// excluded says why the gate does not wait for this node, if it does
	// not.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Excluded string `json:"excluded,omitempty"`

	// conditions are this node's: Extracted, Loaded, Updated (the cluster
	// upgraded to the bundle's release with this node).
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=3
	// +kubebuilder:validation:XValidation:rule="self.all(c, c.type in ['Extracted', 'Loaded', 'Updated'])",message="a node's condition type is Extracted, Loaded or Updated"
	// +kubebuilder:validation:XValidation:rule="self.all(c, size(c.reason) <= 64 && size(c.message) <= 1024)",message="a condition's reason is at most 64 characters, its message at most 1024"
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// pull is, in registry mode, in the pulling node's own entry only (only
	// its credential writes it): the bundle it made of spec.source and the
	// digest each extra image given by tag resolved to. The other nodes
	// take no other bundle of that source, and pin those tags to these
	// digests.
	// +optional
	Pull *PullStatus `json:"pull,omitempty"`
}

// PullStatus is the pulling node's record of its pull (registry mode).
type PullStatus struct {
	// release is the release pulled, by digest.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Release string `json:"release,omitempty"`

	// digest is the bundle the pull made; empty until made.
	// +kubebuilder:validation:Pattern=`^(sha256:[a-f0-9]{64})?$`
	// +kubebuilder:validation:MaxLength=71
	// +optional
	Digest string `json:"digest,omitempty"`

	// extras are the extra images given by tag, each with the digest it
	// resolved to.
	// +listType=map
	// +listMapKey=image
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Extras []PulledImage `json:"extras,omitempty"`
}

// PulledImage is an extra image given by tag and the digest it resolved
// to.
type PulledImage struct {
	// image is the extra image as spec.source.extraImages names it.
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image"`

	// digest is the digest the image resolved to.
	// +kubebuilder:validation:Pattern=`^sha256:[a-f0-9]{64}$`
	// +kubebuilder:validation:MaxLength=71
	Digest string `json:"digest"`
}
