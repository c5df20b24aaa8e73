package machine

import "time"

// The running release's source. Once a bundle's upgrade is done its tree
// stays on the node (Record.Retained) until the next upgrade is done: with
// no registry on the site, it is the only copy of the release's images
// besides CRI-O's own storage, which CRI-O may wipe when it repairs itself
// after an unclean stop, and which a node that joins later does not have.
// runtimeCheck loads what CRI-O lost again from it; the peers are served
// it as any bundle.

// retained is the bundle whose tree is kept as the running release's
// source, or nil.
func (m *Machine) retained() *Record {
	if r := m.done; r != nil && r.Retained && r.Metadata != nil {
		return r
	}
	return nil
}

// resumeRetained, at start, serves the kept tree to the peers again, or
// removes it when the config no longer keeps one.
func (m *Machine) resumeRetained() []Effect {
	r := m.retained()
	if r == nil {
		return nil
	}
	if !m.cfg.KeepRunningRelease {
		m.log.Info("retention.keep_running_release is off: removing the copy kept of the running release", "bundle", r.Name, "dir", r.Dir)
		return m.dropRetained(r)
	}
	return []Effect{EffShare{Rec: r}}
}

// dropRetained stops keeping r's tree.
func (m *Machine) dropRetained(r *Record) []Effect {
	r.Retained = false
	return []Effect{EffUnshare{r.Digest}, EffRemove{r.Dir}, EffSave{r}}
}

// keepsDir drops the kept tree when a new bundle is about to be written
// to the same directory (a bundle of the same version and architecture):
// the new one replaces it.
func (m *Machine) keepsDir(dir string) []Effect {
	r := m.retained()
	if r == nil || r.Dir != dir {
		return nil
	}
	m.log.Warn("a new bundle for the same release replaces the copy kept of the running release", "bundle", r.Name, "dir", dir)
	return m.dropRetained(r)
}

// runtimeCheck starts checking that CRI-O holds every image of the
// running release (loading again those it lacks) when nothing else runs
// on CRI-O; otherwise once the running job ends. A loaded bundle that is
// not the running release holds the mirror: the check waits for it to be
// taken out or to become the running release.
func (m *Machine) runtimeCheck(why string) []Effect {
	r := m.retained()
	if r == nil || !m.hasLoader {
		return nil
	}
	if a := m.Active; m.Job != nil || a != nil && (a.Phase == PhaseLoading || a.Phase.Loaded() || a.Phase == PhaseUpgraded) {
		m.restoreDue = why
		return nil
	}
	m.restoreDue = ""
	m.log.Debug("checking that CRI-O holds the running release", "bundle", r.Name, "cause", why)
	return m.startJob(EffStartJob{Kind: JobRestore, Rec: r}, "")
}

// restoreRetry is how soon a check that failed is tried again.
const restoreRetry = 15 * time.Second

// restoreIfDue runs a check asked for while a job ran, or one to retry.
func (m *Machine) restoreIfDue() []Effect {
	if m.restoreDue == "" || m.Job != nil {
		return nil
	}
	return m.runtimeCheck(m.restoreDue)
}

func (m *Machine) restoreDone(r *Record, j EvJobDone) []Effect {
	var effs []Effect
	switch {
	case r == nil || j.Stopped:
	case j.Err != nil:
		// CRI-O may not answer yet (it has just restarted): again soon.
		m.notice = "checking or loading again the running release " + r.Name + " from the copy kept here failed (retried in " + restoreRetry.String() + "): " + errText(j.Err)
		m.log.Error("checking or loading again the running release's images failed", "bundle", r.Name, "missing", j.Restored, "retry_in", restoreRetry, "err", j.Err)
		m.restoreDue = "retry"
		effs = append(effs, EffAnnounce{m.report()}, EffRetryIn{After: restoreRetry})
	case j.Restored > 0:
		m.notice = "CRI-O had lost " + itoa(j.Restored) + " images of the running release " + r.Name + ": loaded and pinned again from the copy kept here at " + m.Now().UTC().Format("2006-01-02 15:04:05Z")
		m.log.Warn("the running release's images CRI-O had lost are loaded and pinned again from the copy kept on this node", "bundle", r.Name, "images", j.Restored)
		effs = append(effs, EffAnnounce{m.report()})
	}
	if m.cleanupAsked {
		return append(effs, m.cleanup()...)
	}
	return append(effs, m.next()...)
}
