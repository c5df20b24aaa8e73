// Package cluster is the cluster's Kubernetes API as ferry's code sees it:
// the upgrade it asks for and how it stands, the machine config
// operator's state of a node, the preflight's word, each Node's
// readiness, and the UpgradeBundle resource (bundle.go). kube reads and
// writes these on the API server, agent acts on them; the wire format
// (JSON, RFC3339 times, merge patches) is kube's and none of it is here.
// Times are time.Time, durations time.Duration.
package cluster

import "time"

// Upgrade is the update ferry asks the cluster version operator for.
type Upgrade struct {
	Release    string // digest reference of the release image (name@sha256:<hex>)
	Version    string
	Signatures [][]byte
	Force      bool
}

// Path is an upgrade through several releases, one hop after another
// (a bundle's path): each hop an Upgrade, the last the bundle's release.
type Path struct {
	Hops []Upgrade
	// Bundle is the UpgradeBundle whose spec says whether to pause the
	// pools (spec.pausePools) and on which the hops are marked by Events.
	Bundle string
	Node   string // the node that acts (the Events' source)
}

// UpgradeState is where the cluster's upgrade to one release stands.
type UpgradeState string

const (
	UpgradeNotAsked  UpgradeState = ""          // desiredUpdate names another release (or none)
	UpgradePending   UpgradeState = "pending"   // asked, not started yet
	UpgradeRunning   UpgradeState = "upgrading" // history[0] is this release, Partial
	UpgradeCompleted UpgradeState = "upgraded"  // a history entry for this release is Completed
	UpgradeRefused   UpgradeState = "refused"   // the operator will not (ReleaseAccepted=False, or Failing while asked)
)

// UpgradeStatus is how the cluster's upgrade to one release stands, in the
// cluster version operator's own words.
type UpgradeStatus struct {
	State UpgradeState
	// Message is the Progressing condition's message.
	Message string
	// Reason is why it waits or refuses (Failing, ReleaseAccepted=False,
	// Upgradeable=False messages).
	Reason string
}

// NodeUpdate is the machine config operator's state of one node, from
// its Node's machineconfiguration.openshift.io annotations (written by
// the machine config daemon) and the MachineConfigPool it belongs to.
type NodeUpdate struct {
	// Managed: the Node carries the MCO's annotations; false on a cluster
	// without a machine config operator.
	Managed bool
	State   string // Done, Working, Degraded, …
	Current string // rendered MachineConfig the node runs (currentConfig)
	Desired string // rendered MachineConfig the MCO sent it to (desiredConfig)
	Reason  string // the daemon's reason (when Degraded)
	// Pool is the MachineConfigPool whose nodeSelector matches the Node
	// ("" when none does); Paused is its spec.paused; Target its
	// spec.configuration.name, the rendered config its nodes go to.
	Pool   string
	Paused bool
	Target string
}

// Preflight is what the cluster says of an upgrade to one bundle before
// anything is spread over the nodes: Refusals stop it (the version
// operator would refuse it too, hours later), Warnings are shown and do
// not block. Details name what the warnings count (a tenant's pods): they
// stay on the node, out of anything cluster-scoped.
type Preflight struct {
	Current  string // the cluster's version now ("" when unknown)
	Refusals []string
	Warnings []string
	Details  []string
}

// NodeReady is a Node's Ready condition and since when it holds (a Node
// without one is not ready, since its creation).
type NodeReady struct {
	Ready bool
	Since time.Time
	// Reports is the UpgradeBundle the node reports on now (its record
	// says so once it wrote its entry there): the summary's writer is one
	// of those that report on it.
	Reports string
}
