package machine

import (
	"github.com/ferry-edge/ferry/bundle"
)

// evClusterSources: the releases the cluster's UpgradeBundles ask for
// from the registry, each bound to what its puller published.
type EvClusterSources struct{ Sources []bundle.ReleaseSource }

// clusterSourcesSeen takes the cluster's sources: they approve the
// bundles made of them, so one waiting for approval may go on.
func (m *Machine) clusterSourcesSeen(ev EvClusterSources) []Effect {
	m.clusterSources = ev.Sources
	if r := m.Active; r != nil && r.Approval == bundle.ApprovalNone && r.Phase == PhaseExtracted {
		return m.next()
	}
	return nil
}
