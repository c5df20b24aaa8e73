package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/peer"
)

const (
	heldDigest  = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	otherDigest = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

var allPhases = []Phase{PhaseIdle, PhaseDetected, PhaseFetching, PhaseExtracted, PhaseLoading, PhaseLoaded,
	PhaseClusterReady, PhaseUpgrading, PhaseUpgraded, PhaseCleaned, PhaseRejected, PhaseFailed, PhaseConflict}

// machineIn is a machine whose one bundle is in phase p (PhaseIdle: none).
func machineIn(t *testing.T, p Phase) *machine {
	// A node with the default config but for its name, dirs and hook.
	s := Settings{NodeName: "node-a", StateDir: t.TempDir(), ExtractDir: t.TempDir(), OnReady: []string{"true"},
		Schedule: "Automatic", KeepRunningRelease: true, PeersClosed: true}
	clock := time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC)
	m := newMachine(s, bundle.Policy{Arch: "x86_64"}, Wiring{Media: true, Loader: true,
		Log: slog.New(slog.DiscardHandler), Now: func() time.Time { return clock }})
	if p == PhaseIdle {
		return m
	}
	r := heldRecord()
	m.move(r, p, Condition{}, Progress{})
	switch {
	case p.Active():
		m.active = r
	case p == PhaseRejected || p == PhaseConflict:
		m.lastBad = r
	}
	return m
}

// heldRecord is the held bundle's record, in no phase yet.
func heldRecord() *Record {
	meta := &bundle.Metadata{Version: "4.13.7", Arch: "x86_64", Release: "quay.io/r@" + heldDigest}
	return &Record{ID: "held", Digest: heldDigest, Name: "upgrade-4.13.7-x86_64.tar", Metadata: meta,
		Origin: OriginStick, Plugged: true, Dir: "/nonexistent/4.13.7-x86_64"}
}

// events is one of each kind of event, as it would reach a node.
func events(reply ReplyID) map[string]event {
	meta := &bundle.Metadata{Version: "4.13.8", Arch: "x86_64"}
	same := &bundle.Metadata{Version: "4.13.7", Arch: "x86_64"}
	return map[string]event{
		"stick plugged":        evDevice{DeviceEvent{Action: "add", Device: "/dev/sdb"}},
		"stick pulled":         evDevice{DeviceEvent{Action: "remove", Device: "/dev/sdb"}},
		"same bundle offered":  evOffer{origin: OriginStick, device: "/dev/sdb", src: bundle.Source{Path: "/m/upgrade-4.13.7-x86_64.tar"}, meta: same, digest: heldDigest},
		"other bundle offered": evOffer{origin: OriginStick, device: "/dev/sdb", src: bundle.Source{Path: "/m/upgrade-4.13.8-x86_64.tar"}, meta: meta, digest: otherDigest},
		"unreadable offer":     evOffer{origin: OriginFile, src: bundle.Source{Path: "/m/upgrade-x.tar"}, err: errors.New("bad metadata"), reply: reply},
		"extract done":         evJobDone{kind: jobExtract, id: "held", res: &bundle.Result{Digest: heldDigest, TarSize: 10}},
		"load done":            evJobDone{kind: jobLoad, id: "held"},
		"load failed":          evJobDone{kind: jobLoad, id: "held", err: errors.New("crio is down")},
		"fetch done":           evJobDone{kind: jobFetch, id: "held"},
		"progress":             evProgress{id: "held", p: Progress{Done: 1, Total: 2, Unit: "bytes"}},
		"peers seen":           evView{view{statuses: map[string]peer.PeerStatus{}, at: time.Now()}},
		"cleanup asked":        evRequest{kind: reqCleanup, reply: reply},
		"proceed asked":        evRequest{kind: reqProceed, reply: reply},
		"load asked":           evRequest{kind: reqLoad, medium: MediumID(1), reply: reply},
		"hook done":            evHookDone{id: "held", run: HookRun{Exit: 0}},
		"retry":                evRetry{},
	}
}

// want is the phase the held bundle is in after the event, for each phase
// it was in; a phase absent from a row means "unchanged".
var want = map[string]map[Phase]Phase{
	"extract done": {PhaseDetected: PhaseLoading, PhaseFetching: PhaseLoading},
	"load done":    {PhaseLoading: PhaseClusterReady},
	"load failed":  {PhaseLoading: PhaseLoading},
	"peers seen":   {PhaseLoaded: PhaseClusterReady, PhaseExtracted: PhaseLoading},
	"retry":        {PhaseExtracted: PhaseLoading},
	// Without an API, ferry cleanup of a loaded bundle says the upgrade is done.
	"cleanup asked": {PhaseLoaded: PhaseUpgraded, PhaseClusterReady: PhaseUpgraded, PhaseUpgrading: PhaseUpgraded},
}

// TestStep_EveryPhaseTimesEveryEvent runs each event in each phase and
// checks the rules that hold everywhere, and the phase that follows.
func TestStep_EveryPhaseTimesEveryEvent(t *testing.T) {
	for _, p := range allPhases {
		for name := range events(0) {
			t.Run(fmt.Sprintf("%s/%s", p, name), func(t *testing.T) {
				m := machineIn(t, p)
				reply := ReplyID(1)
				ev := events(reply)[name]
				if j, ok := ev.(evJobDone); ok {
					m.job = &job{kind: j.kind, id: j.id}
				}
				busyBefore := m.job != nil
				effs := m.step(ev)

				starts, replies := 0, 0
				for _, e := range effs {
					switch e := e.(type) {
					case effStartJob:
						starts++
					case effReply:
						replies++
						if e.ch != reply {
							t.Errorf("a reply to someone else")
						}
					case effSave:
						if e.rec.ID == "" || e.rec.Phase == "" || e.rec.Times[e.rec.Phase].IsZero() {
							t.Errorf("saved a record without id, phase or time: %+v", e.rec)
						}
					}
				}
				if starts > 1 || starts == 1 && busyBefore && !isJobDone(ev) {
					t.Errorf("%d jobs started while busy=%v", starts, busyBefore)
				}
				if starts == 1 && m.job == nil {
					t.Error("a job started but the machine does not know it")
				}
				if _, ok := ev.(evRequest); ok && replies != 1 && !(name == "cleanup asked" && m.cleanupAsked) && !(name == "load asked") {
					t.Errorf("%d replies to a request", replies)
				}
				if name == "load asked" && replies == 0 && countProbes(effs) != 1 {
					t.Error("ferry load neither answered nor probed")
				}
				if m.active != nil && !m.active.Phase.Active() && !(m.active.Phase == PhaseUpgraded && m.active.Retirement < RetirementDone) {
					t.Errorf("active bundle in phase %s, which does not hold the node", m.active.Phase)
				}
				if m.lastBad != nil && m.lastBad.Phase != PhaseRejected && m.lastBad.Phase != PhaseConflict {
					t.Errorf("last refusal in phase %s", m.lastBad.Phase)
				}
				if r := m.records["held"]; r != nil && p != PhaseIdle {
					exp := p
					if w, ok := want[name][p]; ok {
						exp = w
					}
					if r.Phase != exp {
						t.Errorf("held bundle went %s → %s, want %s", p, r.Phase, exp)
					}
				}
				if st := m.status(); st.Line == "" || st.Node != "node-a" {
					t.Errorf("status %+v", st)
				}
			})
		}
	}
}

func isJobDone(ev event) bool { _, ok := ev.(evJobDone); return ok }

func countProbes(effs []effect) int {
	n := 0
	for _, e := range effs {
		if _, ok := e.(effProbe); ok {
			n++
		}
	}
	return n
}

// A few transitions spelled out, where the rule matters most.
func TestStep_OtherBundleWhileOneIsHeldIsAConflictRecordNotAnExtraction(t *testing.T) {
	for _, p := range []Phase{PhaseDetected, PhaseFetching, PhaseExtracted, PhaseLoading, PhaseLoaded, PhaseClusterReady} {
		m := machineIn(t, p)
		effs := m.step(events(0)["other bundle offered"])
		if m.active.ID != "held" || m.lastBad == nil || m.lastBad.Phase != PhaseConflict || m.lastBad.ID == "held" {
			t.Fatalf("%s: active %+v, last refusal %+v", p, m.active, m.lastBad)
		}
		for _, e := range effs {
			if _, ok := e.(effStartJob); ok {
				t.Fatalf("%s: a job started for the conflicting bundle", p)
			}
		}
	}
}

func TestStep_RecordIDsStayWhenThePhaseChanges(t *testing.T) {
	m := machineIn(t, PhaseIdle)
	m.step(evOffer{origin: OriginStick, device: "/dev/sda", src: bundle.Source{Path: "/m/upgrade-4.13.7-x86_64.tar", Raw: true},
		meta: &bundle.Metadata{Version: "4.13.7", Arch: "x86_64"}})
	id := m.active.ID
	m.step(evJobDone{kind: jobExtract, id: id, res: &bundle.Result{Digest: heldDigest}})
	if m.active == nil || m.active.ID != id || m.active.Digest != heldDigest || len(m.records) != 1 {
		t.Fatalf("after extraction: %+v, %d records", m.active, len(m.records))
	}
}

func TestStep_AStickPulledMidReadStopsTheJobAndWaitsForIt(t *testing.T) {
	m := machineIn(t, PhaseIdle)
	m.step(evOffer{origin: OriginStick, device: "/dev/sda", src: bundle.Source{Path: "/dev/sda", Raw: true},
		meta: &bundle.Metadata{Version: "4.13.7", Arch: "x86_64"}})
	effs := m.step(evDevice{DeviceEvent{Action: "remove", Device: "/dev/sda"}})
	if len(effs) != 1 || effs[0] != (effStopJob{}) {
		t.Fatalf("effects %v", effs)
	}
	m.step(evJobDone{kind: jobExtract, id: m.active.ID, stopped: true, err: errors.New("read: no such device")})
	if m.active.Phase != PhaseDetected || m.job != nil {
		t.Fatalf("after the pull: %+v", m.active)
	}
}

func TestStep_CleanupWaitsForTheRunningJob(t *testing.T) {
	m := machineIn(t, PhaseLoading)
	m.job = &job{kind: jobLoad, id: "held"}
	reply := ReplyID(1)
	if effs := m.step(evRequest{kind: reqCleanup, reply: reply}); len(effs) != 1 || effs[0] != (effStopJob{}) {
		t.Fatalf("effects %v", effs)
	}
	effs := m.step(evJobDone{kind: jobLoad, id: "held", stopped: true})
	if m.job == nil || m.job.kind != jobCleanup || countStarts(effs) != 1 {
		t.Fatalf("no cleanup after the stop: %v", effs)
	}
	effs = m.step(evJobDone{kind: jobCleanup, id: "held"})
	if m.active != nil || m.records["held"].Phase != PhaseCleaned {
		t.Fatalf("after cleanup: %+v", m.records["held"])
	}
	if last := effs[len(effs)-1]; last != (effReply{reply, nil}) {
		t.Fatalf("no reply: %v", effs)
	}
}

func countStarts(effs []effect) int {
	n := 0
	for _, e := range effs {
		if _, ok := e.(effStartJob); ok {
			n++
		}
	}
	return n
}

// Peers (and ferry status --cluster) see each node's progress in words.
func TestPeerStatus_CarriesProgressInWords(t *testing.T) {
	m := machineIn(t, PhaseLoading)
	m.step(evProgress{id: "held", p: Progress{Done: 120, Total: 183, Unit: "images"}})
	if got := m.peerStatus(m.status()).Progress; got != "120/183 images" {
		t.Fatalf("loading: %q", got)
	}
	m = machineIn(t, PhaseFetching)
	m.step(evProgress{id: "held", p: Progress{Done: 7 << 29, Total: 16 << 30, Unit: "bytes"}})
	if got := m.peerStatus(m.status()).Progress; got != "3.5/16.0 GiB" {
		t.Fatalf("fetching: %q", got)
	}
	m = machineIn(t, PhaseClusterReady)
	if got := m.peerStatus(m.status()).Progress; got != "" {
		t.Fatalf("cluster-ready: %q", got)
	}
}

// TestStatus_ASetupWarningIsInEveryStatus: a lasting setup fault (a
// kubeconfig that does not check the API server) is in the status,
// whatever the phase; the systemd line points to it without repeating it.
func TestStatus_ASetupWarningIsInEveryStatus(t *testing.T) {
	for _, p := range []Phase{PhaseIdle, PhaseLoaded} {
		m := machineIn(t, p)
		m.warnings = []string{"the kubeconfig turns TLS verification off"}
		s := m.status()
		if !slices.Equal(s.Warnings, m.warnings) || strings.Contains(s.Line, m.warnings[0]) || !strings.HasSuffix(s.Line, fmt.Sprintf(warningsPointer, 1)) {
			t.Errorf("%s: warnings %v, line %q", p, s.Warnings, s.Line)
		}
	}
}

// TestReport_ShowsTheNodesOwnMistakes: beside its bundle, a node shows
// what its config or its peers say is wrong with it: approval off (loud,
// though healthy), peers and no token_file, a peer refusing its token; a
// peer merely unreachable may be down, and is not one.
func TestReport_ShowsTheNodesOwnMistakes(t *testing.T) {
	open := func(m *machine) { m.cfg.PeersClosed = false }
	for _, tc := range []struct {
		name  string
		given []func(*machine)
		ok    func(r report) bool
	}{
		{"approval off", []func(*machine){func(m *machine) { m.cfg.ApprovalOff = true }},
			func(r report) bool {
				return r.approvalOff && r.healthy && r.text().ApprovalOff && strings.Contains(r.text().Line, approvalOffWarning)
			}},
		{"peers and no token_file", []func(*machine){withPeers(nil)},
			func(r report) bool {
				return r.peersClosed && !r.healthy && strings.Contains(r.text().Error, "token_file")
			}},
		{"a peer refusing this node's token", []func(*machine){open, withPeers(&peer.PeerStatus{Err: fmt.Errorf("%s: %w", peerB, peer.ErrUnauthorized)})},
			func(r report) bool { return r.refusedBy == peerB && !r.healthy && !r.text().Healthy }},
		{"a peer unreachable", []func(*machine){open, withPeers(&peer.PeerStatus{Err: errors.New("connection refused")})},
			func(r report) bool { return r.refusedBy == "" && !r.peersClosed && r.healthy }},
	} {
		m := machineIn(t, PhaseIdle)
		for _, g := range tc.given {
			g(m)
		}
		if rep := m.report(); !tc.ok(rep) {
			t.Errorf("%s: report %+v", tc.name, rep)
		}
	}
}

// TestStep_ANodeThatLoadsNothingSaysSoOnceApproved: a node with no CRI-O
// loader (crio.socket = "") waits for approval like any other; once the
// administrator approves, it says what it does (verifies, extracts and
// shares) instead of still waiting, starts no load, and a later turn of
// the loop changes nothing.
func TestStep_ANodeThatLoadsNothingSaysSoOnceApproved(t *testing.T) {
	for _, c := range []struct {
		name    string
		approve func(m *machine) event // nil: approval is off, nothing to wait for
	}{
		{"approved in the cluster", func(m *machine) event {
			return evClusterApprovals{approvals: []cluster.Approval{{Bundle: "4.13.7-x86-64", Digest: heldDigest}}}
		}},
		{"approved in the config", func(m *machine) event {
			m.policy.ApprovedDigests = []string{heldDigest}
			return evRetry{}
		}},
		{"approval off", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := machineIn(t, PhaseIdle)
			m.hasLoader, m.hasAPI = false, true
			m.policy.Required = c.approve != nil
			m.policy.Off = c.approve == nil
			m.step(evOffer{origin: OriginStick, device: "/dev/sda", src: bundle.Source{Path: "/dev/sda", Raw: true},
				meta: &bundle.Metadata{Version: "4.13.7", Arch: "x86_64"}})
			id := m.active.ID
			approval := bundle.ApprovalOff
			if c.approve != nil {
				approval = bundle.ApprovalNone
			}
			effs := m.step(evJobDone{kind: jobExtract, id: id, res: &bundle.Result{Digest: heldDigest, TarSize: 10, Approval: approval}})
			if c.approve != nil {
				if r := m.records[id]; r.Phase != PhaseExtracted || r.Condition.Reason != ReasonAwaitingApproval {
					t.Fatalf("before the approval: phase %s, condition %+v", r.Phase, r.Condition)
				}
				effs = m.step(c.approve(m))
			}
			if n := countStarts(effs); n != 0 || m.job != nil {
				t.Fatalf("a node with no loader started %d jobs (%+v)", n, m.job)
			}
			s := m.status()
			if s.Phase != string(PhaseExtracted) || !s.Healthy || !strings.Contains(s.Line, loadsNothing.Message) {
				t.Fatalf("after the approval: phase %s, healthy %v, line %q", s.Phase, s.Healthy, s.Line)
			}
			if r := m.records[id]; r.Condition.Reason != ReasonLoadsNothing || r.Approval == bundle.ApprovalNone {
				t.Fatalf("record: condition %+v, approval %q", r.Condition, r.Approval)
			}
			if effs := m.step(evRetry{}); len(effs) != 0 {
				t.Fatalf("a later turn of the loop: %v", effs)
			}
		})
	}
}
