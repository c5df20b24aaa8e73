package machine

import (
	"errors"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
	"github.com/ferry-edge/ferry/peer/wire"
	"github.com/ferry-edge/ferry/pull/pullspec"
)

// Status is what `ferry status` shows.
type Status struct {
	Node    string        `json:"node"`
	Phase   string        `json:"phase"` // the active bundle's phase, or "idle"
	Bundle  string        `json:"bundle,omitempty"`
	Version string        `json:"version,omitempty"`
	Digest  digest.Digest `json:"digest,omitempty"`
	Release string        `json:"release,omitempty"`
	// Path is, for a bundle of several releases, each hop's version.
	Path     []string  `json:"path,omitempty"`
	Progress *Progress `json:"progress,omitempty"`
	// Reason is why the node is where it is, for machines: a stable
	// CamelCase word (the Reason constants), never empty; Message says
	// it to a person, with what to do.
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
	// ClusterMessage is the cluster version operator's progress line.
	ClusterMessage string              `json:"clusterMessage,omitempty"`
	Error          string              `json:"error,omitempty"` // the newest refusal or conflict
	Times          map[Phase]time.Time `json:"times,omitempty"`
	Healthy        bool                `json:"healthy"`
	Notice         string              `json:"notice,omitempty"`    // a passing remark, e.g. a stick that holds the bundle already here
	Warnings       []string            `json:"warnings,omitempty"`  // lasting setup faults that do not stop the node (Deps.Warnings)
	Preflight      []string            `json:"preflight,omitempty"` // the cluster's preflight warnings on the bundle
	// SignaturePolicy are this node's signature policy's warnings on the
	// bundle: images it loads by digest only (Record.SignaturePolicy).
	SignaturePolicy []string `json:"signaturePolicy,omitempty"`
	// HoldingBack says why the bulk work is slowed while the node is
	// under pressure ("io pressure 23%"); "" at full speed.
	HoldingBack string `json:"holding_back,omitempty"`
	// ApprovalOff: the config says approval = "off" (any bundle whose
	// sha256 checks is loaded).
	ApprovalOff bool `json:"approvalOff,omitempty"`
	// Pull is registry mode's pull under way (ferry load --release).
	Pull    *pullspec.Status `json:"pull,omitempty"`
	Line    string           `json:"line"` // the systemd STATUS= line
	Bundles []Record         `json:"bundles,omitempty"`
}

// report is what the status says, decided from the machine's state with
// no text: the records shown (copies, so that it can be rendered later)
// and the node's health. Its words come only when it is rendered (text).
type report struct {
	node   string
	notice string
	// shown is the bundle the status is about: the active one, else the
	// last upgrade (until the next bundle or a refusal); nil when idle.
	shown *Record
	// bad is the newest refusal or conflict; with no shown bundle, it is
	// what the status is about.
	bad     *Record
	healthy bool
	// A setup fault of the peers, shown when no bundle is bad: peers
	// configured but no token (peersClosed), or a peer that refuses this
	// node's token (refusedBy, refusal).
	peersClosed bool
	refusedBy   string
	refusal     error
	approvalOff bool
	warnings    []string
}

// report decides the node's status from the machine's state.
func (m *Machine) report() report {
	rep := report{node: m.cfg.NodeName, notice: m.notice, healthy: true, approvalOff: m.cfg.ApprovalOff, warnings: m.warnings}
	switch {
	case m.Active != nil:
		rep.shown = m.Active.Clone()
	case m.LastBad == nil && m.done != nil:
		rep.shown = m.done.Clone()
	}
	if m.LastBad != nil {
		rep.bad = m.LastBad.Clone()
	}
	// Unhealthy: a refusal or conflict with no bundle held, or a shown
	// bundle whose condition is a fault.
	if rep.shown == nil && rep.bad != nil || rep.shown != nil && !rep.shown.Condition.Healthy() {
		rep.healthy = false
	}
	if rep.bad != nil {
		return rep
	}
	if len(m.peers) > 0 && m.cfg.PeersClosed {
		rep.peersClosed, rep.healthy = true, false
		return rep
	}
	// A peer that refuses our token is a config mistake to show here; an
	// unreachable one may just be down.
	for _, p := range m.peers {
		if err := m.view.Statuses[p].Err; err != nil && errors.Is(err, wire.ErrUnauthorized) {
			rep.refusedBy, rep.refusal, rep.healthy = p, err, false
			break
		}
	}
	return rep
}

// NodeStatus builds the node's status from the machine's state.
func (m *Machine) NodeStatus() Status {
	s := m.report().Text()
	for _, r := range m.Records {
		c := *r.Clone()
		c.Name, c.Condition.Message, c.Message = SanitizeReason(c.Name), SanitizeReason(c.Condition.Message), SanitizeReason(c.Message)
		s.Bundles = append(s.Bundles, c)
	}
	return s
}

// text renders rep in words: the status, less its list of bundles.
func (rep report) Text() Status {
	s := Status{Node: rep.node, Phase: string(PhaseIdle), Reason: ReasonWaitingForStick, Healthy: rep.healthy, Notice: rep.notice}
	if r := rep.shown; r != nil {
		s.Phase, s.Bundle, s.Digest, s.Times = string(r.Phase), r.Name, r.Digest, r.Times
		s.Reason, s.Message, s.ClusterMessage = ReasonOf(r.Phase, r.Condition), r.Condition.Message, r.Message
		s.Preflight = r.Warnings
		for _, w := range r.SignaturePolicy {
			s.SignaturePolicy = append(s.SignaturePolicy, SanitizeReason(w))
		}
		if r.Metadata != nil {
			s.Version, s.Release = r.Metadata.Version, r.Metadata.Release
			if len(r.Metadata.Path) > 1 {
				for _, h := range r.Metadata.Hops() {
					s.Path = append(s.Path, SanitizeReason(h.Version))
				}
			}
		}
		if r.Progress.Total > 0 {
			p := r.Progress
			s.Progress = &p
		}
	}
	switch b := rep.bad; {
	case b != nil:
		s.Error = string(b.Phase) + " " + b.Name + ": " + b.Condition.Message
		if rep.shown == nil {
			s.Phase, s.Bundle, s.Digest, s.Times = string(b.Phase), b.Name, b.Digest, b.Times
			s.Reason, s.Message = ReasonOf(b.Phase, b.Condition), b.Condition.Message
			s.Preflight = b.Warnings // found beside a refusal: shown with it
		}
	case rep.peersClosed:
		s.Reason = peerFault(rep.shown, s.Reason, ReasonPeerTokenMissing)
		s.Error = "peers are configured but there is no peer.token_file: this node serves no bundle to them and they refuse it; set the same token_file on every node (or peer.open = true on a closed network)"
	case rep.refusedBy != "":
		s.Reason = peerFault(rep.shown, s.Reason, ReasonPeerRefusesNode)
		s.Error = "peer " + rep.refusedBy + " refuses this node: " + errText(rep.refusal)
	}
	// What a stick, a bundle or the cluster wrote leaves the node (the
	// STATUS= line, annotations, peers) only sanitised and bounded.
	for _, p := range []*string{&s.Bundle, &s.Message, &s.Error, &s.ClusterMessage, &s.Version, &s.Release} {
		*p = SanitizeReason(*p)
	}
	s.Line = statusLine(s)
	if s.Phase == string(PhaseIdle) && s.Error != "" {
		s.Line += " — " + s.Error
	}
	if s.ApprovalOff = rep.approvalOff; s.ApprovalOff {
		s.Line += " — " + ApprovalOffWarning
	}
	// The warnings themselves are said once, on lines of their own in
	// ferry status and in the UpgradeBundle's warnings; the line that
	// goes to systemctl status and the journal only points there.
	if len(rep.warnings) > 0 {
		s.Warnings = rep.warnings
		s.Line += " — " + warningsPointer(len(rep.warnings))
	}
	s.Line = SanitizeText(s.Line, MaxLine)
	return s
}

// peerFault is the reason of a node whose peers' setup is at fault:
// that fault, unless the shown bundle's own fault says more.
func peerFault(shown *Record, reason, fault string) string {
	if shown != nil && !shown.Condition.Healthy() {
		return reason
	}
	return fault
}

// statusLine is the one line a technician reads in `systemctl status`.
func statusLine(s Status) string {
	name := s.Bundle
	switch Phase(s.Phase) {
	case PhaseIdle, PhaseCleaned:
		return "waiting for an upgrade stick"
	case PhaseDetected:
		if s.Message != "" {
			return "waiting: " + name + ": " + s.Message
		}
		if p := s.Progress; p != nil && p.Total > 0 {
			return "verifying " + name + ": " + itoa(100*p.Done/p.Total) + "% (" + ofTotal(p.Done, p.Total) + ")"
		}
		return "verifying " + name
	case PhaseFetching:
		if p := s.Progress; p != nil && p.Total > 0 {
			return "fetching " + name + " from peers: " + itoa(100*p.Done/p.Total) + "% (" + ofTotal(p.Done, p.Total) + ")"
		}
		return "fetching " + name + " from peers"
	case PhaseExtracted:
		line := "extracted " + name + " (" + sha256digest.Short(s.Digest) + "): the stick can be unplugged"
		if s.Message != "" {
			line += " — " + s.Message
		}
		return line
	case PhaseLoading:
		line := "loading " + s.Version
		if p := s.Progress; p != nil {
			line += ": " + itoa(p.Done) + "/" + itoa(p.Total) + " images"
		}
		if s.Message != "" {
			line += " — " + s.Message
		}
		return line
	case PhaseLoaded:
		n := int64(0)
		if s.Progress != nil {
			n = s.Progress.Total
		}
		return "loaded " + s.Version + ": " + pinned(s, n) + " (" + sha256digest.Short(s.Digest) + ")"
	case PhaseClusterReady:
		n := int64(0)
		if s.Progress != nil {
			n = s.Progress.Total
		}
		line := "cluster-ready " + s.Version + ": every node is loaded, " + pinned(s, n) + " (" + sha256digest.Short(s.Digest) + ")"
		if s.Message != "" {
			line += " — " + s.Message
		}
		return line
	case PhaseUpgrading:
		line := "upgrading to " + s.Version
		if s.ClusterMessage != "" {
			line += ": " + s.ClusterMessage
		}
		if s.Message != "" {
			line += " — " + s.Message
		}
		return line
	case PhaseUpgraded:
		if s.Message != "" {
			return "upgraded to " + s.Version + " — " + s.Message
		}
		return "upgraded to " + s.Version + " (" + sha256digest.Short(s.Digest) + "): its images stay pinned until the next upgrade; waiting for the next upgrade stick"
	case PhaseRejected:
		return "rejected " + name + ": " + s.Message
	case PhaseConflict:
		return "conflict: " + s.Message
	case PhaseFailed:
		return "failed " + name + ": " + s.Message
	}
	return s.Phase + " " + name
}

// pinned says how many images are pinned: for a path, every hop's.
func pinned(s Status, n int64) string {
	if len(s.Path) > 1 {
		return itoa(n) + " images pinned, every hop's (" + strings.Join(s.Path, " → ") + ")"
	}
	return itoa(n) + " images pinned"
}

// ofTotal formats done/total in the unit that suits total: "6.7/16.0 GiB".
func ofTotal(done, total int64) string {
	unit, div := "GiB", float64(1<<30)
	if total < 1<<30 {
		unit, div = "MiB", 1<<20
	}
	return oneDecimal(float64(done)/div) + "/" + oneDecimal(float64(total)/div) + " " + unit
}
