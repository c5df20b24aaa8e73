package machine

import (
	"cmp"
	"errors"
	"time"

	"github.com/ferry-edge/ferry/cluster"
)

// retireRetry is the wait before a failed cleanup after an upgrade is
// tried again.
const retireRetry = 30 * time.Second

// retiring is the condition an upgraded bundle shows until its cleanup
// is done.
var retiring = Underway(ReasonCleaningUp, "cleaning up: removing the bundle's files, registry and mirror (its images stay pinned)")

// Transitions of the cluster upgrade (called from step): asking for it,
// following it, and cleaning up when it is done.

// proceed is what the gate (or ferry proceed, asked=true) does once every
// node is loaded: ask the cluster for the upgrade through its API, then run
// the on_ready hook; a hook that failed runs again on ferry proceed.
func (m *Machine) proceed(r *Record, asked bool) []Effect {
	if m.cleanupAsked || m.cleanupWanted(r) {
		return nil // the bundle is being taken out: never ask for its release
	}
	if r.Upgrade == nil && m.nodesWithoutFerry() != (Condition{}) {
		return nil // nodes without ferry: the gate says so
	}
	if asked && m.HasAPI && !m.asking && pathStopped(r) {
		return m.resumePath(r)
	}
	if m.HasAPI && !m.asking && (r.Upgrade == nil || asked && r.Upgrade.Accepted.IsZero()) {
		m.asking = true
		r.Upgrade = &UpgradeRun{Requested: m.Now().UTC()}
		m.log.Info("asking the cluster to upgrade", "phase", string(r.Phase), "bundle", r.Name, "release", r.Metadata.Release)
		return []Effect{EffSave{r}, EffAskUpgrade{r}}
	}
	if m.HasAPI && (r.Upgrade == nil || r.Upgrade.Accepted.IsZero()) {
		return nil // the hook runs once the cluster has accepted
	}
	if len(m.cfg.OnReady) == 0 || r.Hook != nil && (r.Hook.Error == "" || !asked) {
		return nil
	}
	r.Hook = nil
	effs, _ := m.startHook(r)
	return effs
}

// nothingToProceed says why ferry proceed has nothing to do.
func (m *Machine) nothingToProceed(r *Record) error {
	switch why := m.nodesWithoutFerry(); {
	case r.Upgrade == nil && why != (Condition{}):
		return errors.New(why.Message)
	case m.asking:
		return errors.New("the cluster is being asked for the upgrade already (see 'ferry status')")
	case r.Upgrade != nil && !r.Upgrade.Accepted.IsZero() && len(m.cfg.OnReady) == 0:
		return errors.New("the cluster accepted the upgrade already: follow it with 'ferry status' or 'oc get clusterversion'")
	case r.Hook != nil && r.Hook.Finished.IsZero():
		return errors.New("the on_ready hook is running")
	case r.Hook != nil:
		return errors.New("the on_ready hook already ran and succeeded")
	}
	return errors.New("nothing to do: no kubeconfig and no on_ready hook are configured; start the upgrade by hand (oc adm upgrade)")
}

func (m *Machine) upgradeAsked(ev EvUpgradeAsked) []Effect {
	r := m.Records[ev.ID]
	if r == nil || r.Upgrade == nil {
		return nil
	}
	if errors.Is(ev.Err, cluster.ErrReleaseUnapproved) {
		why := WaitingFor(ReasonReleaseUnapproved, unapprovedMessage(r.Metadata.Release))
		if r.Condition == why {
			return nil
		}
		m.log.Warn("the cluster refuses the release until the administrator approves it; asking again every 30s", "bundle", r.Name, "release", r.Metadata.Release, "approve", cluster.ApproveCommand(r.Metadata.Release))
		r.Upgrade.Error = why.Message
		return m.Move(r, r.Phase, why, r.Progress)
	}
	if ev.Err != nil {
		why := "asking the cluster for the upgrade failed, retrying: " + errText(ev.Err)
		if r.Upgrade.Error == why {
			return nil
		}
		m.log.Warn("asking the cluster for the upgrade failed, retrying", "bundle", r.Name, "err", ev.Err)
		r.Upgrade.Error = why
		return m.Move(r, r.Phase, Retrying(ReasonUpgradeRequestFailed, why), r.Progress)
	}
	m.asking, m.askedUnseen = false, true
	r.Upgrade.Accepted, r.Upgrade.Error = m.Now().UTC(), ""
	m.log.Info("the cluster accepted the upgrade request", "phase", string(r.Phase), "bundle", r.Name, "release", r.Metadata.Release)
	effs := m.Move(r, r.Phase, Condition{}, r.Progress)
	return append(effs, m.proceed(r, false)...)
}

// unapprovedMessage is what a node shows while the administrator has not
// approved release: the one command that does.
func unapprovedMessage(release string) string {
	return "waiting for the administrator to approve release " + release + " for the cluster upgrade: " + cluster.ApproveCommand(release)
}

// upgradeSeen follows the cluster version operator on the active bundle's
// release: upgrading, upgraded, or refused with the operator's words.
func (m *Machine) upgradeSeen(ev EvUpgradeSeen) []Effect {
	r := m.Active
	if r == nil || r.Metadata == nil || r.Metadata.Release != ev.Release || !r.Phase.Loaded() {
		return nil
	}
	st := ev.St
	effs := m.pathSeen(r, &st)
	return append(effs, m.followUpgrade(r, st)...)
}

// followUpgrade moves r as the cluster's upgrade of its release stands.
func (m *Machine) followUpgrade(r *Record, st cluster.UpgradeStatus) []Effect {
	switch st.State {
	case cluster.UpgradeCompleted:
		m.log.Info("the cluster upgrade is done", "phase", string(PhaseUpgraded), "bundle", r.Name, "message", st.Message)
		r.Message = st.Message
		return m.upgraded(r)
	case cluster.UpgradeRunning:
		var why Condition
		if st.Reason != "" {
			why = Underway(ReasonUpgrading, st.Reason)
		}
		if r.Phase == PhaseUpgrading && r.Message == st.Message && r.Condition == why {
			return nil
		}
		if r.Phase != PhaseUpgrading {
			m.log.Info("the cluster is upgrading", "phase", string(PhaseUpgrading), "bundle", r.Name, "message", st.Message)
		}
		r.Message = st.Message
		return m.Move(r, PhaseUpgrading, why, r.Progress)
	case cluster.UpgradeRefused:
		why := Fault(ReasonReleaseRefused, "the cluster refuses the release: "+st.Reason)
		if st.Path != nil {
			why = Fault(ReasonReleaseRefused, pathStoppedMessage(ResourceName(r.Metadata.Version, r.Metadata.Arch), st.Reason))
		}
		if r.Condition == why {
			return nil
		}
		m.log.Error("the cluster refuses the release", "phase", string(r.Phase), "bundle", r.Name, "reason", st.Reason)
		r.Message = st.Message
		return m.Move(r, r.Phase, why, r.Progress)
	case cluster.UpgradePending:
		msg := "waiting for the cluster version operator to start"
		if st.Reason != "" {
			msg += ": " + st.Reason
		}
		if hopHeld(st) {
			msg = st.Reason // the administrator's word is awaited, with the command that gives it
		}
		why := WaitingFor(ReasonUpgradePending, msg)
		if r.Condition == why {
			return nil
		}
		return m.Move(r, r.Phase, why, r.Progress)
	}
	return nil
}

// upgraded marks r done in the cluster. Its files, registry and mirror
// go once this node no longer needs them: at once on ferry cleanup (or
// without an API, where ferry cleanup is the only word that the upgrade
// is done), otherwise once the machine config operator is done with this
// node (retireWhenDone). Its pins stay; the previous bundle's pins go
// with the cleanup.
func (m *Machine) upgraded(r *Record) []Effect {
	m.LastBad = nil
	if !m.HasAPI || m.cleanupAsked {
		return m.retireNow(r)
	}
	if m.node != nil && m.node.Managed {
		m.node = nil // the MCO's work on it from before the upgrade's end says nothing
	}
	return m.retireWhenDone(r)
}

// retireNow starts r's cleanup, persisting the decision first: a restart
// finishes it without asking again.
func (m *Machine) retireNow(r *Record) []Effect {
	r.Retirement = max(r.Retirement, RetirementStarted)
	effs := m.Move(r, PhaseUpgraded, retiring, r.Progress)
	return append(effs, m.retire(r)...)
}

// retireWhenDone starts r's cleanup if the machine config operator is
// done with this node, or says what the node waits for.
func (m *Machine) retireWhenDone(r *Record) []Effect {
	why := m.nodeWaits(r)
	if why == (Condition{}) {
		m.log.Info("the machine config operator is done with this node: cleaning up", "phase", string(PhaseUpgraded), "bundle", r.Name)
		return m.retireNow(r)
	}
	if r.Phase == PhaseUpgraded && r.Condition == why {
		return nil
	}
	m.log.Info("the cluster upgrade is done; this node still needs the bundle", "phase", string(PhaseUpgraded), "bundle", r.Name, "reason", why.Message)
	return m.Move(r, PhaseUpgraded, why, r.Progress)
}

// nodeWaits says what this node waits for before it no longer needs r's
// images (the OS image first of all, pulled through ferry's mirror when
// the MCO updates it), or the zero Condition when it waits for nothing.
//
// ClusterVersion says Completed once the control plane is done; worker
// pools keep rolling (one node at a time, paused pools, canaries). The
// MCO is done with the node when its daemon reports Done with the
// currentConfig it was sent to (desiredConfig), and that config is the
// pool's target (spec.configuration, which the MCO's render controller
// points at the new release's rendered config once the MCO itself is
// upgraded, before ClusterVersion can say Completed): a node the MCO has
// not picked yet shows Done on the old config, which is not the target.
// As a second guard it must also differ from the config recorded at
// cluster-ready, before the upgrade: the upgrade's rendered config is a
// new one. Names are compared rather than creation times: no clock skew,
// no read of MachineConfigs, and a baseline is only recorded before the
// upgrade, so a late first reading can never make the node wait forever.
func (m *Machine) nodeWaits(r *Record) Condition {
	n := m.node
	switch {
	case n == nil:
		return WaitingFor(ReasonNodeUnread, "waiting to read this node's machine config state from the cluster's API")
	case !n.Managed:
		return Condition{} // no machine config operator: done at Completed
	case n.State == "Done" && n.Current == n.Desired && (n.Target == "" || n.Current == n.Target) && n.Current != r.MachineConfig:
		return Condition{}
	case n.Paused:
		return WaitingFor(ReasonPoolPaused, "waiting: pool "+n.Pool+" is paused; the machine config operator updates this node once it is unpaused (the bundle's registry and mirror stay until then)")
	case n.State != "Done" || n.Current != n.Desired:
		why := "waiting for the machine config operator to update this node (state " + cmp.Or(n.State, "unknown") + ", " + cmp.Or(n.Current, "none") + " → " + cmp.Or(n.Desired, "none") + ")"
		if n.Reason != "" {
			why += ": " + n.Reason
		}
		return WaitingFor(ReasonNodeUpdating, why)
	case n.Target != "" && n.Current != n.Target:
		return WaitingFor(ReasonNodeUpdating, "waiting for the machine config operator to update this node (pool "+n.Pool+" goes to "+n.Target+", the node is on "+n.Current+")")
	}
	return WaitingFor(ReasonNodeUpdating, "waiting for the machine config operator to update this node (still on "+n.Current+", its config from before the upgrade)")
}

// nodeSeen takes a reading of the machine config operator's state of
// this node: at cluster-ready it records the config the node was headed
// for before the upgrade; once upgraded, it cleans up when the MCO is
// done with the node.
func (m *Machine) nodeSeen(ev EvNodeSeen) []Effect {
	n := ev.St
	m.node = &n
	r := m.Active
	switch {
	case r == nil:
	case r.Phase == PhaseClusterReady && r.MachineConfig == "" && n.Managed:
		r.MachineConfig = cmp.Or(n.Desired, n.Current)
		if r.MachineConfig != "" {
			m.log.Info("this node's machine config before the upgrade", "bundle", r.Name, "config", r.MachineConfig)
			return []Effect{EffSave{r}}
		}
	case r.Phase == PhaseUpgraded && r.Retirement == RetirementNone && m.Job == nil:
		return m.retireWhenDone(r)
	}
	return nil
}

// readsNode reports whether the follower should read the machine config
// operator's state of this node: at cluster-ready until the config from
// before the upgrade is recorded, and once upgraded until it cleans up.
func (m *Machine) ReadsNode() bool {
	r := m.Active
	if r == nil || !m.HasAPI {
		return false
	}
	return r.Phase == PhaseClusterReady && r.MachineConfig == "" ||
		r.Phase == PhaseUpgraded && r.Retirement == RetirementNone
}

func (m *Machine) retire(r *Record) []Effect {
	if m.Job != nil || r.Retirement >= RetirementDone {
		return nil
	}
	prev := m.previous
	if prev == r || prev != nil && prev.Retirement == RetirementUnpinned {
		prev = nil
	}
	retain := m.cfg.KeepRunningRelease && r.Dir != "" && r.Metadata != nil
	return m.startJob(EffStartJob{Kind: JobRetire, Rec: r, Unload: m.hasLoader, Previous: prev, Retain: retain}, "")
}

func (m *Machine) retireDone(r *Record, j EvJobDone) []Effect {
	reply := m.cleanupReply
	m.cleanupAsked, m.cleanupReply = false, 0
	var effs []Effect
	if j.Err != nil {
		why := "cleaning up after the upgrade failed, retrying in 30s: " + errText(j.Err)
		m.log.Error("cleaning up after the upgrade failed", "phase", string(PhaseUpgraded), "bundle", r.Name, "err", j.Err)
		effs = append(m.Move(r, PhaseUpgraded, Retrying(ReasonCleanupFailed, why), r.Progress), EffRetryIn{After: retireRetry})
		if reply != 0 {
			effs = append(effs, EffReply{reply, wrap(j.Err, "cleanup of "+r.Name+": "+errText(j.Err))})
		}
		return effs
	}
	if p := m.previous; p != nil && p != r {
		p.Retirement, p.Retained = RetirementUnpinned, false // its tree went with the retire job
		effs = append(effs, EffSave{p})
	}
	r.Retirement = RetirementDone
	r.Retained = m.cfg.KeepRunningRelease && r.Dir != "" && r.Metadata != nil
	effs = append(effs, m.Move(r, PhaseUpgraded, Condition{}, r.Progress)...)
	m.previous, m.done, m.Active, m.cleaned = r, r, nil, nil
	if r.Retained {
		m.log.Info("upgrade done: the bundle's registry and mirror are gone; its images stay pinned and its files stay as the running release's source until the next upgrade",
			"phase", string(PhaseUpgraded), "bundle", r.Name, "digest", r.Digest, "dir", r.Dir)
	} else {
		m.log.Info("upgrade done: the bundle's files, registry and mirror are gone; its images stay pinned until the next upgrade",
			"phase", string(PhaseUpgraded), "bundle", r.Name, "digest", r.Digest)
	}
	if reply != 0 {
		effs = append(effs, EffReply{reply, nil})
	}
	return effs
}

// startHook marks the hook started (persisted first, so a crash never
// runs it twice) and runs it.
func (m *Machine) startHook(r *Record) ([]Effect, error) {
	if len(m.cfg.OnReady) == 0 {
		return nil, errors.New("no on_ready hook is configured")
	}
	if r.Hook != nil {
		return nil, errors.New("the on_ready hook already ran")
	}
	r.Hook = &HookRun{Started: m.Now().UTC()}
	return []Effect{EffSave{r}, EffRunHook{r}}, nil
}

func (m *Machine) hookDone(h EvHookDone) []Effect {
	r := m.Records[h.ID]
	if r == nil {
		return nil
	}
	run := h.Run
	r.Hook = &run
	if run.Error != "" {
		m.log.Error("the on_ready hook failed", "bundle", r.Name, "err", run.Error)
	} else {
		m.log.Info("the on_ready hook succeeded", "bundle", r.Name)
	}
	return []Effect{EffSave{r}}
}
