package agent

import (
	"errors"
	"fmt"
	"slices"

	"github.com/opencontainers/go-digest"
)

// Transitions of the local socket's requests (evRequest): ferry load,
// ferry cleanup (and the cleanup job's end), ferry proceed.

func (m *machine) request(q evRequest) []effect {
	switch q.kind {
	case reqLoad:
		if q.medium == 0 {
			return []effect{effReply{q.reply, errors.New("no bundle given")}}
		}
		if m.job != nil {
			return []effect{effCloseMedium{q.medium}, effReply{q.reply, fmt.Errorf("busy (%s); try again when it is done", m.job.kind)}}
		}
		var held digest.Digest
		if m.active != nil {
			held = m.active.Digest
		}
		if q.approve != "" && !slices.Contains(m.pulled, q.approve) {
			m.pulled = append(m.pulled, q.approve)
		}
		return []effect{effProbe{origin: OriginFile, medium: q.medium, held: held, reply: q.reply}}
	case reqCleanup:
		if m.active == nil {
			return []effect{effReply{q.reply, errors.New("no bundle to clean up")}}
		}
		if r := m.active; r.Phase == PhaseUpgraded && r.Retirement == RetirementNone && !m.cleanupAsked && m.job == nil {
			// Upgraded, waiting for the machine config operator: the
			// technician says the node no longer needs the bundle.
			m.cleanupAsked, m.cleanupReply = true, q.reply
			m.log.Info("ferry cleanup: the bundle is no longer needed here", "bundle", r.Name, "waited", r.Condition.Message)
			return m.retireNow(r)
		}
		if m.cleanupAsked || m.active.Phase == PhaseUpgraded {
			return []effect{effReply{q.reply, errors.New("a cleanup is already under way")}}
		}
		if r := m.active; r.Phase == PhaseUpgrading && m.hasAPI {
			return []effect{effReply{q.reply, fmt.Errorf("the cluster is upgrading to %s: taking it out now would take away the images the upgrade pulls; ferry cleans up by itself once the upgrade is done", r.Name)}}
		}
		if why := m.cleanupHeld(m.active); why != "" {
			return []effect{effReply{q.reply, fmt.Errorf("%s", why)}}
		}
		m.cleanupAsked, m.cleanupReply = true, q.reply
		if r := m.active; r.Phase.Loaded() && m.job == nil && !m.hasAPI {
			// Loaded everywhere: without the API, this is the word that
			// the upgrade is done. With it, the cluster says when it is
			// done, and a loaded bundle it never ran is unloaded.
			m.log.Info("ferry cleanup: the upgrade is done", "bundle", r.Name)
			return m.upgraded(r)
		}
		if m.job != nil {
			return []effect{effStopJob{}} // the cleanup starts when it has stopped
		}
		return m.cleanup()
	case reqProceed:
		r := m.active
		if r != nil && r.Phase == PhaseLoaded && (r.Condition.Reason == ReasonNodesWithoutFerry || r.Condition.Reason == ReasonNodesWithoutCRIO) {
			return []effect{effReply{q.reply, errors.New(r.Condition.Message)}}
		}
		if r == nil || r.Phase != PhaseClusterReady && r.Phase != PhaseUpgrading {
			return []effect{effReply{q.reply, errors.New("the cluster is not ready: every node must be loaded with the same bundle first (see 'ferry status --cluster')")}}
		}
		effs := m.proceed(r, true)
		if len(effs) == 0 {
			return []effect{effReply{q.reply, m.nothingToProceed(r)}}
		}
		return append(effs, effReply{q.reply, nil})
	}
	return []effect{effReply{q.reply, fmt.Errorf("unknown request %q", q.kind)}}
}

// cleanup starts taking the active bundle out of CRI-O and off the disk.
func (m *machine) cleanup() []effect {
	r := m.active
	if r == nil {
		m.cleanupAsked = false
		return []effect{effReply{m.cleanupReply, errors.New("no bundle to clean up")}}
	}
	unload := m.hasLoader && r.Metadata != nil && r.Phase != PhaseDetected
	return m.startJob(effStartJob{kind: jobCleanup, rec: r, unload: unload}, "")
}

func (m *machine) cleanupDone(r *Record, j evJobDone) []effect {
	reply := m.cleanupReply
	m.cleanupAsked, m.cleanupReply = false, 0
	if j.err != nil {
		return []effect{effReply{reply, fmt.Errorf("cleanup of %s: %w", r.Name, j.err)}}
	}
	effs := m.move(r, PhaseCleaned, Condition{}, Progress{})
	m.active, m.cleaned = nil, r
	m.log.Info("cleaned up", "phase", string(PhaseCleaned), "bundle", r.Name, "digest", r.Digest)
	return append(effs, effReply{reply, nil})
}
