package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/peer"
)

// The reducer tested as a reducer: each row builds a machine in a given
// state (machineIn: one bundle, "held", in a phase; a fixed clock), feeds
// it one event, and compares what step did with the row: the subject's
// phase and its condition's Reason (a typed constant, never English), and
// the effects, each as effKey renders its type and key fields
// (announcements, which only render the status, are left out).

// stepRow is one transition.
type stepRow struct {
	name  string
	in    Phase            // the held bundle's phase before (PhaseIdle: none)
	given []func(*machine) // more of the state before: config, peers, a job…
	ev    event
	phase Phase    // the subject's phase after (PhaseIdle: no subject)
	why   string   // its condition's Reason after ("": none)
	effs  []string // effKey of each effect, in order
	check func(t *testing.T, m *machine)
}

// subject is the record a row looks at after the step: the held bundle,
// else the one that holds the node, else the newest refusal.
func subject(m *machine) *Record {
	if r := m.records["held"]; r != nil {
		return r
	}
	if m.active != nil {
		return m.active
	}
	return m.lastBad
}

// effKey names an effect by its type and key fields.
func effKey(e effect) string {
	switch e := e.(type) {
	case effSave:
		return "save " + e.rec.ID
	case effForget:
		return "forget " + e.id
	case effProbe:
		k := "probe " + string(e.origin)
		if e.held != "" {
			k += " held"
		}
		return k
	case effStartJob:
		k := "start " + string(e.kind)
		if e.unload {
			k += " unload"
		}
		if e.previous != nil {
			k += " previous=" + e.previous.ID
		}
		if e.retain {
			k += " retain"
		}
		return k
	case effUnshare:
		return "unshare"
	case effStopJob:
		return "stop job"
	case effCloseMedium:
		return "close medium"
	case effShare:
		return "share " + e.rec.ID
	case effRemove:
		return "remove " + filepath.Base(e.path)
	case effResumeLoader:
		return "resume loader " + e.rec.ID
	case effRunHook:
		return "run hook " + e.rec.ID
	case effAskUpgrade:
		return "ask upgrade " + e.rec.ID
	case effRetryIn:
		return "retry in " + e.after.String()
	case effReply:
		if e.err != nil {
			return "reply error"
		}
		return "reply ok"
	case effAnnounce:
		return "announce"
	}
	return fmt.Sprintf("%T", e)
}

func runRows(t *testing.T, rows []stepRow) {
	t.Helper()
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			m := machineIn(t, row.in)
			for _, g := range row.given {
				g(m)
			}
			var got []string
			for _, e := range m.step(row.ev) {
				if _, ok := e.(effAnnounce); !ok {
					got = append(got, effKey(e))
				}
			}
			if !slices.Equal(got, row.effs) {
				t.Errorf("effects\n got %q\nwant %q", got, row.effs)
			}
			phase, why := PhaseIdle, ""
			if r := subject(m); r != nil {
				phase, why = r.Phase, r.Condition.Reason
			}
			if phase != row.phase || why != row.why {
				t.Errorf("subject %s (%q), want %s (%q)", phase, why, row.phase, row.why)
			}
			if row.check != nil {
				row.check(t, m)
			}
		})
	}
}

// Givens: the state a row starts from, beyond the held bundle's phase.

func running(k jobKind) func(*machine) {
	return func(m *machine) { m.job = &job{kind: k, id: "held", device: "/dev/sdb"} }
}

func withAPI(m *machine) { m.hasAPI = true }

func noLoader(m *machine) { m.hasLoader = false }

func noHook(m *machine) { m.cfg.Cluster.OnReady = nil }

// approvalRequired: approval = "required", nothing approved, and the
// held bundle extracted unapproved.
func approvalRequired(m *machine) {
	m.policy.Required = true
	if r := m.records["held"]; r != nil {
		r.Approval = bundle.ApprovalNone
	}
}

func approvedHeld(m *machine) {
	if r := m.records["held"]; r != nil {
		r.Approval = bundle.ApprovalDigest
	}
}

// withPeers gives the machine one peer, b, last seen in st (nil: never
// heard from).
func withPeers(st *peer.PeerStatus) func(*machine) {
	return func(m *machine) {
		m.peersOn, m.peers = true, []string{peerB}
		m.view = view{statuses: map[string]peer.PeerStatus{}, at: m.now()}
		if st != nil {
			m.view.statuses[peerB] = *st
		}
	}
}

func with(f func(*machine)) func(*machine) { return f }

const peerB = "10.0.0.2:8090"

// heldHex names the dir a fetched tar of the held bundle lands in.
var heldHex = strings.TrimPrefix(heldDigest, "sha256:")

func peerIn(p Phase, digest string) *peer.PeerStatus {
	return &peer.PeerStatus{Status: peer.Status{Node: "b", Phase: string(p), Digest: digest, Version: "4.13.7"}}
}

func viewOf(st *peer.PeerStatus, offers ...peer.PeerOffer) evView {
	v := view{statuses: map[string]peer.PeerStatus{}, offers: offers, at: time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC)}
	if st != nil {
		v.statuses[peerB] = *st
	}
	return evView{v}
}

func offerOf(t *testing.T, digest string, meta bundle.Metadata) peer.PeerOffer {
	t.Helper()
	meta.FormatVersion, meta.Images = 1, []string{"quay.io/x/app@" + heldDigest}
	b, err := json.Marshal(meta)
	if err != nil {
		t.Fatal(err)
	}
	return peer.PeerOffer{Peer: peerB, Offer: peer.Offer{Digest: digest, Metadata: b, Size: 10, Complete: true}}
}

var (
	meta137 = bundle.Metadata{Version: "4.13.7", Arch: "x86_64", Release: "quay.io/r@" + heldDigest}
	meta138 = bundle.Metadata{Version: "4.13.8", Arch: "x86_64", Release: "quay.io/r@" + otherDigest}
	errBoom = errors.New("crio is down")
)

func stickOffer(meta *bundle.Metadata, digest string) evOffer {
	return evOffer{origin: OriginStick, device: "/dev/sdb", src: bundle.Source{Path: "/m/upgrade-" + meta.Version + "-x86_64.tar"},
		medium: &fakeMedium{f: &fakeMedia{}}, meta: meta, digest: digest}
}

func TestStepTable_DevicesAndOffers(t *testing.T) {
	reply := make(chan error, 1)
	runRows(t, []stepRow{
		{name: "a stick plugged on an idle node is probed", in: PhaseIdle,
			ev: evDevice{DeviceEvent{Action: "add", Device: "/dev/sdb"}}, phase: PhaseIdle, effs: []string{"probe stick"}},
		{name: "a stick plugged on a node holding a bundle is probed against it", in: PhaseLoaded,
			ev: evDevice{DeviceEvent{Action: "add", Device: "/dev/sdb"}}, phase: PhaseLoaded, effs: []string{"probe stick held"}},
		{name: "a change event for a stick being probed does nothing", in: PhaseIdle, given: []func(*machine){with(func(m *machine) { m.probing["/dev/sdb"] = true })},
			ev: evDevice{DeviceEvent{Action: "change", Device: "/dev/sdb"}}, phase: PhaseIdle},
		{name: "a change event for the stick being read does nothing", in: PhaseDetected, given: []func(*machine){running(jobExtract)},
			ev: evDevice{DeviceEvent{Action: "change", Device: "/dev/sdb"}}, phase: PhaseDetected},
		{name: "without media, a stick is not looked at", in: PhaseIdle, given: []func(*machine){with(func(m *machine) { m.hasMedia = false })},
			ev: evDevice{DeviceEvent{Action: "add", Device: "/dev/sdb"}}, phase: PhaseIdle},
		{name: "the stick pulled while read stops the job", in: PhaseDetected, given: []func(*machine){running(jobExtract)},
			ev: evDevice{DeviceEvent{Action: "remove", Device: "/dev/sdb"}}, phase: PhaseDetected, effs: []string{"stop job"}},
		{name: "another stick pulled does nothing", in: PhaseDetected, given: []func(*machine){running(jobExtract)},
			ev: evDevice{DeviceEvent{Action: "remove", Device: "/dev/sdc"}}, phase: PhaseDetected},

		{name: "a bundle offered on an idle node is extracted, its medium kept open", in: PhaseIdle,
			ev: stickOffer(&meta137, heldDigest), phase: PhaseDetected,
			effs: []string{"save 4.13.7-x86_64-20261122T080000", "remove 4.13.7-x86_64", "start extract"},
			check: func(t *testing.T, m *machine) {
				if !m.active.Plugged || m.job.medium == nil || m.job.device != "/dev/sdb" {
					t.Errorf("active %+v, job %+v", m.active, m.job)
				}
			}},
		{name: "a stick without a bundle is answered, nothing recorded", in: PhaseIdle,
			ev: evOffer{origin: OriginFile, noBundle: true, err: errNoBundle, reply: reply}, phase: PhaseIdle, effs: []string{"reply error"}},
		{name: "an unreadable bundle is rejected", in: PhaseIdle,
			ev: evOffer{origin: OriginStick, device: "/dev/sdb", src: bundle.Source{Path: "/m/upgrade-x.tar"}, err: bundle.ErrInvalid},
			phase: PhaseRejected, why: ReasonRefused, effs: []string{"save x-20261122T080000"}},
		{name: "the same bundle offered again changes nothing", in: PhaseLoaded,
			ev: stickOffer(&meta137, heldDigest), phase: PhaseLoaded, effs: []string{"close medium"},
			check: func(t *testing.T, m *machine) {
				if !strings.Contains(m.notice, "is the bundle already held") {
					t.Errorf("notice %q", m.notice)
				}
			}},
		{name: "another bundle offered while one is held is a conflict record", in: PhaseClusterReady,
			ev: stickOffer(&meta138, otherDigest), phase: PhaseClusterReady, effs: []string{"save 4.13.8-x86_64-20261122T080000", "close medium"},
			check: func(t *testing.T, m *machine) {
				if m.lastBad == nil || m.lastBad.Phase != PhaseConflict || m.lastBad.Condition.Reason != ReasonBundlesDiffer {
					t.Errorf("last refusal %+v", m.lastBad)
				}
			}},
		{name: "the interrupted bundle plugged again resumes its copy", in: PhaseDetected,
			ev: stickOffer(&meta137, heldDigest), phase: PhaseDetected, effs: []string{"save held", "remove 4.13.7-x86_64", "start extract"}},
		{name: "the bundle being read, offered again, is noted", in: PhaseDetected, given: []func(*machine){running(jobExtract)},
			ev: func() event { o := stickOffer(&meta137, heldDigest); o.reply = reply; return o }(),
			phase: PhaseDetected, effs: []string{"reply ok", "close medium"}},
		{name: "a new bundle offered while a job runs is answered busy", in: PhaseIdle, given: []func(*machine){running(jobRestore)},
			ev: func() event { o := stickOffer(&meta137, heldDigest); o.reply = reply; return o }(),
			phase: PhaseIdle, effs: []string{"reply error", "close medium"}},
	})
}

func done(k jobKind) evJobDone { return evJobDone{kind: k, id: "held"} }

func doneErr(k jobKind, err error) evJobDone { return evJobDone{kind: k, id: "held", err: err} }

var extracted = &bundle.Result{Digest: heldDigest, TarSize: 10, Approval: bundle.ApprovalDigest, Metadata: &meta137}

func TestStepTable_JobsEnd(t *testing.T) {
	permanent := permanentErr{errBoom}
	diskFull := fmt.Errorf("writing the tar: %w", bundle.ErrDiskFilled)
	runRows(t, []stepRow{
		{name: "extracted and approved: loading starts", in: PhaseDetected, given: []func(*machine){running(jobExtract)},
			ev: evJobDone{kind: jobExtract, id: "held", res: extracted}, phase: PhaseLoading,
			effs: []string{"save held", "share held", "save held", "start load"}},
		{name: "extracted unapproved: it waits for approval, shared", in: PhaseDetected, given: []func(*machine){running(jobExtract), approvalRequired},
			ev: evJobDone{kind: jobExtract, id: "held", res: &bundle.Result{Digest: heldDigest, TarSize: 10, Approval: bundle.ApprovalNone, Metadata: &meta137}},
			phase: PhaseExtracted, why: ReasonAwaitingApproval, effs: []string{"save held", "share held"}},
		{name: "extracted on a node that loads nothing: it says so", in: PhaseDetected, given: []func(*machine){running(jobExtract), noLoader},
			ev: evJobDone{kind: jobExtract, id: "held", res: extracted}, phase: PhaseExtracted, why: ReasonLoadsNothing,
			effs: []string{"save held", "share held", "save held"}},
		{name: "an extraction refused rejects the bundle", in: PhaseDetected, given: []func(*machine){running(jobExtract)},
			ev: doneErr(jobExtract, fmt.Errorf("%w: sha256 mismatch", bundle.ErrMismatch)), phase: PhaseRejected, why: ReasonRefused,
			effs: []string{"save held"}, check: func(t *testing.T, m *machine) {
				if m.active != nil || m.lastBad != m.records["held"] {
					t.Errorf("active %v, last refusal %v", m.active, m.lastBad)
				}
			}},
		{name: "an extraction cut short (stick pulled) waits for the stick", in: PhaseDetected, given: []func(*machine){running(jobExtract)},
			ev: evJobDone{kind: jobExtract, id: "held", stopped: true, err: errors.New("read: no such device")},
			phase: PhaseDetected, why: ReasonCopyInterrupted, effs: []string{"save held"}},
		{name: "a tar whose metadata is not the one read before is rejected", in: PhaseDetected, given: []func(*machine){running(jobExtract)},
			ev: evJobDone{kind: jobExtract, id: "held", res: &bundle.Result{Digest: heldDigest, Metadata: &meta138}},
			phase: PhaseRejected, why: ReasonRefused, effs: []string{"remove 4.13.7-x86_64", "save held"}},
		{name: "a job's end for another phase is ignored", in: PhaseLoaded, given: []func(*machine){running(jobExtract)},
			ev: evJobDone{kind: jobExtract, id: "held", res: extracted}, phase: PhaseLoaded},
		{name: "a job's end for a record gone is ignored", in: PhaseIdle, given: []func(*machine){running(jobLoad)},
			ev: done(jobLoad), phase: PhaseIdle},

		{name: "fetched and extracted in one pass", in: PhaseFetching, given: []func(*machine){running(jobFetch), fromPeer},
			ev: evJobDone{kind: jobFetch, id: "held", res: extracted}, phase: PhaseLoading,
			effs: []string{"remove 1111111111111111111111111111111111111111111111111111111111111111", "save held", "share held", "save held", "start load"}},
		{name: "fetched whole (serial): extracted next", in: PhaseFetching, given: []func(*machine){running(jobFetch)},
			ev: done(jobFetch), phase: PhaseFetching, effs: []string{"remove 4.13.7-x86_64", "start extract"}},
		{name: "a fetch that failed is retried in 10s", in: PhaseFetching, given: []func(*machine){running(jobFetch)},
			ev: doneErr(jobFetch, errors.New("peer gone")), phase: PhaseFetching, why: ReasonFetchFailed,
			effs: []string{"save held", "retry in 10s"}},
		{name: "a fetch that filled the disk is abandoned", in: PhaseFetching, given: []func(*machine){running(jobFetch), fromPeer},
			ev: doneErr(jobFetch, diskFull), phase: PhaseFailed, why: ReasonFetchAbandoned,
			effs: []string{"remove 1111111111111111111111111111111111111111111111111111111111111111", "remove .staging-4.13.7-x86_64", "remove 4.13.7-x86_64", "save held"}},
		{name: "a fetched bundle with no room to extract is fetched again", in: PhaseFetching, given: []func(*machine){running(jobFetch), fromPeer},
			ev: doneErr(jobFetch, fmt.Errorf("%w in /var", bundle.ErrNoSpace)), phase: PhaseFetching, why: ReasonNoRoomToExtract,
			effs: []string{"remove 1111111111111111111111111111111111111111111111111111111111111111", "save held", "retry in 10s"}},
		{name: "a fetch stopped does nothing", in: PhaseFetching, given: []func(*machine){running(jobFetch)},
			ev: evJobDone{kind: jobFetch, id: "held", stopped: true}, phase: PhaseFetching},

		{name: "loaded with no peers: cluster-ready, the hook runs where plugged", in: PhaseLoading, given: []func(*machine){running(jobLoad)},
			ev: done(jobLoad), phase: PhaseClusterReady, effs: []string{"save held", "save held", "save held", "run hook held"}},
		{name: "loaded with a peer not loaded yet: loaded", in: PhaseLoading, given: []func(*machine){running(jobLoad), withPeers(peerIn(PhaseExtracted, heldDigest))},
			ev: done(jobLoad), phase: PhaseLoaded, effs: []string{"save held"}},
		{name: "a load that failed is retried after 5s", in: PhaseLoading, given: []func(*machine){running(jobLoad)},
			ev: doneErr(jobLoad, errBoom), phase: PhaseLoading, why: ReasonLoadFailed, effs: []string{"save held", "retry in 5s"}},
		{name: "the backoff doubles", in: PhaseLoading, given: []func(*machine){running(jobLoad), with(func(m *machine) { m.backoff = 40 * time.Second })},
			ev: doneErr(jobLoad, errBoom), phase: PhaseLoading, why: ReasonLoadFailed, effs: []string{"save held", "retry in 1m20s"}},
		{name: "a load that cannot heal fails", in: PhaseLoading, given: []func(*machine){running(jobLoad)},
			ev: doneErr(jobLoad, permanent), phase: PhaseFailed, why: ReasonLoadFailed, effs: []string{"save held"}},
		{name: "a load stopped does nothing", in: PhaseLoading, given: []func(*machine){running(jobLoad)},
			ev: evJobDone{kind: jobLoad, id: "held", stopped: true}, phase: PhaseLoading},

		{name: "a cleanup done: cleaned, the request answered", in: PhaseExtracted,
			given: []func(*machine){running(jobCleanup), with(func(m *machine) { m.cleanupAsked, m.cleanupReply = true, make(chan error, 1) })},
			ev: done(jobCleanup), phase: PhaseCleaned, effs: []string{"save held", "reply ok"},
			check: func(t *testing.T, m *machine) {
				if m.active != nil || m.cleaned != m.records["held"] || m.cleanupAsked {
					t.Errorf("active %v, cleaned %v, asked %v", m.active, m.cleaned, m.cleanupAsked)
				}
			}},
		{name: "a cleanup that failed is answered, the bundle kept", in: PhaseExtracted,
			given: []func(*machine){running(jobCleanup), with(func(m *machine) { m.cleanupAsked, m.cleanupReply = true, make(chan error, 1) })},
			ev: doneErr(jobCleanup, errBoom), phase: PhaseExtracted, effs: []string{"reply error"}},

		{name: "a retirement done: retired, tree kept", in: PhaseUpgraded, given: []func(*machine){running(jobRetire), retiringHeld},
			ev: done(jobRetire), phase: PhaseUpgraded, effs: []string{"save held"},
			check: func(t *testing.T, m *machine) {
				r := m.records["held"]
				if r.Retirement != RetirementDone || !r.Retained || m.active != nil || m.previous != r || m.done != r {
					t.Errorf("retirement %v, retained %v; active %v, previous %v", r.Retirement, r.Retained, m.active, m.previous)
				}
			}},
		{name: "a retirement done unpins the previous bundle", in: PhaseUpgraded, given: []func(*machine){running(jobRetire), retiringHeld, previousBundle},
			ev: done(jobRetire), phase: PhaseUpgraded, effs: []string{"save prev", "save held"},
			check: func(t *testing.T, m *machine) {
				if p := m.records["prev"]; p.Retirement != RetirementUnpinned || p.Retained {
					t.Errorf("previous: retirement %v, retained %v", p.Retirement, p.Retained)
				}
			}},
		{name: "a retirement that failed is retried in 30s", in: PhaseUpgraded, given: []func(*machine){running(jobRetire), retiringHeld},
			ev: doneErr(jobRetire, errBoom), phase: PhaseUpgraded, why: ReasonCleanupFailed, effs: []string{"save held", "retry in 30s"}},

		{name: "a restore that loaded images again says so", in: PhaseIdle, given: []func(*machine){runningRelease, running(jobRestore)},
			ev: evJobDone{kind: jobRestore, id: "running", restored: 3}, phase: PhaseIdle,
			check: func(t *testing.T, m *machine) {
				if !strings.Contains(m.notice, "CRI-O had lost 3 images") {
					t.Errorf("notice %q", m.notice)
				}
			}},
		{name: "a restore that failed is retried in 15s", in: PhaseIdle, given: []func(*machine){runningRelease, running(jobRestore)},
			ev: evJobDone{kind: jobRestore, id: "running", err: errBoom}, phase: PhaseIdle, effs: []string{"retry in 15s"},
			check: func(t *testing.T, m *machine) {
				if m.restoreDue != "retry" {
					t.Errorf("restore due %q", m.restoreDue)
				}
			}},
		{name: "a restore stopped says nothing", in: PhaseIdle, given: []func(*machine){runningRelease, running(jobRestore)},
			ev: evJobDone{kind: jobRestore, id: "running", stopped: true}, phase: PhaseIdle},
	})
}

type permanentErr struct{ error }

func (permanentErr) Permanent() bool { return true }

// fromPeer: the held bundle came from the peers.
func fromPeer(m *machine) { m.records["held"].Origin, m.records["held"].Source = OriginPeer, peerB }

// runningRelease: the release the cluster runs, upgraded and retired
// here, its tree kept (record "running").
func runningRelease(m *machine) {
	r := &Record{ID: "running", Digest: otherDigest, Name: "upgrade-4.13.6-x86_64.tar", Metadata: &bundle.Metadata{Version: "4.13.6", Arch: "x86_64", Release: "quay.io/r@" + otherDigest},
		Origin: OriginStick, Dir: "/nonexistent/4.13.6-x86_64", Retirement: RetirementDone, Retained: true}
	m.move(r, PhaseUpgraded, Condition{}, Progress{})
	m.done, m.previous = r, r
}

// retiringHeld: the held bundle, upgraded, is being retired.
func retiringHeld(m *machine) {
	m.records["held"].Retirement = RetirementStarted
	m.active = m.records["held"]
}

// previousBundle: the release before the held bundle, upgraded, retired,
// its pins kept.
func previousBundle(m *machine) {
	old := bundle.Metadata{Version: "4.13.6", Arch: "x86_64", Release: "quay.io/r@" + otherDigest}
	p := &Record{ID: "prev", Digest: otherDigest, Name: "upgrade-4.13.6-x86_64.tar", Metadata: &old, Origin: OriginStick,
		Dir: "/nonexistent/4.13.6-x86_64", Retirement: RetirementDone, Retained: true}
	m.move(p, PhaseUpgraded, Condition{}, Progress{})
	m.previous, m.done = p, p
}
