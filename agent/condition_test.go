package agent

import (
	"encoding/json"
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
		{"waiting", PhaseExtracted, waiting(ReasonAwaitingApproval, "waiting for approval"), true},
		{"waiting, worded like a conflict", PhaseExtracted, waiting(ReasonPeersNotHolding, "conflict-free, waiting for node b"), true},
		{"progress", PhaseUpgrading, underway(ReasonUpgrading, "the cluster refuses nothing so far"), true},
		{"retrying", PhaseLoading, retrying(ReasonLoadFailed, "loading failed, retrying in 5s: crio is down"), true},
		{"peer holds another bundle", PhaseExtracted, fault(ReasonPeerHoldsOther, "conflict: node b holds another bundle"), false},
		{"peer holds another bundle, reworded", PhaseExtracted, fault(ReasonPeerHoldsOther, "node b holds a different bundle"), false},
		{"release refused", PhaseClusterReady, fault(ReasonReleaseRefused, "the cluster refuses the release: unsigned"), false},
		{"release refused, reworded", PhaseClusterReady, fault(ReasonReleaseRefused, "release not accepted by the cluster"), false},
		{"load failed", PhaseFailed, fault(ReasonLoadFailed, "image missing"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.cond.Healthy() != tc.healthy {
				t.Fatalf("%+v: Healthy() = %v", tc.cond, !tc.healthy)
			}
			m := machineIn(t, tc.phase)
			m.active = m.records["held"]
			r := m.active
			m.move(r, tc.phase, tc.cond, Progress{})
			s := m.status()
			if s.Healthy != tc.healthy || s.Reason != reasonOf(tc.phase, tc.cond) || s.Message != tc.cond.Message {
				t.Fatalf("status healthy %v, reason %q, message %q; want %v, %q, %q", s.Healthy, s.Reason, s.Message, tc.healthy, reasonOf(tc.phase, tc.cond), tc.cond.Message)
			}
			if ann := annotations(s)[AnnotationReason]; ann != tc.cond.Message {
				t.Fatalf("annotation reason %q, want %q", ann, tc.cond.Message)
			}
			// Reworded, the condition decides the same.
			before := m.peerStatus(s)
			tc.cond.Message = "something else entirely"
			m.move(r, tc.phase, tc.cond, Progress{})
			if got := m.status(); got.Healthy != tc.healthy {
				t.Fatalf("reworded: healthy %v", got.Healthy)
			}
			if after := m.peerStatus(m.status()); after != before {
				t.Fatalf("reworded: the peers are told %+v, before %+v", after, before)
			}
		})
	}
}

// A record saved now loads with its condition whole, and the status
// JSON carries it typed: its reason and kind beside its message, and no
// other copy of the message.
func TestStore_RecordsKeepTheirCondition(t *testing.T) {
	st, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := &Record{ID: "new", Name: "upgrade-4.13.7-x86_64.tar", Phase: PhaseExtracted, Retirement: RetirementDone,
		Condition: waiting(ReasonPeersNotHolding, "waiting for node-b to hold the bundle")}
	if err := st.Save(r); err != nil {
		t.Fatal(err)
	}
	recs, err := st.Load()
	if err != nil || len(recs) != 1 || recs[0].Condition != r.Condition || recs[0].Retirement != RetirementDone {
		t.Fatalf("loaded %+v, %v", recs, err)
	}
	b, err := json.Marshal(Status{Bundles: []Record{*r}})
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Bundles []map[string]json.RawMessage
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	var cond Condition
	if err := json.Unmarshal(got.Bundles[0]["condition"], &cond); err != nil || cond != r.Condition {
		t.Fatalf("status JSON %s: condition %+v, %v", b, cond, err)
	}
	for _, old := range []string{"reason", "retiring", "retired", "unpinned"} {
		if _, ok := got.Bundles[0][old]; ok {
			t.Errorf("status JSON %s still has the record's %q", b, old)
		}
	}
}
