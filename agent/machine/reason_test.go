package machine

import (
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestSanitizeReason(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"plain", "digest sha256:3f… is not approved", "digest sha256:3f… is not approved"},
		{"newlines collapse", "first line\nsecond\r\n\tthird", "first line second third"},
		{"control characters dropped", "a\x1b[31mred\x1b[0m\x00b\x07", "a[31mred[0mb"},
		{"a forged systemd field", "bad\nSTATUS=all good\nREADY=1", "bad STATUS=all good READY=1"},
		{"bidi override dropped", "upgrade-\u202etar.exe", "upgrade-tar.exe"},
		{"invalid UTF-8 dropped", "a\xff\xfeb", "ab"},
		{"leading and trailing space", "\n  reason \n", "reason"},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SanitizeReason(tt.in); got != tt.want {
				t.Errorf("SanitizeReason(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestSanitizeReason_KeepsWhatFailedAndTheFix(t *testing.T) {
	in := "images not loaded: quay.io/x@sha256:1 (first error: " + strings.Repeat("CRI-O says something long. ", 100) + "): the bundle is damaged; make it again"
	got := SanitizeReason(in)
	if len(got) > MaxReason || !strings.HasPrefix(got, "images not loaded: quay.io/x@sha256:1") || !strings.HasSuffix(got, "; make it again") || !strings.Contains(got, "…") {
		t.Errorf("SanitizeReason = %q", got)
	}
}

func TestSanitizeReason_BoundsWithAnEllipsis(t *testing.T) {
	for _, in := range []string{
		strings.Repeat("x", 10000),
		strings.Repeat("é", 1000), // a cut inside a character
		strings.Repeat("ab\n", 5000),
	} {
		got := SanitizeReason(in)
		if len(got) > MaxReason || !strings.Contains(got, "…") || !utf8.ValidString(got) {
			t.Errorf("SanitizeReason(%d bytes) = %d bytes %q", len(in), len(got), got)
		}
		if again := SanitizeReason(got); again != got {
			t.Errorf("not idempotent: %q → %q", got, again)
		}
	}
	exact := strings.Repeat("y", MaxReason)
	if got := SanitizeReason(exact); got != exact {
		t.Errorf("a reason of exactly MaxReason bytes was changed to %q", got)
	}
}

func FuzzSanitizeReason(f *testing.F) {
	f.Add("a\nb\x00c")
	f.Add(strings.Repeat("\u202e", 200))
	f.Fuzz(func(t *testing.T, s string) {
		got := SanitizeReason(s)
		if len(got) > MaxReason || !utf8.ValidString(got) {
			t.Fatalf("%q → %q", s, got)
		}
		for _, r := range got {
			if r != ' ' && (!unicode.IsPrint(r) || unicode.IsSpace(r)) {
				t.Fatalf("%q → %q holds %U", s, got, r)
			}
		}
		if SanitizeReason(got) != got {
			t.Fatalf("not idempotent on %q", s)
		}
	})
}

// machineReason is what a machine reason looks like: one CamelCase word.
var machineReason = regexp.MustCompile(`^[A-Z][a-z]+([A-Z][a-z]*)*$`)

// Every phase a node can show has a machine reason, its own word with no
// condition, and a condition's reason when there is one.
func TestStatus_EveryPhaseHasAMachineReason(t *testing.T) {
	want := map[Phase]string{PhaseIdle: ReasonWaitingForStick, PhaseDetected: ReasonVerifying, PhaseFetching: ReasonFetching,
		PhaseExtracted: ReasonExtracted, PhaseLoading: ReasonLoading, PhaseLoaded: ReasonLoaded, PhaseClusterReady: ReasonClusterReady,
		PhaseUpgrading: ReasonUpgrading, PhaseUpgraded: ReasonUpgraded, PhaseCleaned: ReasonWaitingForStick,
		PhaseRejected: ReasonRefused, PhaseFailed: ReasonLoadFailed, PhaseConflict: ReasonBundlesDiffer}
	for p, reason := range want {
		m := machineIn(t, p)
		if p == PhaseUpgraded || p == PhaseFailed {
			m.done = m.Records["held"]
			m.LastBad = nil
			if p == PhaseFailed {
				m.LastBad = m.Records["held"]
			}
		}
		s := m.NodeStatus()
		if s.Phase != string(p) && !(p == PhaseCleaned && s.Phase == string(PhaseIdle)) {
			t.Errorf("%s: status shows phase %s", p, s.Phase)
		}
		if s.Reason != reason || !machineReason.MatchString(s.Reason) {
			t.Errorf("%s: reason %q, want %q", p, s.Reason, reason)
		}
		if r := m.Records["held"]; r != nil && p.Active() {
			m.Move(r, p, WaitingFor(ReasonPeersUnheard, "waiting to hear from the peers"), Progress{})
			if s := m.NodeStatus(); s.Reason != ReasonPeersUnheard || s.Message != "waiting to hear from the peers" {
				t.Errorf("%s with a condition: reason %q, message %q", p, s.Reason, s.Message)
			}
		}
	}
	for _, r := range slices.Collect(maps.Values(phaseReasons)) {
		if !machineReason.MatchString(r) {
			t.Errorf("phase reason %q is not CamelCase", r)
		}
	}
	for st, r := range PullReasons {
		if !machineReason.MatchString(r) {
			t.Errorf("pull %s: reason %q is not CamelCase", st, r)
		}
	}
}

// A node whose peers' setup is at fault says so in its reason, unless the
// bundle it shows is at fault itself.
func TestStatus_PeerSetupFaultsHaveTheirReason(t *testing.T) {
	m := machineIn(t, PhaseLoaded)
	m.peers = []string{"10.0.0.2:8090"}
	if s := m.NodeStatus(); s.Healthy || s.Reason != ReasonPeerTokenMissing {
		t.Fatalf("no token: healthy %v, reason %q", s.Healthy, s.Reason)
	}
	r := m.Records["held"]
	m.Move(r, PhaseLoaded, Fault(ReasonPeerHoldsOther, "conflict: node b holds another bundle"), Progress{})
	if s := m.NodeStatus(); s.Reason != ReasonPeerHoldsOther {
		t.Fatalf("a faulty bundle and no token: reason %q", s.Reason)
	}
}
