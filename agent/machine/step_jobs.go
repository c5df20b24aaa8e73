package machine

import (
	"errors"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/bundle/meta"
)

// Transitions of a job's end (evJobDone): extract, fetch, load; cleanup
// and retire end in step_request.go and step_upgrade.go, restore in
// step_retain.go.

func (m *Machine) jobDone(j EvJobDone) []Effect {
	var effs []Effect
	if m.Job != nil && m.Job.medium != 0 {
		effs = append(effs, EffCloseMedium{m.Job.medium})
	}
	m.Job = nil
	r := m.Records[j.ID]
	if j.Kind == JobRestore {
		return append(effs, m.restoreDone(r, j)...)
	}
	if r == nil || r != m.Active || !jobFits(j.Kind, r.Phase) {
		m.log.Warn("a job's end for a bundle no longer in its phase is ignored", "job", string(j.Kind), "record", j.ID)
		if m.cleanupAsked {
			return append(effs, m.cleanup()...)
		}
		return effs
	}
	switch j.Kind {
	case JobFetch:
		effs = append(effs, m.fetchDone(r, j)...)
	case JobExtract:
		effs = append(effs, m.extractDone(r, j)...)
	case JobLoad:
		effs = append(effs, m.loadDone(r, j)...)
	case JobCleanup:
		effs = append(effs, m.cleanupDone(r, j)...)
		return append(effs, m.restoreIfDue()...)
	case JobRetire:
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
	case JobExtract:
		return p == PhaseDetected || p == PhaseFetching
	case JobFetch:
		return p == PhaseFetching
	case JobLoad:
		return p == PhaseLoading
	case JobRetire:
		return p == PhaseUpgraded
	}
	return p.Active() // cleanup
}

func (m *Machine) fetchDone(r *Record, j EvJobDone) []Effect {
	switch {
	case j.Stopped:
		return nil
	case j.Res != nil || streamRefused(j.Err):
		// Fetched and extracted in one pass (cut-through).
		return m.extractDone(r, j)
	case j.Err != nil && meta.DiskFilled(j.Err):
		return m.abandon(r, j.Err)
	case j.Err != nil:
		reason := "fetching from the peers failed, retrying: " + errText(j.Err)
		m.log.Warn("fetch failed", "phase", string(PhaseFetching), "bundle", r.Name, "err", j.Err)
		return append(m.Move(r, PhaseFetching, Retrying(ReasonFetchFailed, reason), r.Progress), EffRetryIn{10 * time.Second})
	}
	// Serial mode: the whole tar is here; extract it.
	src := meta.Source{Path: m.IncomingPath(r), SHA256Path: strings.TrimSuffix(m.IncomingPath(r), ".tar") + ".sha256"}
	if r.Approval == meta.ApprovalSignature {
		src.SigPath = src.Path + ".minisig"
	}
	return m.extract(r, src, "", 0, m.extractPolicy(r))
}

// extractPolicy is the policy a bundle fetched from the peers is
// extracted under, by how its offer was approved: by this node's own
// keys, the signature is verified over the bytes; as a bundle of a
// release asked for from the registry, it is held to what the release
// names; otherwise by the digest approved before fetching.
func (m *Machine) extractPolicy(r *Record) meta.Policy {
	if r.Approval == meta.ApprovalSignature {
		return m.polFor(r.Metadata)
	}
	pol := m.polFor(r.Metadata).PreApproved(r.Digest)
	if r.Approval == meta.ApprovalSource {
		pol.Payload = m.polFor(r.Metadata).SourceFor(r.Digest, r.Metadata)
	}
	return pol
}

// streamRefused reports whether a fetch that extracted as it went ended
// in a refusal of the bundle (or no room to extract it), which is the
// extraction's end to handle. A digest mismatch is not: the bytes came
// from peers that lied, and the fetch is tried again.
func streamRefused(err error) bool {
	return err != nil && (meta.IsRefusal(err) || errors.Is(err, meta.ErrNoSpace)) && !errors.Is(err, meta.ErrMismatch)
}

func (m *Machine) extractDone(r *Record, j EvJobDone) []Effect {
	var effs []Effect
	if r.Origin == OriginPeer && (j.Err == nil || meta.IsRefusal(j.Err)) {
		effs = append(effs, EffRemove{m.incomingDir(r)})
	}
	if j.Err != nil {
		if r.Origin == OriginPeer && meta.DiskFilled(j.Err) {
			return append(effs, m.abandon(r, j.Err)...)
		}
		if r.Origin == OriginPeer && errors.Is(j.Err, meta.ErrNoSpace) {
			// Not the bundle's fault: the disk filled up since the fetch
			// checked for room. Its tar is gone (above); it is fetched
			// again, after the same check, once there is room.
			reason := "no room to extract the fetched bundle, fetching it again once there is: " + errText(j.Err)
			m.log.Warn("no room to extract a fetched bundle", "phase", string(PhaseFetching), "bundle", r.Name, "err", j.Err)
			return append(append(effs, m.Move(r, PhaseFetching, Retrying(ReasonNoRoomToExtract, reason), Progress{Unit: "bytes"})...), EffRetryIn{10 * time.Second})
		}
		if meta.IsRefusal(j.Err) || errors.Is(j.Err, ErrPreflight) {
			m.Active = nil
			return append(effs, m.reject(r, j.Err)...)
		}
		// A stop by the agent's own end never gets here (the loop is gone):
		// this is a pulled stick, a read error or a cleanup.
		reason := "the stick was pulled or could not be read before the copy finished: plug it in again"
		if r.Origin == OriginFile {
			reason = "the file could not be read before the copy finished: run 'ferry load " + r.Source + "' again"
		}
		m.log.Warn("extraction interrupted", "phase", string(PhaseDetected), "bundle", r.Name, "err", j.Err)
		return append(effs, m.Move(r, PhaseDetected, WaitingFor(ReasonCopyInterrupted, reason+" ("+j.Err.Error()+")"), Progress{})...)
	}
	if md := j.Res.Metadata; md != nil {
		// From here on the node acts on the metadata.json that was inside
		// the checked tar, never on the probe's earlier read of it nor on
		// a peer's description (docs/design.md, "Trust").
		if r.Metadata != nil && md.DirName() != r.Metadata.DirName() {
			m.Active = nil
			err := wrap(meta.ErrInvalid, meta.ErrInvalid.Error()+": the metadata.json inside the checked tar ("+md.DirName()+") is not the one read before ("+
				r.Metadata.DirName()+"): the source changed while it was read, or a peer described it falsely; do not use it")
			return append(append(effs, EffRemove{r.Dir}), m.reject(r, err)...)
		}
		r.Metadata = md
	}
	r.Digest, r.Approval, r.Signature = j.Res.Digest, j.Res.Approval, j.Res.Signature
	r.DigestOnly, r.SignaturePolicy = j.Res.Admission.DigestOnly, j.Res.Admission.Warnings
	for _, w := range r.SignaturePolicy {
		m.log.Warn("signature policy", "bundle", r.Name, "warning", w)
	}
	var why Condition
	if r.Approval == meta.ApprovalNone {
		why = WaitingFor(ReasonAwaitingApproval, m.WaitingForApproval(r))
	}
	effs = append(effs, m.Move(r, PhaseExtracted, why, Progress{Done: j.Res.TarSize, Total: j.Res.TarSize, Unit: "bytes"})...)
	effs = append(effs, EffShare{Rec: r})
	m.LastBad = nil
	m.log.Info("verified and extracted: the stick can be unplugged", "phase", string(PhaseExtracted),
		"bundle", r.Name, "digest", r.Digest, "approval", j.Res.Approval)
	return append(effs, m.next()...)
}

func (m *Machine) loadDone(r *Record, j EvJobDone) []Effect {
	switch {
	case j.Stopped:
		return nil
	case j.Err != nil && Permanent(j.Err):
		m.backoff = 0
		m.log.Error("loading failed and cannot heal by retrying", "phase", string(PhaseFailed), "bundle", r.Name, "err", j.Err)
		return m.Move(r, PhaseFailed, Fault(ReasonLoadFailed, j.Err.Error()), r.Progress)
	case j.Err != nil:
		m.backoff = min(max(2*m.backoff, 5*time.Second), 5*time.Minute)
		reason := "loading failed, retrying in " + m.backoff.String() + ": " + errText(j.Err)
		m.log.Error("loading failed", "phase", string(PhaseLoading), "bundle", r.Name, "err", j.Err)
		return append(m.Move(r, PhaseLoading, Retrying(ReasonLoadFailed, reason), r.Progress), EffRetryIn{m.backoff})
	}
	m.backoff = 0
	effs := m.Move(r, PhaseLoaded, Condition{}, r.Progress)
	m.log.Info("loaded: every image is present and pinned", "phase", string(PhaseLoaded), "bundle", r.Name, "digest", r.Digest)
	return append(effs, m.gate(r)...)
}

// abandon gives up a fetch whose bytes filled the disk (or hit their
// bound): it is not retried into the same disk, which on a node is /var,
// shared with CRI-O and etcd. What it wrote goes; a restart, once there
// is room, fetches it again.
func (m *Machine) abandon(r *Record, err error) []Effect {
	reason := "abandoned: " + errText(err) + "; free some space in " + m.cfg.ExtractDir + ", then restart ferry to fetch it again"
	m.log.Error("fetch abandoned: the disk filled up", "phase", string(PhaseFailed), "bundle", r.Name, "err", err)
	effs := []Effect{EffRemove{m.incomingDir(r)}, EffRemove{meta.StagingDir(r.Dir)}, EffRemove{r.Dir}}
	return append(effs, m.Move(r, PhaseFailed, Fault(ReasonFetchAbandoned, reason), Progress{})...)
}

func (m *Machine) reject(r *Record, err error) []Effect {
	return m.rejectAs(r, refusalReason(err), strings.TrimPrefix(err.Error(), "bundle "+r.Name+": "))
}

// rejectAs rejects r for the machine reason given, saying message.
func (m *Machine) rejectAs(r *Record, reason, message string) []Effect {
	m.log.Error("bundle refused", "phase", string(PhaseRejected), "bundle", r.Name, "reason", reason, "message", message)
	m.LastBad = r
	return m.Move(r, PhaseRejected, Fault(reason, message), Progress{})
}

// incomingPath is where a fetched tar lands, under its own name so that
// messages about it read as they would for a stick.
func (m *Machine) IncomingPath(r *Record) string {
	return join(m.incomingDir(r), r.Name)
}

// incomingDir holds r's fetched tar and its .sha256.
func (m *Machine) incomingDir(r *Record) string {
	return join(m.cfg.StateDir, "incoming", strings.TrimPrefix(string(r.Digest), "sha256:"))
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
