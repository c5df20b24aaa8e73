package machine

import (
	"errors"
	"slices"
	"strconv"

	"github.com/ferry-edge/ferry/internal/digest"
)

// Transitions of the local socket's requests (EvRequest): ferry load,
// ferry cleanup (and the cleanup job's end), ferry proceed.

// requestArrived answers one request.
func (m *Machine) requestArrived(q EvRequest) []Effect {
	switch q.Kind {
	case ReqLoad:
		if q.Medium == 0 {
			return []Effect{EffReply{q.Reply, errors.New("no bundle given")}}
		}
		if m.Job != nil {
			return []Effect{EffCloseMedium{q.Medium}, EffReply{q.Reply, errors.New("busy (" + string(m.Job.Kind) + "); try again when it is done")}}
		}
		var held digest.Digest
		if m.Active != nil {
			held = m.Active.Digest
		}
		if q.Approve != "" && !slices.Contains(m.pulled, q.Approve) {
			m.pulled = append(m.pulled, q.Approve)
		}
		return []Effect{EffProbe{Origin: OriginFile, Medium: q.Medium, Held: held, Reply: q.Reply}}
	case ReqCleanup:
		if m.Active == nil {
			return []Effect{EffReply{q.Reply, errors.New("no bundle to clean up")}}
		}
		if r := m.Active; r.Phase == PhaseUpgraded && r.Retirement == RetirementNone && !m.cleanupAsked && m.Job == nil {
			// Upgraded, waiting for the machine config operator: the
			// technician says the node no longer needs the bundle.
			m.cleanupAsked, m.cleanupReply = true, q.Reply
			m.log.Info("ferry cleanup: the bundle is no longer needed here", "bundle", r.Name, "waited", r.Condition.Message)
			return m.retireNow(r)
		}
		if m.cleanupAsked || m.Active.Phase == PhaseUpgraded {
			return []Effect{EffReply{q.Reply, errors.New("a cleanup is already under way")}}
		}
		if r := m.Active; r.Phase == PhaseUpgrading && m.HasAPI {
			return []Effect{EffReply{q.Reply, errors.New("the cluster is upgrading to " + r.Name + ": taking it out now would take away the images the upgrade pulls; ferry cleans up by itself once the upgrade is done")}}
		}
		if why := m.cleanupHeld(m.Active); why != "" {
			return []Effect{EffReply{q.Reply, errors.New(why)}}
		}
		m.cleanupAsked, m.cleanupReply = true, q.Reply
		if r := m.Active; r.Phase.Loaded() && m.Job == nil && !m.HasAPI {
			// Loaded everywhere: without the API, this is the word that
			// the upgrade is done. With it, the cluster says when it is
			// done, and a loaded bundle it never ran is unloaded.
			m.log.Info("ferry cleanup: the upgrade is done", "bundle", r.Name)
			return m.upgraded(r)
		}
		if m.Job != nil {
			return []Effect{EffStopJob{}} // the cleanup starts when it has stopped
		}
		return m.cleanup()
	case reqProceed:
		r := m.Active
		if r != nil && r.Phase == PhaseLoaded && (r.Condition.Reason == ReasonNodesWithoutFerry || r.Condition.Reason == ReasonNodesWithoutCRIO) {
			return []Effect{EffReply{q.Reply, errors.New(r.Condition.Message)}}
		}
		if r == nil || r.Phase != PhaseClusterReady && r.Phase != PhaseUpgrading {
			return []Effect{EffReply{q.Reply, errors.New("the cluster is not ready: every node must be loaded with the same bundle first (see 'ferry status --cluster')")}}
		}
		effs := m.proceed(r, true)
		if len(effs) == 0 {
			return []Effect{EffReply{q.Reply, m.nothingToProceed(r)}}
		}
		return append(effs, EffReply{q.Reply, nil})
	}
	return []Effect{EffReply{q.Reply, errors.New("unknown request " + strconv.Quote(string(q.Kind)))}}
}

// cleanup starts taking the active bundle out of CRI-O and off the disk.
func (m *Machine) cleanup() []Effect {
	r := m.Active
	if r == nil {
		m.cleanupAsked = false
		return []Effect{EffReply{m.cleanupReply, errors.New("no bundle to clean up")}}
	}
	unload := m.hasLoader && r.Metadata != nil && r.Phase != PhaseDetected
	return m.startJob(EffStartJob{Kind: JobCleanup, Rec: r, Unload: unload}, "")
}

func (m *Machine) cleanupDone(r *Record, j EvJobDone) []Effect {
	reply := m.cleanupReply
	m.cleanupAsked, m.cleanupReply = false, 0
	if j.Err != nil {
		return []Effect{EffReply{reply, wrap(j.Err, "cleanup of "+r.Name+": "+errText(j.Err))}}
	}
	effs := m.Move(r, PhaseCleaned, Condition{}, Progress{})
	m.Active, m.cleaned = nil, r
	m.log.Info("cleaned up", "phase", string(PhaseCleaned), "bundle", r.Name, "digest", r.Digest)
	return append(effs, EffReply{reply, nil})
}
