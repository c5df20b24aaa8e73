package machine

import "github.com/ferry-edge/ferry/cluster"

// Cleanup while ClusterVersion asks for the bundle's release (issue 45,
// item 2): once spec.desiredUpdate names it, the version operator pulls
// its images through this node's mirror, whenever it starts; taking the
// bundle out then would leave the cluster asking for a release no node
// serves. ferry refuses and says the way out (oc adm upgrade --clear,
// the administrator's: ferry's admission policy lets it set desiredUpdate,
// never remove it); spec.cleanup goes on by itself once it is cleared.

// desiredRead is the newest reading of ClusterVersion for a release.
type desiredRead struct {
	release string
	// names: spec.desiredUpdate names the release (pending, refused by
	// the operator, or running).
	names bool
}

// upgradeRead takes a reading of ClusterVersion: it is kept for the
// cleanup's guard, a standing spec.cleanup is weighed again, and the
// upgrade is followed (upgradeSeen).
func (m *Machine) upgradeRead(ev EvUpgradeSeen) []Effect {
	r := m.Active
	if r == nil || r.Metadata == nil || r.Metadata.Release != ev.Release {
		return m.upgradeSeen(ev)
	}
	st := ev.St.State
	names := st == cluster.UpgradePending || st == cluster.UpgradeRefused || st == cluster.UpgradeRunning
	m.desired = desiredRead{release: ev.Release, names: names}
	if names {
		m.askedUnseen = false
	}
	if st == cluster.UpgradeRunning || st == cluster.UpgradeCompleted || !m.cleanupWanted(r) {
		return m.upgradeSeen(ev)
	}
	return m.cleanupAskedByCluster(r)
}

// cleanupWanted tells whether the active bundle's UpgradeBundle asks for
// its cleanup (spec.cleanup).
func (m *Machine) cleanupWanted(r *Record) bool {
	return r == m.Active && m.bundlePolicy != nil && m.bundlePolicy.Cleanup && m.bundleName == m.activeResource()
}

// cleanupHeld is why r must not be taken out now ("" when it may): with
// the API, ClusterVersion asks for its release, or ferry asked and has
// not read it back yet, or at cluster-ready it has not been read yet.
func (m *Machine) cleanupHeld(r *Record) string {
	if !m.HasAPI || r.Metadata == nil || r.Phase != PhaseLoaded && r.Phase != PhaseClusterReady {
		return ""
	}
	read := m.desired.release == r.Metadata.Release
	switch {
	case m.asking || m.askedUnseen || read && m.desired.names:
		return "not cleaning up: ClusterVersion's spec.desiredUpdate asks for this bundle's release (" + r.Metadata.Release +
			"), whose images the version operator pulls through this node: taking them out would leave the cluster asking for a release no node serves; run 'oc adm upgrade --clear' first (while the upgrade has not started), then the cleanup goes on by itself (spec.cleanup) or with 'ferry cleanup'"
	case !read && r.Phase == PhaseClusterReady:
		return "not cleaning up yet: reading ClusterVersion first, to be sure it does not ask for this bundle's release (spec.cleanup goes on by itself then; try 'ferry cleanup' again in a few seconds)"
	}
	return ""
}
