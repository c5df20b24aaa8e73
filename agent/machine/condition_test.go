package machine

import (
	"testing"
)

// TestCondition_HealthFollowsTheKindNotTheWords: health, the Node
// annotation and what the peers are told follow a condition's kind; a
// message reworded (or one that happens to begin with "conflict") changes
// none of them.
func TestCondition_HealthFollowsTheKindNotTheWords(t *testing.T) {
	for _, tc := range []struct {
		name    string
		phase   Phase
		cond    Condition
		healthy bool
	}{
		{"none", PhaseLoading, Condition{}, true},
		{"waiting", PhaseExtracted, WaitingFor(ReasonAwaitingApproval, "waiting for approval"), true},
		{"waiting, worded like a conflict", PhaseExtracted, WaitingFor(ReasonPeersNotHolding, "conflict-free, waiting for node b"), true},
		{"progress", PhaseUpgrading, Underway(ReasonUpgrading, "the cluster refuses nothing so far"), true},
		{"retrying", PhaseLoading, Retrying(ReasonLoadFailed, "loading failed, retrying in 5s: crio is down"), true},
		{"peer holds another bundle", PhaseExtracted, Fault(ReasonPeerHoldsOther, "conflict: node b holds another bundle"), false},
		{"peer holds another bundle, reworded", PhaseExtracted, Fault(ReasonPeerHoldsOther, "node b holds a different bundle"), false},
		{"release refused", PhaseClusterReady, Fault(ReasonReleaseRefused, "the cluster refuses the release: unsigned"), false},
		{"release refused, reworded", PhaseClusterReady, Fault(ReasonReleaseRefused, "release not accepted by the cluster"), false},
		{"load failed", PhaseFailed, Fault(ReasonLoadFailed, "image missing"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.cond.Healthy() != tc.healthy {
				t.Fatalf("%+v: Healthy() = %v", tc.cond, !tc.healthy)
			}
			m := machineIn(t, tc.phase)
			m.Active = m.Records["held"]
			r := m.Active
			m.Move(r, tc.phase, tc.cond, Progress{})
			s := m.NodeStatus()
			if s.Healthy != tc.healthy || s.Reason != ReasonOf(tc.phase, tc.cond) || s.Message != tc.cond.Message {
				t.Fatalf("status healthy %v, reason %q, message %q; want %v, %q, %q", s.Healthy, s.Reason, s.Message, tc.healthy, ReasonOf(tc.phase, tc.cond), tc.cond.Message)
			}
			if ann := Annotations(s)[AnnotationReason]; ann != tc.cond.Message {
				t.Fatalf("annotation reason %q, want %q", ann, tc.cond.Message)
			}
			// Reworded, the condition decides the same.
			before := m.StatusForPeers(s)
			tc.cond.Message = "something else entirely"
			m.Move(r, tc.phase, tc.cond, Progress{})
			if got := m.NodeStatus(); got.Healthy != tc.healthy {
				t.Fatalf("reworded: healthy %v", got.Healthy)
			}
			if after := m.StatusForPeers(m.NodeStatus()); after != before {
				t.Fatalf("reworded: the peers are told %+v, before %+v", after, before)
			}
		})
	}
}
