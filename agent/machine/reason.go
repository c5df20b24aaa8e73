package machine

import (
	"errors"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ferry-edge/ferry/bundle/meta"
	"github.com/ferry-edge/ferry/pull/pullspec"
)

// MaxReason bounds a reason (and every other piece of text from a stick,
// a bundle or the cluster) that leaves the node: the STATUS= line, the
// Node's annotations, what the peers are told. ferry's own longest
// reasons (no room: the sizes, the thresholds and what to free) fit; a
// longer one (a CRI-O error quoted whole) loses its middle, so that what
// failed (its start) and the fix (its end) both stay.
const MaxReason = 1024

// maxScanned bounds the text looked at: anything longer is cut there
// first (a reason is never that long unless something is wrong).
const maxScanned = 64 << 10

// maxLine bounds the whole STATUS= line, which joins a bundle's name and a
// reason.
const MaxLine = 2 * MaxReason

// SanitizeReason makes s fit to publish (see MaxReason): one line of
// printable text, at most MaxReason bytes, its middle cut out with an
// ellipsis when longer.
func SanitizeReason(s string) string { return SanitizeText(s, MaxReason) }

// sanitizeText makes s one line of printable text of at most max bytes:
// newlines, tabs and other whitespace runs become one space, control
// and other unprintable characters (bidi overrides, invalid UTF-8) are
// dropped, and from a longer text the middle is cut out at character
// boundaries and replaced by "…" (two fifths of it kept before, the rest
// after). It is idempotent.
func SanitizeText(s string, max int) string {
	var b strings.Builder
	b.Grow(min(len(s), max))
	space := false
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		i += n
		switch {
		case r == utf8.RuneError && n <= 1:
			continue
		case unicode.IsSpace(r):
			space = b.Len() > 0
			continue
		case !unicode.IsPrint(r):
			continue
		}
		if space {
			b.WriteByte(' ')
			space = false
		}
		b.WriteRune(r)
		if b.Len() > maxScanned {
			break
		}
	}
	out := b.String()
	if len(out) <= max {
		return out
	}
	const ellipsis = "…"
	head := (max - len(ellipsis)) * 2 / 5
	for head > 0 && !utf8.RuneStart(out[head]) {
		head--
	}
	tail := len(out) - (max - len(ellipsis) - head)
	for tail < len(out) && !utf8.RuneStart(out[tail]) {
		tail++
	}
	return strings.TrimRight(out[:head], " ") + ellipsis + strings.TrimLeft(out[tail:], " ")
}

// Reasons of the states that need no condition to explain them: the
// phase says it all. Status.Reason is one of these when the shown
// bundle's condition is zero, so that every state a node can be in has a
// machine reason (the condition reasons are in condition.go).
const (
	ReasonWaitingForStick = "WaitingForStick" // idle: no bundle held
	ReasonVerifying       = "Verifying"
	ReasonFetching        = "Fetching"
	ReasonExtracted       = "Extracted"
	ReasonLoading         = "Loading"
	ReasonLoaded          = "Loaded"
	ReasonClusterReady    = "ClusterReady"
	ReasonUpgraded        = "Upgraded"
	ReasonCleaned         = "Cleaned"
	// The peers' setup faults, shown when no bundle is bad.
	ReasonPeerTokenMissing = "PeerTokenMissing" // peers configured, no peer.token_file
	ReasonPeerRefusesNode  = "PeerRefusesNode"  // a peer refuses this node's token
)

// phaseReasons is each phase's reason when its record has no condition;
// the terminal ones always have one, and these only stand in.
var phaseReasons = map[Phase]string{
	PhaseIdle:         ReasonWaitingForStick,
	PhaseDetected:     ReasonVerifying,
	PhaseFetching:     ReasonFetching,
	PhaseExtracted:    ReasonExtracted,
	PhaseLoading:      ReasonLoading,
	PhaseLoaded:       ReasonLoaded,
	PhaseClusterReady: ReasonClusterReady,
	PhaseUpgrading:    ReasonUpgrading,
	PhaseUpgraded:     ReasonUpgraded,
	PhaseCleaned:      ReasonCleaned,
	PhaseRejected:     ReasonRefused,
	PhaseFailed:       ReasonLoadFailed,
	PhaseConflict:     ReasonBundlesDiffer,
}

// reasonOf is the machine reason of a bundle in phase p with condition
// c: the condition's, else the phase's.
func ReasonOf(p Phase, c Condition) string {
	if c.Reason != "" {
		return c.Reason
	}
	return phaseReasons[p]
}

// The reasons of a registry pull's states, shown while the pull is what
// the node does (and in the pulling node's UpgradeBundle entry).
const (
	ReasonPullNotStarted = "PullNotStarted"
	ReasonPullWaiting    = "PullWaitingForWindow"
	ReasonPulling        = "Pulling"
	ReasonPullRetrying   = "PullRetrying"
	ReasonPullHanding    = "PullHandingOver"
	ReasonPulled         = "Pulled"
	ReasonPullFailed     = "PullFailed"
)

var PullReasons = map[string]string{
	pullspec.StateNotStarted: ReasonPullNotStarted,
	pullspec.StateWaiting:    ReasonPullWaiting,
	pullspec.StateFetching:   ReasonPulling,
	pullspec.StateRetrying:   ReasonPullRetrying,
	pullspec.StateHanding:    ReasonPullHanding,
	pullspec.StateDone:       ReasonPulled,
	pullspec.StateFailed:     ReasonPullFailed,
}

// Why a bundle is rejected, by the refusal's cause; ReasonRefused when
// none of these.
const (
	ReasonDigestMismatch    = "DigestMismatch"    // its sha256 is not the one its file names
	ReasonWrongArchitecture = "WrongArchitecture" // built for another CPU than this node's
	ReasonNotApproved       = "NotApproved"       // the node's approval refuses it
	ReasonNotEnoughSpace    = "NotEnoughSpace"    // no room for it (or the disk filled while it was written)
	ReasonSignaturePolicy   = "SignaturePolicyRefuses"
	ReasonInvalidBundle     = "InvalidBundle"    // it breaks the bundle format, or the stick holds an unsafe file
	ReasonPreflightRefused  = "PreflightRefused" // the cluster cannot take this upgrade
)

// refusalReason is the machine reason of a refusal, from its error chain.
func refusalReason(err error) string {
	for _, c := range []struct {
		err    error
		reason string
	}{
		{meta.ErrMismatch, ReasonDigestMismatch},
		{meta.ErrWrongArch, ReasonWrongArchitecture},
		{meta.ErrNotApproved, ReasonNotApproved},
		{meta.ErrNoSpace, ReasonNotEnoughSpace},
		{meta.ErrPolicy, ReasonSignaturePolicy},
		{meta.ErrInvalid, ReasonInvalidBundle},
		{ErrPreflight, ReasonPreflightRefused},
	} {
		if errors.Is(err, c.err) {
			return c.reason
		}
	}
	if meta.DiskFilled(err) {
		return ReasonNotEnoughSpace
	}
	return ReasonRefused
}

// ErrPreflight marks a bundle the cluster would refuse to upgrade to,
// found before it was read and shared.
var ErrPreflight = errors.New("the cluster cannot take this upgrade")
