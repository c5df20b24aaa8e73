package machine

import "github.com/ferry-edge/ferry/bundle/meta"

// SourcesRead: the releases the cluster's UpgradeBundles ask for
// from the registry, each bound to what its puller published.
type SourcesRead struct{ Sources []meta.ReleaseSource }

// clusterSourcesSeen takes the cluster's sources: they approve the
// bundles made of them, so one waiting for approval may go on.
func (m *Machine) clusterSourcesSeen(ev SourcesRead) []Effect {
	m.clusterSources = ev.Sources
	if r := m.Active; r != nil && r.Approval == meta.ApprovalNone && r.Phase == PhaseExtracted {
		return m.next()
	}
	return nil
}

// clusterRead takes one reading of the UpgradeBundles, part by part in
// the order the follower reads them.
func (m *Machine) clusterRead(ev EvCluster) []Effect {
	var effs []Effect
	if ev.Approvals != nil {
		effs = append(effs, m.clusterApprovalsSeen(*ev.Approvals)...)
	}
	if ev.Sources != nil {
		effs = append(effs, m.clusterSourcesSeen(*ev.Sources)...)
	}
	if ev.Policy != nil {
		effs = append(effs, m.bundlePolicySeen(*ev.Policy)...)
	}
	return effs
}
