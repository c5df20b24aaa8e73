package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
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
			if s.Healthy != tc.healthy || s.Reason != tc.cond.Message {
				t.Fatalf("status healthy %v, reason %q; want %v, %q", s.Healthy, s.Reason, tc.healthy, tc.cond.Message)
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

// A record written before the typed condition (a "reason" text only)
// loads with the condition its words meant, and so with the same health.
func TestStore_OldRecordsLoadWithTheConditionTheirWordsMeant(t *testing.T) {
	for _, tc := range []struct {
		phase  Phase
		reason string
		want   Condition
	}{
		{PhaseLoaded, "", Condition{}},
		{PhaseExtracted, "waiting for approval: add its digest sha256:ab to approved_digests and restart ferry", waiting(ReasonAwaitingApproval, "")},
		{PhaseExtracted, "conflict: node b holds another bundle (4.13.8, sha256:2222): remove the second stick", fault(ReasonPeerHoldsOther, "")},
		{PhaseExtracted, "node b refuses this bundle (rejected x: not approved): every node must hold it", waiting(ReasonPeerRefuses, "")},
		{PhaseExtracted, "waiting for node-b, node-c to hold the bundle", waiting(ReasonPeersNotHolding, "")},
		{PhaseLoading, "loading failed, retrying in 5s: crio is down", retrying(ReasonLoadFailed, "")},
		{PhaseClusterReady, "the cluster refuses the release: The update cannot be verified", fault(ReasonReleaseRefused, "")},
		{PhaseUpgrading, "waiting for the cluster version operator to start: RetrievePayload", waiting(ReasonUpgradePending, "")},
		{PhaseUpgrading, "Working towards 4.13.7", underway(ReasonUpgrading, "")},
		{PhaseUpgraded, "cleaning up: removing the bundle's files, registry and mirror (its images stay pinned)", underway(ReasonCleaningUp, "")},
		{PhaseUpgraded, "cleaning up after the upgrade failed, retrying in 30s: busy", retrying(ReasonCleanupFailed, "")},
		{PhaseUpgraded, "waiting: pool worker is paused; the machine config operator updates this node once it is unpaused", waiting(ReasonPoolPaused, "")},
		{PhaseUpgraded, "waiting for the machine config operator to update this node (state Working, a → b)", waiting(ReasonNodeUpdating, "")},
		{PhaseFailed, "abandoned: no space left on device; free some space", fault(ReasonFetchAbandoned, "")},
		{PhaseFailed, "image quay.io/x is not in the bundle", fault(ReasonLoadFailed, "")},
		{PhaseRejected, "sha256 mismatch (got 3f…, want 9a…)", fault(ReasonRefused, "")},
		{PhaseConflict, "upgrade-4.13.8-x86_64.tar differs from the bundle this node already holds", fault(ReasonBundlesDiffer, "")},
		{PhaseDetected, "something an older version said", waiting(ReasonUnclassified, "")},
	} {
		dir := t.TempDir()
		st, err := OpenStore(dir)
		if err != nil {
			t.Fatal(err)
		}
		old := `{"id": "old", "name": "upgrade-4.13.7-x86_64.tar", "origin": "stick", "phase": "` + string(tc.phase) +
			`", "reason": ` + jsonString(tc.reason) + `, "progress": {"done": 0, "total": 0, "unit": ""}, "times": {}, "approval": "digest"}`
		if err := os.WriteFile(filepath.Join(dir, "bundles", "old.json"), []byte(old), 0o600); err != nil {
			t.Fatal(err)
		}
		recs, err := st.Load()
		if err != nil || len(recs) != 1 {
			t.Fatalf("%s %q: %d records, %v", tc.phase, tc.reason, len(recs), err)
		}
		want := tc.want
		if want != (Condition{}) {
			want.Message = tc.reason
		}
		if got := recs[0].Condition; got != want {
			t.Errorf("%s %q: condition %+v, want %+v", tc.phase, tc.reason, got, want)
		}
		if recs[0].Approval != "digest" {
			t.Errorf("approval %q", recs[0].Approval)
		}
	}
}

// A record saved now loads with its condition whole, and still says its
// message under "reason" (ferry status --json readers, an older ferry).
func TestStore_RecordsKeepTheirConditionAndReason(t *testing.T) {
	st, err := OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	r := &Record{ID: "new", Name: "upgrade-4.13.7-x86_64.tar", Phase: PhaseExtracted,
		Condition: waiting(ReasonPeersNotHolding, "waiting for node-b to hold the bundle")}
	if err := st.Save(r); err != nil {
		t.Fatal(err)
	}
	recs, err := st.Load()
	if err != nil || len(recs) != 1 || recs[0].Condition != r.Condition {
		t.Fatalf("loaded %+v, %v", recs, err)
	}
	b, err := json.Marshal(Status{Bundles: []Record{*r}})
	if err != nil {
		t.Fatal(err)
	}
	var legacy struct {
		Bundles []struct{ Reason string }
	}
	if err := json.Unmarshal(b, &legacy); err != nil || legacy.Bundles[0].Reason != r.Condition.Message {
		t.Fatalf("status JSON %s: %+v, %v", b, legacy, err)
	}
	if !strings.Contains(string(b), `"condition":{"kind":"Waiting","reason":"PeersNotHolding"`) {
		t.Fatalf("status JSON %s lacks the condition", b)
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// A record written before Retirement (three booleans) loads in the
// sub-phase they meant, and a record saved now round-trips its state and
// still carries the booleans an older ferry reads.
func TestStore_OldRetirementBooleansLoadAsTheirSubPhase(t *testing.T) {
	for _, tc := range []struct {
		flags string
		want  Retirement
	}{
		{``, RetirementNone},
		{`"retiring": true,`, RetirementStarted},
		{`"retiring": true, "retired": true,`, RetirementDone},
		{`"retired": true,`, RetirementDone},
		{`"retiring": true, "retired": true, "unpinned": true, "retained": false,`, RetirementUnpinned},
	} {
		dir := t.TempDir()
		st, err := OpenStore(dir)
		if err != nil {
			t.Fatal(err)
		}
		old := `{"id": "old", "name": "upgrade-4.13.7-x86_64.tar", "origin": "stick", "phase": "upgraded", ` + tc.flags +
			` "progress": {"done": 0, "total": 0, "unit": ""}, "times": {}}`
		if err := os.WriteFile(filepath.Join(dir, "bundles", "old.json"), []byte(old), 0o600); err != nil {
			t.Fatal(err)
		}
		recs, err := st.Load()
		if err != nil || len(recs) != 1 {
			t.Fatalf("%s: %d records, %v", tc.flags, len(recs), err)
		}
		if got := recs[0].Retirement; got != tc.want {
			t.Errorf("%s: retirement %v, want %v", tc.flags, got, tc.want)
		}

		// Saved again: the state by name, and the booleans it means.
		must(t, st.Save(recs[0]))
		b, err := os.ReadFile(filepath.Join(dir, "bundles", "old.json"))
		must(t, err)
		var legacy struct {
			Retirement                  string
			Retiring, Retired, Unpinned bool
		}
		must(t, json.Unmarshal(b, &legacy))
		if legacy.Retirement != tc.want.String() || legacyRetirement(legacy.Retiring, legacy.Retired, legacy.Unpinned) != tc.want {
			t.Errorf("%s: saved as %s", tc.flags, b)
		}
		again, err := st.Load()
		if err != nil || again[0].Retirement != tc.want {
			t.Errorf("%s: reloaded %v, %v", tc.flags, again[0].Retirement, err)
		}
	}
	var r Record
	if err := json.Unmarshal([]byte(`{"id": "x", "retirement": "gone"}`), &r); err == nil {
		t.Error("an unknown retirement state loaded")
	}
}
