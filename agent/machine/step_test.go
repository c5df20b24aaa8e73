package machine

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
	"github.com/ferry-edge/ferry/peer/wire"
)

const (
	heldDigest  = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	otherDigest = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
)

var allPhases = []Phase{PhaseIdle, PhaseDetected, PhaseFetching, PhaseExtracted, PhaseLoading, PhaseLoaded,
	PhaseClusterReady, PhaseUpgrading, PhaseUpgraded, PhaseCleaned, PhaseRejected, PhaseFailed, PhaseConflict}

// machineIn is a machine whose one bundle is in phase p (PhaseIdle: none).
func machineIn(t *testing.T, p Phase) *Machine {
	// A node with the default config but for its name, dirs and hook.
	s := Settings{NodeName: "node-a", StateDir: t.TempDir(), ExtractDir: t.TempDir(), OnReady: []string{"true"},
		Schedule: "Automatic", KeepRunningRelease: true, PeersClosed: true}
	clock := time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC)
	m := NewMachine(s, bundle.Policy{Arch: "x86_64"}, Wiring{Media: true, Loader: true,
		Log: slog.New(slog.DiscardHandler), Now: func() time.Time { return clock },
		ParseMetadata: bundle.ParseMetadata, ApproveOffer: bundle.ApproveOffer})
	if p == PhaseIdle {
		return m
	}
	r := heldRecord()
	m.Move(r, p, Condition{}, Progress{})
	switch {
	case p.Active():
		m.Active = r
	case p == PhaseRejected || p == PhaseConflict:
		m.LastBad = r
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
func events(reply ReplyID) map[string]Event {
	meta := &bundle.Metadata{Version: "4.13.8", Arch: "x86_64"}
	same := &bundle.Metadata{Version: "4.13.7", Arch: "x86_64"}
	return map[string]Event{
		"stick plugged":        EvDevice{DeviceEvent{Action: "add", Device: "/dev/sdb"}},
		"stick pulled":         EvDevice{DeviceEvent{Action: "remove", Device: "/dev/sdb"}},
		"same bundle offered":  EvOffer{Origin: OriginStick, Device: "/dev/sdb", Src: bundle.Source{Path: "/m/upgrade-4.13.7-x86_64.tar"}, Meta: same, Digest: heldDigest},
		"other bundle offered": EvOffer{Origin: OriginStick, Device: "/dev/sdb", Src: bundle.Source{Path: "/m/upgrade-4.13.8-x86_64.tar"}, Meta: meta, Digest: otherDigest},
		"unreadable offer":     EvOffer{Origin: OriginFile, Src: bundle.Source{Path: "/m/upgrade-x.tar"}, Err: errors.New("bad metadata"), Reply: reply},
		"extract done":         EvJobDone{Kind: JobExtract, ID: "held", Res: &bundle.Result{Digest: heldDigest, TarSize: 10}},
		"load done":            EvJobDone{Kind: JobLoad, ID: "held"},
		"load failed":          EvJobDone{Kind: JobLoad, ID: "held", Err: errors.New("crio is down")},
		"fetch done":           EvJobDone{Kind: JobFetch, ID: "held"},
		"progress":             EvProgress{ID: "held", P: Progress{Done: 1, Total: 2, Unit: "bytes"}},
		"peers seen":           EvView{View{Statuses: map[string]wire.PeerStatus{}, At: time.Now()}},
		"cleanup asked":        EvRequest{Kind: ReqCleanup, Reply: reply},
		"proceed asked":        EvRequest{Kind: reqProceed, Reply: reply},
		"load asked":           EvRequest{Kind: ReqLoad, Medium: MediumID(1), Reply: reply},
		"hook done":            EvHookDone{ID: "held", Run: HookRun{Exit: 0}},
		"retry":                EvRetry{},
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
				if j, ok := ev.(EvJobDone); ok {
					m.Job = &Job{Kind: j.Kind, ID: j.ID}
				}
				busyBefore := m.Job != nil
				effs := m.Step(ev)

				starts, replies := 0, 0
				for _, e := range effs {
					switch e := e.(type) {
					case EffStartJob:
						starts++
					case EffReply:
						replies++
						if e.Ch != reply {
							t.Errorf("a reply to someone else")
						}
					case EffSave:
						if e.Rec.ID == "" || e.Rec.Phase == "" || e.Rec.Times[e.Rec.Phase].IsZero() {
							t.Errorf("saved a record without id, phase or time: %+v", e.Rec)
						}
					}
				}
				if starts > 1 || starts == 1 && busyBefore && !isJobDone(ev) {
					t.Errorf("%d jobs started while busy=%v", starts, busyBefore)
				}
				if starts == 1 && m.Job == nil {
					t.Error("a job started but the machine does not know it")
				}
				if _, ok := ev.(EvRequest); ok && replies != 1 && !(name == "cleanup asked" && m.cleanupAsked) && !(name == "load asked") {
					t.Errorf("%d replies to a request", replies)
				}
				if name == "load asked" && replies == 0 && countProbes(effs) != 1 {
					t.Error("ferry load neither answered nor probed")
				}
				if m.Active != nil && !m.Active.Phase.Active() && !(m.Active.Phase == PhaseUpgraded && m.Active.Retirement < RetirementDone) {
					t.Errorf("active bundle in phase %s, which does not hold the node", m.Active.Phase)
				}
				if m.LastBad != nil && m.LastBad.Phase != PhaseRejected && m.LastBad.Phase != PhaseConflict {
					t.Errorf("last refusal in phase %s", m.LastBad.Phase)
				}
				if r := m.Records["held"]; r != nil && p != PhaseIdle {
					exp := p
					if w, ok := want[name][p]; ok {
						exp = w
					}
					if r.Phase != exp {
						t.Errorf("held bundle went %s → %s, want %s", p, r.Phase, exp)
					}
				}
				if st := m.NodeStatus(); st.Line == "" || st.Node != "node-a" {
					t.Errorf("status %+v", st)
				}
			})
		}
	}
}

func isJobDone(ev Event) bool { _, ok := ev.(EvJobDone); return ok }

func countProbes(effs []Effect) int {
	n := 0
	for _, e := range effs {
		if _, ok := e.(EffProbe); ok {
			n++
		}
	}
	return n
}

// A few transitions spelled out, where the rule matters most.
func TestStep_OtherBundleWhileOneIsHeldIsAConflictRecordNotAnExtraction(t *testing.T) {
	for _, p := range []Phase{PhaseDetected, PhaseFetching, PhaseExtracted, PhaseLoading, PhaseLoaded, PhaseClusterReady} {
		m := machineIn(t, p)
		effs := m.Step(events(0)["other bundle offered"])
		if m.Active.ID != "held" || m.LastBad == nil || m.LastBad.Phase != PhaseConflict || m.LastBad.ID == "held" {
			t.Fatalf("%s: active %+v, last refusal %+v", p, m.Active, m.LastBad)
		}
		for _, e := range effs {
			if _, ok := e.(EffStartJob); ok {
				t.Fatalf("%s: a job started for the conflicting bundle", p)
			}
		}
	}
}

func TestStep_RecordIDsStayWhenThePhaseChanges(t *testing.T) {
	m := machineIn(t, PhaseIdle)
	m.Step(EvOffer{Origin: OriginStick, Device: "/dev/sda", Src: bundle.Source{Path: "/m/upgrade-4.13.7-x86_64.tar", Raw: true},
		Meta: &bundle.Metadata{Version: "4.13.7", Arch: "x86_64"}})
	id := m.Active.ID
	m.Step(EvJobDone{Kind: JobExtract, ID: id, Res: &bundle.Result{Digest: heldDigest}})
	if m.Active == nil || m.Active.ID != id || m.Active.Digest != heldDigest || len(m.Records) != 1 {
		t.Fatalf("after extraction: %+v, %d records", m.Active, len(m.Records))
	}
}

func TestStep_AStickPulledMidReadStopsTheJobAndWaitsForIt(t *testing.T) {
	m := machineIn(t, PhaseIdle)
	m.Step(EvOffer{Origin: OriginStick, Device: "/dev/sda", Src: bundle.Source{Path: "/dev/sda", Raw: true},
		Meta: &bundle.Metadata{Version: "4.13.7", Arch: "x86_64"}})
	effs := m.Step(EvDevice{DeviceEvent{Action: "remove", Device: "/dev/sda"}})
	if len(effs) != 1 || effs[0] != (EffStopJob{}) {
		t.Fatalf("effects %v", effs)
	}
	m.Step(EvJobDone{Kind: JobExtract, ID: m.Active.ID, Stopped: true, Err: errors.New("read: no such device")})
	if m.Active.Phase != PhaseDetected || m.Job != nil {
		t.Fatalf("after the pull: %+v", m.Active)
	}
}

func TestStep_CleanupWaitsForTheRunningJob(t *testing.T) {
	m := machineIn(t, PhaseLoading)
	m.Job = &Job{Kind: JobLoad, ID: "held"}
	reply := ReplyID(1)
	if effs := m.Step(EvRequest{Kind: ReqCleanup, Reply: reply}); len(effs) != 1 || effs[0] != (EffStopJob{}) {
		t.Fatalf("effects %v", effs)
	}
	effs := m.Step(EvJobDone{Kind: JobLoad, ID: "held", Stopped: true})
	if m.Job == nil || m.Job.Kind != JobCleanup || countStarts(effs) != 1 {
		t.Fatalf("no cleanup after the stop: %v", effs)
	}
	effs = m.Step(EvJobDone{Kind: JobCleanup, ID: "held"})
	if m.Active != nil || m.Records["held"].Phase != PhaseCleaned {
		t.Fatalf("after cleanup: %+v", m.Records["held"])
	}
	if last := effs[len(effs)-1]; last != (EffReply{reply, nil}) {
		t.Fatalf("no reply: %v", effs)
	}
}

func countStarts(effs []Effect) int {
	n := 0
	for _, e := range effs {
		if _, ok := e.(EffStartJob); ok {
			n++
		}
	}
	return n
}

// Peers (and ferry status --cluster) see each node's progress in words.
func TestPeerStatus_CarriesProgressInWords(t *testing.T) {
	m := machineIn(t, PhaseLoading)
	m.Step(EvProgress{ID: "held", P: Progress{Done: 120, Total: 183, Unit: "images"}})
	if got := m.StatusForPeers(m.NodeStatus()).Progress; got != "120/183 images" {
		t.Fatalf("loading: %q", got)
	}
	m = machineIn(t, PhaseFetching)
	m.Step(EvProgress{ID: "held", P: Progress{Done: 7 << 29, Total: 16 << 30, Unit: "bytes"}})
	if got := m.StatusForPeers(m.NodeStatus()).Progress; got != "3.5/16.0 GiB" {
		t.Fatalf("fetching: %q", got)
	}
	m = machineIn(t, PhaseClusterReady)
	if got := m.StatusForPeers(m.NodeStatus()).Progress; got != "" {
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
		s := m.NodeStatus()
		if !slices.Equal(s.Warnings, m.warnings) || strings.Contains(s.Line, m.warnings[0]) || !strings.HasSuffix(s.Line, warningsPointer(1)) {
			t.Errorf("%s: warnings %v, line %q", p, s.Warnings, s.Line)
		}
	}
}

// TestReport_ShowsTheNodesOwnMistakes: beside its bundle, a node shows
// what its config or its peers say is wrong with it: approval off (loud,
// though healthy), peers and no token_file, a peer refusing its token; a
// peer merely unreachable may be down, and is not one.
func TestReport_ShowsTheNodesOwnMistakes(t *testing.T) {
	open := func(m *Machine) { m.cfg.PeersClosed = false }
	for _, tc := range []struct {
		name  string
		given []func(*Machine)
		ok    func(r report) bool
	}{
		{"approval off", []func(*Machine){func(m *Machine) { m.cfg.ApprovalOff = true }},
			func(r report) bool {
				return r.approvalOff && r.healthy && r.Text().ApprovalOff && strings.Contains(r.Text().Line, ApprovalOffWarning)
			}},
		{"peers and no token_file", []func(*Machine){withPeers(nil)},
			func(r report) bool {
				return r.peersClosed && !r.healthy && strings.Contains(r.Text().Error, "token_file")
			}},
		{"a peer refusing this node's token", []func(*Machine){open, withPeers(&wire.PeerStatus{Err: fmt.Errorf("%s: %w", peerB, wire.ErrUnauthorized)})},
			func(r report) bool { return r.refusedBy == peerB && !r.healthy && !r.Text().Healthy }},
		{"a peer unreachable", []func(*Machine){open, withPeers(&wire.PeerStatus{Err: errors.New("connection refused")})},
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
		approve func(m *Machine) Event // nil: approval is off, nothing to wait for
	}{
		{"approved in the cluster", func(m *Machine) Event {
			return EvCluster{Approvals: &ApprovalsRead{Approvals: []cluster.Approval{{Bundle: "4.13.7-x86-64", Digest: heldDigest}}}}
		}},
		{"approved in the config", func(m *Machine) Event {
			m.policy.ApprovedDigests = []string{heldDigest}
			return EvRetry{}
		}},
		{"approval off", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := machineIn(t, PhaseIdle)
			m.hasLoader, m.HasAPI = false, true
			m.policy.Required = c.approve != nil
			m.policy.Off = c.approve == nil
			m.Step(EvOffer{Origin: OriginStick, Device: "/dev/sda", Src: bundle.Source{Path: "/dev/sda", Raw: true},
				Meta: &bundle.Metadata{Version: "4.13.7", Arch: "x86_64"}})
			id := m.Active.ID
			approval := bundle.ApprovalOff
			if c.approve != nil {
				approval = bundle.ApprovalNone
			}
			effs := m.Step(EvJobDone{Kind: JobExtract, ID: id, Res: &bundle.Result{Digest: heldDigest, TarSize: 10, Approval: approval}})
			if c.approve != nil {
				if r := m.Records[id]; r.Phase != PhaseExtracted || r.Condition.Reason != ReasonAwaitingApproval {
					t.Fatalf("before the approval: phase %s, condition %+v", r.Phase, r.Condition)
				}
				effs = m.Step(c.approve(m))
			}
			if n := countStarts(effs); n != 0 || m.Job != nil {
				t.Fatalf("a node with no loader started %d jobs (%+v)", n, m.Job)
			}
			s := m.NodeStatus()
			if s.Phase != string(PhaseExtracted) || !s.Healthy || !strings.Contains(s.Line, loadsNothing.Message) {
				t.Fatalf("after the approval: phase %s, healthy %v, line %q", s.Phase, s.Healthy, s.Line)
			}
			if r := m.Records[id]; r.Condition.Reason != ReasonLoadsNothing || r.Approval == bundle.ApprovalNone {
				t.Fatalf("record: condition %+v, approval %q", r.Condition, r.Approval)
			}
			if effs := m.Step(EvRetry{}); len(effs) != 0 {
				t.Fatalf("a later turn of the loop: %v", effs)
			}
		})
	}
}
