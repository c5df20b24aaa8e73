package agent

import (
	"context"
)

// ClusterAPI is the cluster's Kubernetes API as the agent needs it: the
// kube package implements it, an in-memory twin stands in for it in unit
// tests. No Kubernetes type crosses this seam.
type ClusterAPI interface {
	// Annotate sets annotations and labels on the Node named node; an
	// empty value removes the key.
	Annotate(ctx context.Context, node string, annotations, labels map[string]string) error
	// StartUpgrade publishes the release's signatures and asks the cluster
	// version operator for the update. Doing it again is harmless.
	StartUpgrade(ctx context.Context, u Upgrade) error
	// UpgradeStatus is how the cluster's upgrade to release stands.
	UpgradeStatus(ctx context.Context, release string) (UpgradeStatus, error)
	// NodeAddresses maps every Node's name to its InternalIP.
	NodeAddresses(ctx context.Context) (map[string]string, error)
	// NodeUpdate is how the machine config operator stands with the Node
	// named node.
	NodeUpdate(ctx context.Context, node string) (NodeUpdate, error)
	// Preflight is what the cluster says of an upgrade to version with
	// these images, before the bundle is spread over the nodes.
	Preflight(ctx context.Context, version string, images []string) (Preflight, error)
	// BundleAPI is the UpgradeBundle resource (resource.go).
	BundleAPI
	// Changes is closed at the next change the API's watches see in what
	// UpgradeStatus, NodeUpdate (this node's), UpgradeBundle and
	// ApprovedDigests return: the followers read again then, from the
	// client's copy. Nil when the API is not watched: the followers read
	// again every Deps.APIPoll.
	Changes() <-chan struct{}
}

// Preflight is the cluster's word on a bundle before it is shared:
// Refusals stop it (the version operator would refuse it too), Warnings
// are shown.
type Preflight struct {
	Current  string // the cluster's version now
	Refusals []string
	Warnings []string
}

// NodeUpdate is the machine config operator's state of one node, from
// its Node's machineconfiguration.openshift.io annotations (written by
// the machine config daemon) and the MachineConfigPool it belongs to.
type NodeUpdate struct {
	// Managed: the Node carries the MCO's annotations; false on a cluster
	// without a machine config operator.
	Managed bool
	State   string // Done, Working, Degraded, …
	Current string // rendered MachineConfig the node runs
	Desired string // rendered MachineConfig the MCO sent it to
	Reason  string // the daemon's reason (when Degraded)
	// Pool is the MachineConfigPool whose nodeSelector matches the Node
	// ("" when none does); Paused is its spec.paused; Target its
	// spec.configuration.name, the rendered config its nodes go to.
	Pool   string
	Paused bool
	Target string
}

// Upgrade is what the cluster is asked to do.
type Upgrade struct {
	Release    string // digest reference of the release image
	Version    string
	Signatures [][]byte
	Force      bool
}

// UpgradeState is where the cluster's upgrade to one release stands.
type UpgradeState string

const (
	UpgradeNotAsked  UpgradeState = ""          // desiredUpdate names another release (or none)
	UpgradePending   UpgradeState = "pending"   // asked, not started yet
	UpgradeRunning   UpgradeState = "upgrading" // history[0] is this release, Partial
	UpgradeCompleted UpgradeState = "upgraded"  // a history entry for this release is Completed
	UpgradeRefused   UpgradeState = "refused"   // the operator will not (not accepted, failing)
)

// UpgradeStatus is the operator's own words on one release.
type UpgradeStatus struct {
	State UpgradeState
	// Message is the Progressing condition's message.
	Message string
	// Reason is why it waits or refuses (Failing, ReleaseAccepted=False,
	// Upgradeable=False messages).
	Reason string
}
