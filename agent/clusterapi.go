package agent

import (
	"context"

	"github.com/ferry-edge/ferry/cluster"
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
	StartUpgrade(ctx context.Context, u cluster.Upgrade) error
	// UpgradeStatus is how the cluster's upgrade to release stands.
	UpgradeStatus(ctx context.Context, release string) (cluster.UpgradeStatus, error)
	// NodeAddresses maps the name of every node with a record (its
	// Lease; not a node without ferry, nor a deleted one) to its peer
	// address.
	NodeAddresses(ctx context.Context) (map[string]string, error)
	// MachineCount is how many nodes the machine config operator counts,
	// those without ferry (no record) too; known is false on a cluster
	// without it (no pools).
	MachineCount(ctx context.Context) (n int, known bool, err error)
	// NodeUpdate is how the machine config operator stands with the Node
	// named node.
	NodeUpdate(ctx context.Context, node string) (cluster.NodeUpdate, error)
	// Preflight is what the cluster says of an upgrade to version with
	// these images, before the bundle is spread over the nodes.
	Preflight(ctx context.Context, version string, images []string) (cluster.Preflight, error)
	// BundleAPI is the UpgradeBundle resource (resource.go).
	BundleAPI
	// Changes is closed at the next change the API's watches see in what
	// UpgradeStatus, NodeUpdate (this node's), UpgradeBundle and
	// ApprovedDigests return: the followers read again then, from the
	// client's copy. Nil when the API is not watched: the followers read
	// again every Deps.APIPoll.
	Changes() <-chan struct{}
}
