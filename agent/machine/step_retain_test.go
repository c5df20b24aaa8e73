package machine

import (
	"errors"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/peer/wire"
)

var bundleMeta = bundle.Metadata{Version: "4.13.7", Arch: "x86_64", Release: "quay.io/r@" + heldDigest}

// upgradedMachine is a machine whose one bundle is the running release,
// upgraded, retired, its tree kept or not.
func upgradedMachine(t *testing.T, retained bool) (*Machine, *Record) {
	m := machineIn(t, PhaseIdle)
	r := &Record{ID: "running", Digest: heldDigest, Name: "upgrade-4.13.7-x86_64.tar", Metadata: &bundleMeta,
		Origin: OriginStick, Dir: "/nonexistent/4.13.7-x86_64", Retirement: RetirementDone, Retained: retained}
	m.Move(r, PhaseUpgraded, Condition{}, Progress{})
	m.done, m.previous = r, r
	return m, r
}

func jobOf(effs []Effect) (EffStartJob, bool) {
	for _, e := range effs {
		if j, ok := e.(EffStartJob); ok {
			return j, true
		}
	}
	return EffStartJob{}, false
}

func TestStep_RuntimeCheckRestoresTheRunningReleaseWhenIdle(t *testing.T) {
	for _, tc := range []struct {
		name     string
		retained bool
		active   Phase // a second bundle's phase; PhaseIdle: none
		busy     bool
		want     bool
	}{
		{name: "idle, kept", retained: true, want: true},
		{name: "not kept", retained: false},
		{name: "a job runs", retained: true, busy: true},
		{name: "another bundle extracted", retained: true, active: PhaseExtracted, want: true},
		{name: "another bundle loaded holds the mirror", retained: true, active: PhaseLoaded},
		{name: "another bundle loading", retained: true, active: PhaseLoading},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, r := upgradedMachine(t, tc.retained)
			if tc.active != PhaseIdle {
				m.Active = &Record{ID: "next", Digest: otherDigest, Phase: tc.active, Metadata: &bundleMeta}
				m.Records["next"] = m.Active
			}
			if tc.busy {
				m.Job = &Job{Kind: JobExtract, ID: "next"}
			}
			j, started := jobOf(m.Step(EvRuntimeCheck{"CRI-O restarted"}))
			if started != tc.want || started && (j.Kind != JobRestore || j.Rec != r) {
				t.Fatalf("started %v (%+v), want %v", started, j, tc.want)
			}
			if !tc.want && tc.retained && m.restoreDue != "CRI-O restarted" {
				t.Errorf("a check that could not run now is not kept for later: %q", m.restoreDue)
			}
		})
	}
}

func TestStep_ADeferredRuntimeCheckRunsWhenTheJobEnds(t *testing.T) {
	m, _ := upgradedMachine(t, true)
	m.Active = &Record{ID: "next", Digest: otherDigest, Metadata: &bundleMeta, Dir: "/nonexistent/4.13.8-x86_64"}
	m.Move(m.Active, PhaseDetected, Condition{}, Progress{})
	m.Job = &Job{Kind: JobCleanup, ID: "next"}
	m.Step(EvRuntimeCheck{"periodic check"})
	j, ok := jobOf(m.Step(EvJobDone{Kind: JobCleanup, ID: "next"}))
	if !ok || j.Kind != JobRestore {
		t.Fatalf("after the cleanup: %+v, want the restore that waited", j)
	}
	if m.restoreDue != "" {
		t.Errorf("restoreDue %q after it ran", m.restoreDue)
	}
}

func TestStep_RestoreDoneSaysWhatItLoadedAgain(t *testing.T) {
	m, _ := upgradedMachine(t, true)
	m.Job = &Job{Kind: JobRestore, ID: "running"}
	m.Step(EvJobDone{Kind: JobRestore, ID: "running", Restored: 3})
	if s := m.NodeStatus(); s.Notice == "" || s.Phase != string(PhaseUpgraded) {
		t.Fatalf("status %+v: want upgraded with a notice of the 3 images", s)
	}
}

// With an API, a loaded bundle the cluster never upgraded to is unloaded by
// a cleanup (the running release keeps its pins); during its upgrade a
// cleanup is refused; without an API it still says the upgrade is done.
func TestStep_CleanupOfALoadedBundle(t *testing.T) {
	for _, tc := range []struct {
		name   string
		api    bool
		phase  Phase
		want   jobKind // "" for none
		refuse bool
	}{
		{name: "API, cluster-ready", api: true, phase: PhaseClusterReady, want: JobCleanup},
		{name: "API, loaded", api: true, phase: PhaseLoaded, want: JobCleanup},
		{name: "API, upgrading", api: true, phase: PhaseUpgrading, refuse: true},
		{name: "no API, cluster-ready", phase: PhaseClusterReady, want: JobRetire},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := machineIn(t, tc.phase)
			m.HasAPI = tc.api
			m.desired = desiredRead{release: m.Records["held"].Metadata.Release} // read: another release asked for
			reply := ReplyID(1)
			effs := m.Step(EvRequest{Kind: ReqCleanup, Reply: reply})
			j, started := jobOf(effs)
			if tc.want != "" && (!started || j.Kind != tc.want) {
				t.Fatalf("job %+v, want %s", j, tc.want)
			}
			if tc.refuse {
				if started {
					t.Fatalf("a cleanup during the upgrade started %s", j.Kind)
				}
				var err error
				for _, e := range effs {
					if r, ok := e.(EffReply); ok {
						err = r.Err
					}
				}
				if err == nil {
					t.Fatal("a cleanup during the upgrade was not refused")
				}
			}
		})
	}
}

func TestStep_ANodeThatJoinsLaterLoadsTheRunningReleaseAndIsUpgraded(t *testing.T) {
	m := machineIn(t, PhaseLoaded)
	m.peersOn, m.peers = true, []string{"b:8090"}
	m.view = View{Statuses: map[string]wire.PeerStatus{"b:8090": {Status: wire.Status{Node: "b", Phase: string(PhaseUpgraded), Digest: heldDigest}}}}
	j, ok := jobOf(m.Step(EvView{m.view}))
	if !ok || j.Kind != JobRetire || !j.Retain {
		t.Fatalf("job %+v: want the bundle retired and kept as the running release", j)
	}
	if m.Active.Phase != PhaseUpgraded {
		t.Fatalf("phase %s", m.Active.Phase)
	}
}

func TestStep_FreshOffersLeaveOutWhatThePeersRunWhenAnotherIsOffered(t *testing.T) {
	m := machineIn(t, PhaseIdle)
	running := wire.PeerOffer{Peer: "b:8090", Offer: wire.Offer{Digest: heldDigest}}
	next := wire.PeerOffer{Peer: "c:8090", Offer: wire.Offer{Digest: otherDigest}}
	v := View{
		Statuses: map[string]wire.PeerStatus{"b:8090": {Status: wire.Status{Phase: string(PhaseUpgraded), Digest: heldDigest}}},
		Offers:   []wire.PeerOffer{running, next},
	}
	if got := m.fresh(v); len(got) != 1 || got[0].Digest != otherDigest {
		t.Errorf("with a next bundle offered: %+v, want it alone", got)
	}
	v.Offers = []wire.PeerOffer{running}
	if got := m.fresh(v); len(got) != 1 || got[0].Digest != heldDigest {
		t.Errorf("with only the running release offered: %+v, want it (a node that joins later)", got)
	}
	m2, _ := upgradedMachine(t, true)
	if got := m2.fresh(v); len(got) != 0 {
		t.Errorf("a node that runs it already: %+v, want none", got)
	}
}

func TestStep_RetentionTurnedOffRemovesTheKeptTreeAtStart(t *testing.T) {
	m := machineIn(t, PhaseIdle)
	m.cfg.KeepRunningRelease = false
	r := &Record{ID: "running", Digest: heldDigest, Name: "upgrade-4.13.7-x86_64.tar", Metadata: &bundleMeta,
		Dir: "/nonexistent/4.13.7-x86_64", Phase: PhaseUpgraded, Retirement: RetirementDone, Retained: true}
	effs := m.Step(EvStart{Records: []*Record{r}})
	removed := false
	for _, e := range effs {
		if rm, ok := e.(EffRemove); ok && rm.Path == r.Dir {
			removed = true
		}
	}
	if !removed || r.Retained {
		t.Fatalf("effects %v: want the kept tree removed", effs)
	}
}

func TestStep_ANewBundleForTheSameDirReplacesTheKeptTree(t *testing.T) {
	m, r := upgradedMachine(t, true)
	effs := m.keepsDir(r.Dir)
	if len(effs) == 0 || r.Retained {
		t.Fatalf("effects %v: want the kept tree dropped", effs)
	}
	if effs := m.keepsDir("/nonexistent/other"); len(effs) != 0 {
		t.Errorf("another dir: %v", effs)
	}
}

func TestStep_AFailedRestoreIsTriedAgainSoon(t *testing.T) {
	m, _ := upgradedMachine(t, true)
	m.Job = &Job{Kind: JobRestore, ID: "running"}
	effs := m.Step(EvJobDone{Kind: JobRestore, ID: "running", Err: errCRIODown})
	retry := false
	for _, e := range effs {
		if r, ok := e.(EffRetryIn); ok && r.After == restoreRetry {
			retry = true
		}
	}
	if !retry || m.restoreDue == "" {
		t.Fatalf("effects %v, restoreDue %q: want a retry", effs, m.restoreDue)
	}
	if j, ok := jobOf(m.Step(EvRetry{})); !ok || j.Kind != JobRestore {
		t.Fatalf("on the retry: %+v, want the check again", j)
	}
}

var errCRIODown = errors.New("CRI-O is not answering")
