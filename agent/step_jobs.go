package agent

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/bundle"
)

// Transitions of a job's end (evJobDone): extract, fetch, load; cleanup
// and retire end in step_request.go and step_upgrade.go, restore in
// step_retain.go.

func (m *machine) jobDone(j evJobDone) []effect {
	var effs []effect
	if m.job != nil && m.job.medium != 0 {
		effs = append(effs, effCloseMedium{m.job.medium})
	}
	m.job = nil
	r := m.records[j.id]
	if j.kind == jobRestore {
		return append(effs, m.restoreDone(r, j)...)
	}
	if r == nil || r != m.active || !jobFits(j.kind, r.Phase) {
		m.log.Warn("a job's end for a bundle no longer in its phase is ignored", "job", string(j.kind), "record", j.id)
		if m.cleanupAsked {
			return append(effs, m.cleanup()...)
		}
		return effs
	}
	switch j.kind {
	case jobFetch:
		effs = append(effs, m.fetchDone(r, j)...)
	case jobExtract:
		effs = append(effs, m.extractDone(r, j)...)
	case jobLoad:
		effs = append(effs, m.loadDone(r, j)...)
	case jobCleanup:
		effs = append(effs, m.cleanupDone(r, j)...)
		return append(effs, m.restoreIfDue()...)
	case jobRetire:
		effs = append(effs, m.retireDone(r, j)...)
		return append(effs, m.restoreIfDue()...)
	}
	if m.cleanupAsked {
		return append(effs, m.cleanup()...)
	}
	return append(effs, m.restoreIfDue()...)
}

// jobFits reports whether a job of this kind runs in phase p: a job's end
// moves a bundle only from the phase the job belongs to.
func jobFits(k jobKind, p Phase) bool {
	switch k {
	case jobExtract:
		return p == PhaseDetected || p == PhaseFetching
	case jobFetch:
		return p == PhaseFetching
	case jobLoad:
		return p == PhaseLoading
	case jobRetire:
		return p == PhaseUpgraded
	}
	return p.Active() // cleanup
}

func (m *machine) fetchDone(r *Record, j evJobDone) []effect {
	switch {
	case j.stopped:
		return nil
	case j.res != nil || streamRefused(j.err):
		// Fetched and extracted in one pass (cut-through).
		return m.extractDone(r, j)
	case j.err != nil && bundle.DiskFilled(j.err):
		return m.abandon(r, j.err)
	case j.err != nil:
		reason := fmt.Sprintf("fetching from the peers failed, retrying: %v", j.err)
		m.log.Warn("fetch failed", "phase", string(PhaseFetching), "bundle", r.Name, "err", j.err)
		return append(m.move(r, PhaseFetching, retrying(ReasonFetchFailed, reason), r.Progress), effRetryIn{10 * time.Second})
	}
	// Serial mode: the whole tar is here; extract it.
	src := bundle.Source{Path: m.incomingPath(r), SHA256Path: strings.TrimSuffix(m.incomingPath(r), ".tar") + ".sha256"}
	if r.Approval == bundle.ApprovalSignature {
		src.SigPath = src.Path + ".minisig"
	}
	return m.extract(r, src, "", 0, m.extractPolicy(r))
}

// extractPolicy is the policy a bundle fetched from the peers is
// extracted under, by how its offer was approved: by this node's own
// keys, the signature is verified over the bytes; as a bundle of a
// release asked for from the registry, it is held to what the release
// names; otherwise by the digest approved before fetching.
func (m *machine) extractPolicy(r *Record) bundle.Policy {
	if r.Approval == bundle.ApprovalSignature {
		return m.polFor(r.Metadata)
	}
	pol := m.polFor(r.Metadata).PreApproved(r.Digest)
	if r.Approval == bundle.ApprovalSource {
		pol.Payload = m.polFor(r.Metadata).SourceFor(r.Digest, r.Metadata)
	}
	return pol
}

// streamRefused reports whether a fetch that extracted as it went ended
// in a refusal of the bundle (or no room to extract it), which is the
// extraction's end to handle. A digest mismatch is not: the bytes came
// from peers that lied, and the fetch is tried again.
func streamRefused(err error) bool {
	return err != nil && (bundle.IsRefusal(err) || errors.Is(err, bundle.ErrNoSpace)) && !errors.Is(err, bundle.ErrMismatch)
}

func (m *machine) extractDone(r *Record, j evJobDone) []effect {
	var effs []effect
	if r.Origin == OriginPeer && (j.err == nil || bundle.IsRefusal(j.err)) {
		effs = append(effs, effRemove{filepath.Dir(m.incomingPath(r))})
	}
	if j.err != nil {
		if r.Origin == OriginPeer && bundle.DiskFilled(j.err) {
			return append(effs, m.abandon(r, j.err)...)
		}
		if r.Origin == OriginPeer && errors.Is(j.err, bundle.ErrNoSpace) {
			// Not the bundle's fault: the disk filled up since the fetch
			// checked for room. Its tar is gone (above); it is fetched
			// again, after the same check, once there is room.
			reason := fmt.Sprintf("no room to extract the fetched bundle, fetching it again once there is: %v", j.err)
			m.log.Warn("no room to extract a fetched bundle", "phase", string(PhaseFetching), "bundle", r.Name, "err", j.err)
			return append(append(effs, m.move(r, PhaseFetching, retrying(ReasonNoRoomToExtract, reason), Progress{Unit: "bytes"})...), effRetryIn{10 * time.Second})
		}
		if bundle.IsRefusal(j.err) || errors.Is(j.err, ErrPreflight) {
			m.active = nil
			return append(effs, m.reject(r, j.err)...)
		}
		// A stop by the agent's own end never gets here (the loop is gone):
		// this is a pulled stick, a read error or a cleanup.
		reason := "the stick was pulled or could not be read before the copy finished: plug it in again"
		if r.Origin == OriginFile {
			reason = "the file could not be read before the copy finished: run 'ferry load " + r.Source + "' again"
		}
		m.log.Warn("extraction interrupted", "phase", string(PhaseDetected), "bundle", r.Name, "err", j.err)
		return append(effs, m.move(r, PhaseDetected, waiting(ReasonCopyInterrupted, reason+" ("+j.err.Error()+")"), Progress{})...)
	}
	if meta := j.res.Metadata; meta != nil {
		// From here on the node acts on the metadata.json that was inside
		// the checked tar, never on the probe's earlier read of it nor on
		// a peer's description (docs/design.md, "Trust").
		if r.Metadata != nil && meta.DirName() != r.Metadata.DirName() {
			m.active = nil
			err := fmt.Errorf("%w: the metadata.json inside the checked tar (%s) is not the one read before (%s): the source changed while it was read, or a peer described it falsely; do not use it",
				bundle.ErrInvalid, meta.DirName(), r.Metadata.DirName())
			return append(append(effs, effRemove{r.Dir}), m.reject(r, err)...)
		}
		r.Metadata = meta
	}
	r.Digest, r.Approval, r.Signature = j.res.Digest, j.res.Approval, j.res.Signature
	r.DigestOnly, r.SignaturePolicy = j.res.Admission.DigestOnly, j.res.Admission.Warnings
	for _, w := range r.SignaturePolicy {
		m.log.Warn("signature policy", "bundle", r.Name, "warning", w)
	}
	var why Condition
	if r.Approval == bundle.ApprovalNone {
		why = waiting(ReasonAwaitingApproval, m.waitingForApproval(r))
	}
	effs = append(effs, m.move(r, PhaseExtracted, why, Progress{Done: j.res.TarSize, Total: j.res.TarSize, Unit: "bytes"})...)
	effs = append(effs, effShare{rec: r, pieces: j.pieces})
	m.lastBad = nil
	m.log.Info("verified and extracted: the stick can be unplugged", "phase", string(PhaseExtracted),
		"bundle", r.Name, "digest", r.Digest, "approval", j.res.Approval)
	return append(effs, m.next()...)
}

func (m *machine) loadDone(r *Record, j evJobDone) []effect {
	switch {
	case j.stopped:
		return nil
	case j.err != nil && Permanent(j.err):
		m.backoff = 0
		m.log.Error("loading failed and cannot heal by retrying", "phase", string(PhaseFailed), "bundle", r.Name, "err", j.err)
		return m.move(r, PhaseFailed, fault(ReasonLoadFailed, j.err.Error()), r.Progress)
	case j.err != nil:
		m.backoff = min(max(2*m.backoff, 5*time.Second), 5*time.Minute)
		reason := fmt.Sprintf("loading failed, retrying in %s: %v", m.backoff, j.err)
		m.log.Error("loading failed", "phase", string(PhaseLoading), "bundle", r.Name, "err", j.err)
		return append(m.move(r, PhaseLoading, retrying(ReasonLoadFailed, reason), r.Progress), effRetryIn{m.backoff})
	}
	m.backoff = 0
	effs := m.move(r, PhaseLoaded, Condition{}, r.Progress)
	m.log.Info("loaded: every image is present and pinned", "phase", string(PhaseLoaded), "bundle", r.Name, "digest", r.Digest)
	return append(effs, m.gate(r)...)
}

// abandon gives up a fetch whose bytes filled the disk (or hit their
// bound): it is not retried into the same disk, which on a node is /var,
// shared with CRI-O and etcd. What it wrote goes; a restart, once there
// is room, fetches it again.
func (m *machine) abandon(r *Record, err error) []effect {
	reason := fmt.Sprintf("abandoned: %v; free some space in %s, then restart ferry to fetch it again", err, m.cfg.ExtractDir)
	m.log.Error("fetch abandoned: the disk filled up", "phase", string(PhaseFailed), "bundle", r.Name, "err", err)
	effs := []effect{effRemove{filepath.Dir(m.incomingPath(r))}, effRemove{bundle.StagingDir(r.Dir)}, effRemove{r.Dir}}
	return append(effs, m.move(r, PhaseFailed, fault(ReasonFetchAbandoned, reason), Progress{})...)
}

func (m *machine) reject(r *Record, err error) []effect {
	return m.rejectAs(r, refusalReason(err), strings.TrimPrefix(err.Error(), "bundle "+r.Name+": "))
}

// rejectAs rejects r for the machine reason given, saying message.
func (m *machine) rejectAs(r *Record, reason, message string) []effect {
	m.log.Error("bundle refused", "phase", string(PhaseRejected), "bundle", r.Name, "reason", reason, "message", message)
	m.lastBad = r
	return m.move(r, PhaseRejected, fault(reason, message), Progress{})
}

// incomingPath is where a fetched tar lands, under its own name so that
// messages about it read as they would for a stick.
func (m *machine) incomingPath(r *Record) string {
	return filepath.Join(m.cfg.StateDir, "incoming", strings.TrimPrefix(string(r.Digest), "sha256:"), r.Name)
}

// Permanent reports whether err says that retrying cannot fix it (an
// image the bundle lacks, bytes that do not match their digest): such a
// load ends in failed instead of retrying forever. An error opts in by
// having a Permanent() bool method returning true, so the agent needs no
// import of the part that raised it.
func Permanent(err error) bool {
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}
