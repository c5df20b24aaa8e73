package agent

import (
	"errors"
	"fmt"
	"time"
)

// retireRetry is the wait before a failed cleanup after an upgrade is
// tried again.
const retireRetry = 30 * time.Second

// retiring is the reason an upgraded bundle shows until its cleanup is
// done.
const retiring = "cleaning up: removing the bundle's files, registry and mirror (its images stay pinned)"

// Transitions of the cluster upgrade (called from step): asking for it,
// following it, and cleaning up when it is done.

// proceed is what the gate (or ferry proceed, asked=true) does once every
// node is loaded: ask the cluster for the upgrade through its API, then run
// the on_ready hook; a hook that failed runs again on ferry proceed.
func (m *machine) proceed(r *Record, asked bool) []effect {
	if m.hasAPI && !m.asking && (r.Upgrade == nil || asked && r.Upgrade.Accepted.IsZero()) {
		m.asking = true
		r.Upgrade = &UpgradeRun{Requested: m.now().UTC()}
		m.log.Info("asking the cluster to upgrade", "phase", string(r.Phase), "bundle", r.Name, "release", r.Metadata.Release)
		return []effect{effSave{r}, effAskUpgrade{r}}
	}
	if m.hasAPI && (r.Upgrade == nil || r.Upgrade.Accepted.IsZero()) {
		return nil // the hook runs once the cluster has accepted
	}
	if len(m.cfg.Cluster.OnReady) == 0 || r.Hook != nil && (r.Hook.Error == "" || !asked) {
		return nil
	}
	r.Hook = nil
	effs, _ := m.startHook(r)
	return effs
}

// nothingToProceed says why ferry proceed has nothing to do.
func (m *machine) nothingToProceed(r *Record) error {
	switch {
	case m.asking:
		return errors.New("the cluster is being asked for the upgrade already (see 'ferry status')")
	case r.Upgrade != nil && !r.Upgrade.Accepted.IsZero() && len(m.cfg.Cluster.OnReady) == 0:
		return errors.New("the cluster accepted the upgrade already: follow it with 'ferry status' or 'oc get clusterversion'")
	case r.Hook != nil && r.Hook.Finished.IsZero():
		return errors.New("the on_ready hook is running")
	case r.Hook != nil:
		return errors.New("the on_ready hook already ran and succeeded")
	}
	return errors.New("nothing to do: no kubeconfig and no on_ready hook are configured; start the upgrade by hand (oc adm upgrade)")
}

func (m *machine) upgradeAsked(ev evUpgradeAsked) []effect {
	r := m.records[ev.id]
	if r == nil || r.Upgrade == nil {
		return nil
	}
	if ev.err != nil {
		why := fmt.Sprintf("asking the cluster for the upgrade failed, retrying: %v", ev.err)
		if r.Upgrade.Error == why {
			return nil
		}
		m.log.Warn("asking the cluster for the upgrade failed, retrying", "bundle", r.Name, "err", ev.err)
		r.Upgrade.Error = why
		return m.move(r, r.Phase, why, r.Progress)
	}
	m.asking = false
	r.Upgrade.Accepted, r.Upgrade.Error = m.now().UTC(), ""
	m.log.Info("the cluster accepted the upgrade request", "phase", string(r.Phase), "bundle", r.Name, "release", r.Metadata.Release)
	effs := m.move(r, r.Phase, "", r.Progress)
	return append(effs, m.proceed(r, false)...)
}

// upgradeSeen follows the cluster version operator on the active bundle's
// release: upgrading, upgraded, or refused with the operator's words.
func (m *machine) upgradeSeen(ev evUpgradeSeen) []effect {
	r := m.active
	if r == nil || r.Metadata == nil || r.Metadata.Release != ev.release || !r.Phase.Loaded() {
		return nil
	}
	st := ev.st
	switch st.State {
	case UpgradeCompleted:
		m.log.Info("the cluster upgrade is done", "phase", string(PhaseUpgraded), "bundle", r.Name, "message", st.Message)
		r.Message = st.Message
		return m.upgraded(r)
	case UpgradeRunning:
		if r.Phase == PhaseUpgrading && r.Message == st.Message && r.Reason == st.Reason {
			return nil
		}
		if r.Phase != PhaseUpgrading {
			m.log.Info("the cluster is upgrading", "phase", string(PhaseUpgrading), "bundle", r.Name, "message", st.Message)
		}
		r.Message = st.Message
		return m.move(r, PhaseUpgrading, st.Reason, r.Progress)
	case UpgradeRefused:
		why := "the cluster refuses the release: " + st.Reason
		if r.Reason == why {
			return nil
		}
		m.log.Error("the cluster refuses the release", "phase", string(r.Phase), "bundle", r.Name, "reason", st.Reason)
		r.Message = st.Message
		return m.move(r, r.Phase, why, r.Progress)
	case UpgradePending:
		why := "waiting for the cluster version operator to start"
		if st.Reason != "" {
			why += ": " + st.Reason
		}
		if r.Reason == why {
			return nil
		}
		return m.move(r, r.Phase, why, r.Progress)
	}
	return nil
}

// upgraded marks r done and starts its cleanup: files, registry and
// mirror go, its pins stay; the previous bundle's pins go.
func (m *machine) upgraded(r *Record) []effect {
	effs := m.move(r, PhaseUpgraded, retiring, r.Progress)
	m.lastBad = nil
	return append(effs, m.retire(r)...)
}

func (m *machine) retire(r *Record) []effect {
	if m.job != nil || r.Retired {
		return nil
	}
	prev := m.previous
	if prev == r || prev != nil && prev.Unpinned {
		prev = nil
	}
	return m.startJob(effStartJob{kind: jobRetire, rec: r, unload: m.hasLoader, previous: prev}, "")
}

func (m *machine) retireDone(r *Record, j evJobDone) []effect {
	reply := m.cleanupReply
	m.cleanupAsked, m.cleanupReply = false, nil
	var effs []effect
	if j.err != nil {
		why := fmt.Sprintf("cleaning up after the upgrade failed, retrying in 30s: %v", j.err)
		m.log.Error("cleaning up after the upgrade failed", "phase", string(PhaseUpgraded), "bundle", r.Name, "err", j.err)
		effs = append(m.move(r, PhaseUpgraded, why, r.Progress), effRetryIn{after: retireRetry})
		if reply != nil {
			effs = append(effs, effReply{reply, fmt.Errorf("cleanup of %s: %w", r.Name, j.err)})
		}
		return effs
	}
	if p := m.previous; p != nil && p != r {
		p.Unpinned = true
		effs = append(effs, effSave{p})
	}
	r.Retired = true
	effs = append(effs, m.move(r, PhaseUpgraded, "", r.Progress)...)
	m.previous, m.done, m.active = r, r, nil
	m.log.Info("upgrade done: the bundle's files, registry and mirror are gone; its images stay pinned until the next upgrade",
		"phase", string(PhaseUpgraded), "bundle", r.Name, "digest", r.Digest)
	if reply != nil {
		effs = append(effs, effReply{reply, nil})
	}
	return effs
}
