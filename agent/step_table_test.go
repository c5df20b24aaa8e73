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

	"github.com/opencontainers/go-digest"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
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
			if s := m.status(); !machineReason.MatchString(s.Reason) {
				t.Errorf("status reason %q is not a machine reason", s.Reason)
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

// notDesired: ClusterVersion was read, and its desiredUpdate names
// another release than the held bundle's.
func notDesired(m *machine) { m.desired = desiredRead{release: meta137.Release} }

// desiredHeld: ClusterVersion's desiredUpdate names the held bundle's
// release, the operator not started yet.
func desiredHeld(m *machine) { m.desired = desiredRead{release: meta137.Release, names: true} }

// cleanupSpec is the held bundle's spec with cleanup: true.
func cleanupSpec(m *machine) {
	m.bundleName, m.bundlePolicy = ResourceName("4.13.7", "x86_64"), &cluster.BundlePolicy{Cleanup: true}
}

func noLoader(m *machine) { m.hasLoader = false }

func noHook(m *machine) { m.cfg.OnReady = nil }

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

// heldResource is the held bundle's UpgradeBundle (meta137).
const heldResource = "4.13.7-x86-64"

// heldHex names the dir a fetched tar of the held bundle lands in.
var heldHex = strings.TrimPrefix(heldDigest, "sha256:")

func peerIn(p Phase, digest digest.Digest) *peer.PeerStatus {
	return &peer.PeerStatus{Status: peer.Status{Node: "b", Phase: string(p), Digest: digest, Version: "4.13.7"}}
}

func viewOf(st *peer.PeerStatus, offers ...peer.PeerOffer) evView {
	v := view{statuses: map[string]peer.PeerStatus{}, offers: offers, at: time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC)}
	if st != nil {
		v.statuses[peerB] = *st
	}
	return evView{v}
}

func offerOf(t *testing.T, d string, meta bundle.Metadata) peer.PeerOffer {
	t.Helper()
	meta.FormatVersion, meta.Size, meta.SizeBytes, meta.Images = 1, "1 KiB", 1024, []string{"quay.io/x/app@" + heldDigest}
	b, err := json.Marshal(meta)
	if err != nil {
		t.Fatal(err)
	}
	return peer.PeerOffer{Peer: peerB, Offer: peer.Offer{Digest: digest.Digest(d), Metadata: b, Size: 10, Complete: true}}
}

var (
	meta137 = bundle.Metadata{Version: "4.13.7", Arch: "x86_64", Release: "quay.io/r@" + heldDigest}
	meta138 = bundle.Metadata{Version: "4.13.8", Arch: "x86_64", Release: "quay.io/r@" + otherDigest}
	errBoom = errors.New("crio is down")
)

func stickOffer(meta *bundle.Metadata, digest digest.Digest) evOffer {
	return evOffer{origin: OriginStick, device: "/dev/sdb", src: bundle.Source{Path: "/m/upgrade-" + meta.Version + "-x86_64.tar"},
		medium: MediumID(1), meta: meta, digest: digest}
}

func TestStepTable_DevicesAndOffers(t *testing.T) {
	reply := ReplyID(1)
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
				if !m.active.Plugged || m.job.medium == 0 || m.job.device != "/dev/sdb" {
					t.Errorf("active %+v, job %+v", m.active, m.job)
				}
			}},
		{name: "a stick without a bundle is answered, nothing recorded", in: PhaseIdle,
			ev: evOffer{origin: OriginFile, noBundle: true, err: errNoBundle, reply: reply}, phase: PhaseIdle, effs: []string{"reply error"}},
		{name: "an unreadable bundle is rejected", in: PhaseIdle,
			ev:    evOffer{origin: OriginStick, device: "/dev/sdb", src: bundle.Source{Path: "/m/upgrade-x.tar"}, err: bundle.ErrInvalid},
			phase: PhaseRejected, why: ReasonInvalidBundle, effs: []string{"save x-20261122T080000"},
			check: func(t *testing.T, m *machine) {
				// syncBundle's Event is a Warning when the report is unhealthy.
				if rep := m.resourceReport(m.status()); rep != nil && rep.healthy || m.status().Healthy {
					t.Errorf("a refusal reported healthy: %+v", rep)
				}
			}},
		{name: "a stick plugged after a refusal is probed", in: PhaseRejected,
			ev: evDevice{DeviceEvent{Action: "add", Device: "/dev/sdb"}}, phase: PhaseRejected, effs: []string{"probe stick"}},
		{name: "after a cleanup, the next bundle is extracted", in: PhaseCleaned,
			ev: stickOffer(&meta138, otherDigest), phase: PhaseCleaned,
			effs: []string{"save 4.13.8-x86_64-20261122T080000", "remove 4.13.8-x86_64", "start extract"}},
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
				if s := m.status(); s.Digest != heldDigest || !strings.Contains(s.Error, "upgrade-4.13.8-x86_64.tar") {
					t.Errorf("status %+v: want the held bundle shown, the other named", s)
				}
			}},
		{name: "the interrupted bundle plugged again resumes its copy", in: PhaseDetected,
			ev: stickOffer(&meta137, heldDigest), phase: PhaseDetected, effs: []string{"save held", "remove 4.13.7-x86_64", "start extract"}},
		{name: "the bundle being read, offered again, is noted", in: PhaseDetected, given: []func(*machine){running(jobExtract)},
			ev:    func() event { o := stickOffer(&meta137, heldDigest); o.reply = reply; return o }(),
			phase: PhaseDetected, effs: []string{"reply ok", "close medium"}},
		{name: "a new bundle offered while a job runs is answered busy", in: PhaseIdle, given: []func(*machine){running(jobRestore)},
			ev:    func() event { o := stickOffer(&meta137, heldDigest); o.reply = reply; return o }(),
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
			ev:    evJobDone{kind: jobExtract, id: "held", res: &bundle.Result{Digest: heldDigest, TarSize: 10, Approval: bundle.ApprovalNone, Metadata: &meta137}},
			phase: PhaseExtracted, why: ReasonAwaitingApproval, effs: []string{"save held", "share held"},
			check: func(t *testing.T, m *machine) {
				if c := m.records["held"].Condition.Message; !strings.Contains(c, heldDigest) || !strings.Contains(c, "approved_digests") || m.status().ApprovalOff {
					t.Errorf("condition %q: want the digest read and the config key to approve it", c)
				}
			}},
		{name: "extracted on a node that loads nothing: it says so", in: PhaseDetected, given: []func(*machine){running(jobExtract), noLoader},
			ev: evJobDone{kind: jobExtract, id: "held", res: extracted}, phase: PhaseExtracted, why: ReasonLoadsNothing,
			effs: []string{"save held", "share held", "save held"}},
		{name: "an extraction refused rejects the bundle", in: PhaseDetected, given: []func(*machine){running(jobExtract)},
			ev: doneErr(jobExtract, fmt.Errorf("%w: sha256 mismatch", bundle.ErrMismatch)), phase: PhaseRejected, why: ReasonDigestMismatch,
			effs: []string{"save held"}, check: func(t *testing.T, m *machine) {
				if m.active != nil || m.lastBad != m.records["held"] {
					t.Errorf("active %v, last refusal %v", m.active, m.lastBad)
				}
			}},
		{name: "an extraction cut short (stick pulled) waits for the stick", in: PhaseDetected, given: []func(*machine){running(jobExtract)},
			ev:    evJobDone{kind: jobExtract, id: "held", stopped: true, err: errors.New("read: no such device")},
			phase: PhaseDetected, why: ReasonCopyInterrupted, effs: []string{"save held"}},
		{name: "an extraction of a file cut short asks for ferry load of that file again, not for a stick", in: PhaseDetected,
			given: []func(*machine){running(jobExtract), with(func(m *machine) {
				m.records["held"].Origin, m.records["held"].Source = OriginFile, "/root/upgrade-4.13.7-x86_64.tar"
			})},
			ev:    evJobDone{kind: jobExtract, id: "held", err: errors.New("read: input/output error")},
			phase: PhaseDetected, why: ReasonCopyInterrupted, effs: []string{"save held"},
			check: func(t *testing.T, m *machine) {
				// The command to run again names the file the technician gave.
				if msg := m.records["held"].Condition.Message; !strings.Contains(msg, "ferry load /root/upgrade-4.13.7-x86_64.tar") {
					t.Errorf("message %q", msg)
				}
			}},
		{name: "a tar whose metadata is not the one read before is rejected", in: PhaseDetected, given: []func(*machine){running(jobExtract)},
			ev:    evJobDone{kind: jobExtract, id: "held", res: &bundle.Result{Digest: heldDigest, Metadata: &meta138}},
			phase: PhaseRejected, why: ReasonInvalidBundle, effs: []string{"remove 4.13.7-x86_64", "save held"}},
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
		{name: "the retry after a failed load loads again", in: PhaseLoading, ev: evRetry{}, phase: PhaseLoading, effs: []string{"save held", "start load"}},
		{name: "a load stopped does nothing", in: PhaseLoading, given: []func(*machine){running(jobLoad)},
			ev: evJobDone{kind: jobLoad, id: "held", stopped: true}, phase: PhaseLoading},

		{name: "a cleanup done: cleaned, the request answered", in: PhaseExtracted,
			given: []func(*machine){running(jobCleanup), with(func(m *machine) { m.cleanupAsked, m.cleanupReply = true, ReplyID(1) })},
			ev:    done(jobCleanup), phase: PhaseCleaned, effs: []string{"save held", "reply ok"},
			check: func(t *testing.T, m *machine) {
				if m.active != nil || m.cleaned != m.records["held"] || m.cleanupAsked {
					t.Errorf("active %v, cleaned %v, asked %v", m.active, m.cleaned, m.cleanupAsked)
				}
			}},
		{name: "a cleanup that failed is answered, the bundle kept", in: PhaseExtracted,
			given: []func(*machine){running(jobCleanup), with(func(m *machine) { m.cleanupAsked, m.cleanupReply = true, ReplyID(1) })},
			ev:    doneErr(jobCleanup, errBoom), phase: PhaseExtracted, effs: []string{"reply error"}},

		{name: "a retirement done: retired, tree kept", in: PhaseUpgraded, given: []func(*machine){running(jobRetire), retiringHeld},
			ev: done(jobRetire), phase: PhaseUpgraded, effs: []string{"save held"},
			check: func(t *testing.T, m *machine) {
				r := m.records["held"]
				if r.Retirement != RetirementDone || !r.Retained || m.active != nil || m.previous != r || m.done != r {
					t.Errorf("retirement %v, retained %v; active %v, previous %v", r.Retirement, r.Retained, m.active, m.previous)
				}
				if s := m.status(); s.Phase != string(PhaseUpgraded) || annotations(s)[AnnotationReason] != "" || m.readsNode() {
					t.Errorf("status %+v: want upgraded, no reason on the Node, the node no longer read", s)
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

func TestStepTable_PeersRequestsAndTheCluster(t *testing.T) {
	reply := ReplyID(1)
	cleanupAsked := with(func(m *machine) { m.cleanupAsked, m.cleanupReply = true, ReplyID(1) })
	managed := func(st string, cur, des, target string, paused bool) cluster.NodeUpdate {
		return cluster.NodeUpdate{Managed: true, State: st, Current: cur, Desired: des, Pool: "worker", Target: target, Paused: paused}
	}
	upgradedWaiting := with(func(m *machine) {
		m.hasAPI = true
		m.records["held"].MachineConfig = "rendered-old"
		m.active = m.records["held"]
	})
	runRows(t, []stepRow{
		// Peer views: offers, conflicts, the gate.
		{name: "an idle node fetches the one bundle the peers offer", in: PhaseIdle,
			ev: viewOf(nil, offerOf(t, heldDigest, meta137)), phase: PhaseFetching,
			effs: []string{"save 4.13.7-x86_64-20261122T080000", "remove 4.13.7-x86_64", "start fetch"}},
		{name: "two bundles offered is a conflict, nothing fetched", in: PhaseIdle,
			ev: viewOf(nil, offerOf(t, heldDigest, meta137), offerOf(t, otherDigest, meta138)), phase: PhaseConflict, why: ReasonBundlesDiffer,
			effs: []string{"save cluster-20261122T080000"}},
		{name: "an offer from a peer whose status names another node than its certificate is not looked at: no conflict", in: PhaseIdle,
			ev: func() evView {
				liar := offerOf(t, otherDigest, meta138)
				liar.Peer = "10.0.0.9:8090"
				v := viewOf(nil, offerOf(t, heldDigest, meta137), liar)
				v.statuses[liar.Peer] = peer.PeerStatus{Verified: "node-x", Err: fmt.Errorf("peer %s: %w", liar.Peer, peer.ErrNodeMismatch)}
				return v
			}(), phase: PhaseFetching,
			effs: []string{"save 4.13.7-x86_64-20261122T080000", "remove 4.13.7-x86_64", "start fetch"}},
		{name: "an offer from a node the administrator excluded is not looked at: no conflict", in: PhaseIdle,
			given: []func(*machine){with(func(m *machine) { m.excluded = map[string]string{"node-x": "listed in spec.excludedNodes"} })},
			ev: func() evView {
				other := offerOf(t, otherDigest, meta138)
				other.Peer = "10.0.0.9:8090"
				v := viewOf(nil, offerOf(t, heldDigest, meta137), other)
				v.statuses[other.Peer] = peer.PeerStatus{Status: peer.Status{Node: "node-x", Phase: string(PhaseLoaded), Digest: otherDigest}, Verified: "node-x"}
				return v
			}(), phase: PhaseFetching,
			effs: []string{"save 4.13.7-x86_64-20261122T080000", "remove 4.13.7-x86_64", "start fetch"}},
		{name: "an offer this node's policy refuses is rejected before a byte is fetched", in: PhaseIdle, given: []func(*machine){approvalRequired},
			ev: viewOf(nil, offerOf(t, heldDigest, meta137)), phase: PhaseRejected, why: ReasonNotApproved,
			effs: []string{"save 4.13.7-x86_64-20261122T080000"},
			check: func(t *testing.T, m *machine) {
				// It tells its peers which bundle it refused, so that they do not pin it.
				if ps := m.peerStatus(m.status()); ps.Phase != string(PhaseRejected) || ps.Digest != heldDigest || ps.Error == "" {
					t.Errorf("peer status %+v", ps)
				}
			}},
		{name: "an offer approved only in another UpgradeBundle is refused (issue 45)", in: PhaseIdle,
			given: []func(*machine){approvalRequired, with(func(m *machine) { m.clusterApproved = []cluster.Approval{{Bundle: "4.13.7-amd64", Digest: heldDigest}} })},
			ev:    viewOf(nil, offerOf(t, heldDigest, meta137)), phase: PhaseRejected, why: ReasonNotApproved,
			effs: []string{"save 4.13.7-x86_64-20261122T080000"}},
		{name: "an offer approved in its own UpgradeBundle is fetched", in: PhaseIdle,
			given: []func(*machine){approvalRequired, with(func(m *machine) { m.clusterApproved = []cluster.Approval{{Bundle: heldResource, Digest: heldDigest}} })},
			ev:    viewOf(nil, offerOf(t, heldDigest, meta137)), phase: PhaseFetching,
			effs: []string{"save 4.13.7-x86_64-20261122T080000", "remove 4.13.7-x86_64", "start fetch"}},
		{name: "a peer's bundle refused before, now approved (a restart with the digest added), is fetched", in: PhaseRejected,
			given: []func(*machine){fromPeer, approvalRequired, with(func(m *machine) {
				m.records["held"].Dir = "" // refused by the policy, never fetched
				m.policy.ApprovedDigests = []string{heldDigest}
			})},
			ev: viewOf(nil, offerOf(t, heldDigest, meta137)), phase: PhaseRejected,
			effs: []string{"save 4.13.7-x86_64-20261122T080000", "remove 4.13.7-x86_64", "start fetch"},
			check: func(t *testing.T, m *machine) {
				if m.active == nil || m.active.Phase != PhaseFetching || m.active.Digest != heldDigest {
					t.Errorf("active %+v, want the bundle fetched", m.active)
				}
			}},
		{name: "a bundle cleaned up here is not fetched again", in: PhaseCleaned,
			ev: viewOf(nil, offerOf(t, heldDigest, meta137)), phase: PhaseCleaned},
		{name: "extracted, a peer holding another bundle: a conflict, not loaded", in: PhaseExtracted, given: []func(*machine){approvedHeld, withPeers(nil)},
			ev: viewOf(peerIn(PhaseExtracted, otherDigest)), phase: PhaseExtracted, why: ReasonPeerHoldsOther, effs: []string{"save held"},
			check: func(t *testing.T, m *machine) {
				// In conflict, it still tells its peers its bundle: a peer
				// polling it later would otherwise not see the conflict.
				ps := m.peerStatus(m.status())
				if ps.Digest != heldDigest || ps.Phase != string(PhaseExtracted) {
					t.Errorf("peers are told %s %q", ps.Phase, ps.Digest)
				}
				if d := m.cluster(ps).Decision; d.Verdict != Conflict || len(d.Digests) != 2 {
					t.Errorf("cluster decision %+v, want a conflict between both bundles", d)
				}
			}},
		{name: "extracted, a peer refusing the bundle: it waits", in: PhaseExtracted, given: []func(*machine){approvedHeld, withPeers(nil)},
			ev:    viewOf(&peer.PeerStatus{Status: peer.Status{Node: "b", Phase: string(PhaseRejected), Digest: heldDigest, Error: "not approved"}}),
			phase: PhaseExtracted, why: ReasonPeerRefuses, effs: []string{"save held"}},
		{name: "extracted, a peer unreachable: it waits for it", in: PhaseExtracted, given: []func(*machine){approvedHeld, withPeers(nil)},
			ev: viewOf(&peer.PeerStatus{Err: errors.New("connection refused")}), phase: PhaseExtracted, why: ReasonPeersNotHolding, effs: []string{"save held"}},
		{name: "extracted, the peer holding it too: loading starts", in: PhaseExtracted, given: []func(*machine){approvedHeld, withPeers(nil)},
			ev: viewOf(peerIn(PhaseExtracted, heldDigest)), phase: PhaseLoading, effs: []string{"save held", "start load"}},
		{name: "extracted, no view of the peers yet: it waits to hear", in: PhaseExtracted,
			given: []func(*machine){approvedHeld, withPeers(nil), with(func(m *machine) { m.view = view{} })},
			ev:    evRetry{}, phase: PhaseExtracted, why: ReasonPeersUnheard, effs: []string{"save held"}},
		{name: "the same wait again saves nothing", in: PhaseExtracted,
			given: []func(*machine){approvedHeld, withPeers(nil), with(func(m *machine) {
				m.view = view{}
				m.records["held"].Condition = waiting(ReasonPeersUnheard, "waiting to hear from the peers")
			})},
			ev: evRetry{}, phase: PhaseExtracted, why: ReasonPeersUnheard},
		{name: "the gate opens when every node is loaded: cluster-ready, the hook runs", in: PhaseLoaded, given: []func(*machine){withPeers(nil)},
			ev: viewOf(peerIn(PhaseLoaded, heldDigest)), phase: PhaseClusterReady, effs: []string{"save held", "save held", "run hook held"}},
		{name: "the gate stays shut while a peer is not loaded", in: PhaseLoaded, given: []func(*machine){withPeers(nil)},
			ev: viewOf(peerIn(PhaseLoading, heldDigest)), phase: PhaseLoaded},
		{name: "the gate on a peer never heard from stays shut", in: PhaseLoaded, given: []func(*machine){withPeers(nil)},
			ev: viewOf(nil), phase: PhaseLoaded},
		{name: "the gate opens on Manual without the hook", in: PhaseLoaded,
			given: []func(*machine){withPeers(nil), with(func(m *machine) { m.cfg.Schedule = "Manual" })},
			ev:    viewOf(peerIn(PhaseLoaded, heldDigest)), phase: PhaseClusterReady, effs: []string{"save held"}},
		{name: "cluster-ready, another poll does not run the hook again", in: PhaseClusterReady,
			given: []func(*machine){withPeers(nil), with(func(m *machine) { m.records["held"].Hook = &HookRun{Started: m.now()} })},
			ev:    viewOf(peerIn(PhaseLoaded, heldDigest)), phase: PhaseClusterReady},
		{name: "a node that joins after the upgrade is upgraded at once", in: PhaseLoaded, given: []func(*machine){withPeers(nil)},
			ev: viewOf(peerIn(PhaseUpgraded, heldDigest)), phase: PhaseUpgraded, why: ReasonCleaningUp,
			effs: []string{"save held", "start retire unload retain"}},

		// Requests from the local socket.
		{name: "ferry load with no bundle is answered", in: PhaseIdle, ev: evRequest{kind: reqLoad, reply: reply},
			phase: PhaseIdle, effs: []string{"reply error"}},
		{name: "ferry load probes the file", in: PhaseIdle, ev: evRequest{kind: reqLoad, medium: MediumID(1), reply: reply},
			phase: PhaseIdle, effs: []string{"probe file"}},
		{name: "ferry load of a bundle made from the registry approves it", in: PhaseIdle,
			ev: evRequest{kind: reqLoad, medium: MediumID(1), approve: otherDigest, reply: reply}, phase: PhaseIdle, effs: []string{"probe file"},
			check: func(t *testing.T, m *machine) {
				if !m.polFor(nil).Approves(otherDigest) {
					t.Error("the registry's bundle is not approved")
				}
			}},
		{name: "ferry load while busy closes the files and says busy", in: PhaseLoading, given: []func(*machine){running(jobLoad)},
			ev: evRequest{kind: reqLoad, medium: MediumID(1), reply: reply}, phase: PhaseLoading, effs: []string{"close medium", "reply error"}},
		{name: "ferry cleanup with nothing held is answered", in: PhaseIdle, ev: evRequest{kind: reqCleanup, reply: reply},
			phase: PhaseIdle, effs: []string{"reply error"}},
		{name: "ferry cleanup of an extracted bundle starts its cleanup", in: PhaseExtracted, ev: evRequest{kind: reqCleanup, reply: reply},
			phase: PhaseExtracted, effs: []string{"start cleanup unload"}},
		{name: "ferry cleanup while a job runs stops it first", in: PhaseLoading, given: []func(*machine){running(jobLoad)},
			ev: evRequest{kind: reqCleanup, reply: reply}, phase: PhaseLoading, effs: []string{"stop job"}},
		{name: "ferry cleanup of a loaded bundle without an API is the upgrade done", in: PhaseClusterReady,
			ev: evRequest{kind: reqCleanup, reply: reply}, phase: PhaseUpgraded, why: ReasonCleaningUp, effs: []string{"save held", "start retire unload retain"}},
		{name: "ferry cleanup while the cluster upgrades to it is refused", in: PhaseUpgrading, given: []func(*machine){withAPI},
			ev: evRequest{kind: reqCleanup, reply: reply}, phase: PhaseUpgrading, effs: []string{"reply error"}},
		{name: "a second ferry cleanup is answered", in: PhaseExtracted, given: []func(*machine){running(jobCleanup), cleanupAsked},
			ev: evRequest{kind: reqCleanup, reply: reply}, phase: PhaseExtracted, effs: []string{"reply error"}},
		{name: "ferry cleanup of an upgraded bundle waiting for the MCO retires it now", in: PhaseUpgraded, given: []func(*machine){upgradedWaiting},
			ev: evRequest{kind: reqCleanup, reply: reply}, phase: PhaseUpgraded, why: ReasonCleaningUp, effs: []string{"save held", "start retire unload retain"}},
		{name: "ferry cleanup of a bundle retired already has nothing to do", in: PhaseUpgraded,
			given: []func(*machine){with(func(m *machine) {
				r := m.records["held"]
				r.Retirement, r.Retained, m.active, m.done, m.previous = RetirementDone, true, nil, r, r
			})},
			ev: evRequest{kind: reqCleanup, reply: reply}, phase: PhaseUpgraded, effs: []string{"reply error"}},
		{name: "ferry proceed before cluster-ready is refused", in: PhaseLoaded, ev: evRequest{kind: reqProceed, reply: reply},
			phase: PhaseLoaded, effs: []string{"reply error"}},
		{name: "ferry proceed at cluster-ready runs the hook", in: PhaseClusterReady, ev: evRequest{kind: reqProceed, reply: reply},
			phase: PhaseClusterReady, effs: []string{"save held", "run hook held", "reply ok"}},
		{name: "ferry proceed after the hook succeeded has nothing to do", in: PhaseClusterReady,
			given: []func(*machine){with(func(m *machine) { m.records["held"].Hook = &HookRun{Started: m.now(), Finished: m.now()} })},
			ev:    evRequest{kind: reqProceed, reply: reply}, phase: PhaseClusterReady, effs: []string{"reply error"}},
		{name: "ferry proceed after the hook failed runs it again", in: PhaseClusterReady,
			given: []func(*machine){with(func(m *machine) {
				m.records["held"].Hook = &HookRun{Started: m.now(), Finished: m.now(), Exit: 1, Error: "exit 1"}
			})},
			ev: evRequest{kind: reqProceed, reply: reply}, phase: PhaseClusterReady, effs: []string{"save held", "run hook held", "reply ok"}},
		{name: "ferry proceed with an API asks the cluster for the upgrade", in: PhaseClusterReady, given: []func(*machine){withAPI},
			ev: evRequest{kind: reqProceed, reply: reply}, phase: PhaseClusterReady, effs: []string{"save held", "ask upgrade held", "reply ok"}},

		// The cluster's approvals, sources and UpgradeBundle spec.
		{name: "the cluster approving a waiting bundle loads it, no restart", in: PhaseExtracted, given: []func(*machine){approvalRequired},
			ev: evClusterApprovals{approvals: []cluster.Approval{{Bundle: heldResource, Digest: heldDigest}}}, phase: PhaseLoading, effs: []string{"save held", "start load"}},
		{name: "an approval in another UpgradeBundle approves nothing and names the one that counts (issue 45)", in: PhaseExtracted, given: []func(*machine){approvalRequired, withAPI},
			ev: evClusterApprovals{approvals: []cluster.Approval{{Bundle: "4.13.7-amd64", Digest: heldDigest}}}, phase: PhaseExtracted, why: ReasonAwaitingApproval,
			effs: []string{"save held"},
			check: func(t *testing.T, m *machine) {
				if msg := m.records["held"].Condition.Message; !strings.Contains(msg, "UpgradeBundle 4.13.7-amd64 approves") || !strings.Contains(msg, "from UpgradeBundle "+heldResource+" only") {
					t.Errorf("the status says %q", msg)
				}
			}},
		{name: "the cluster approving another digest: it still waits", in: PhaseExtracted,
			given: []func(*machine){approvalRequired, with(func(m *machine) {
				m.records["held"].Condition = waiting(ReasonAwaitingApproval, m.waitingForApproval(m.records["held"]))
			})},
			ev: evClusterApprovals{approvals: []cluster.Approval{{Bundle: heldResource, Digest: otherDigest}}}, phase: PhaseExtracted, why: ReasonAwaitingApproval},
		{name: "the same approvals again do nothing", in: PhaseExtracted,
			given: []func(*machine){approvalRequired, with(func(m *machine) { m.clusterApproved = []cluster.Approval{{Bundle: heldResource, Digest: otherDigest}} })},
			ev:    evClusterApprovals{approvals: []cluster.Approval{{Bundle: heldResource, Digest: otherDigest}}}, phase: PhaseExtracted},
		{name: "sources read: a bundle extracted unapproved still waits (a source approves at extraction, by what the tree holds)", in: PhaseExtracted,
			given: []func(*machine){approvalRequired, with(func(m *machine) {
				m.records["held"].Condition = waiting(ReasonAwaitingApproval, m.waitingForApproval(m.records["held"]))
			})},
			ev: evClusterSources{sources: []bundle.ReleaseSource{{Release: meta137.Release, Digest: heldDigest}}}, phase: PhaseExtracted, why: ReasonAwaitingApproval,
			check: func(t *testing.T, m *machine) {
				if len(m.polFor(nil).ApprovedSources) != 1 || m.polFor(nil).SourceFor(heldDigest, &meta137) == nil {
					t.Errorf("sources %+v", m.polFor(nil).ApprovedSources)
				}
				// Only the bundle the puller published is of the source.
				if m.polFor(nil).SourceFor(otherDigest, &meta137) != nil {
					t.Errorf("a bundle the puller did not publish is taken for its source")
				}
			}},
		{name: "sources read while loaded do nothing", in: PhaseLoaded,
			ev: evClusterSources{sources: []bundle.ReleaseSource{{Release: meta137.Release}}}, phase: PhaseLoaded},
		{name: "a spec approving another digest holds the load", in: PhaseExtracted, given: []func(*machine){approvedHeld, withAPI},
			ev:    evBundlePolicy{name: ResourceName("4.13.7", "x86_64"), policy: cluster.BundlePolicy{ApprovedDigest: otherDigest}},
			phase: PhaseExtracted, why: ReasonOtherBundleApproved, effs: []string{"save held"}},
		{name: "a spec approving this bundle, the unreachable node excluded: loading starts", in: PhaseExtracted,
			given: []func(*machine){approvedHeld, withAPI, withPeers(&peer.PeerStatus{Err: errors.New("connection refused")})},
			ev:    excludeB(cluster.BundlePolicy{ApprovedDigest: heldDigest}), phase: PhaseLoading, effs: []string{"save held", "start load"}},
		{name: "the unreachable node excluded (listed, or NotReady too long): loading starts", in: PhaseExtracted,
			given: []func(*machine){approvedHeld, withAPI, withPeers(&peer.PeerStatus{Err: errors.New("connection refused")})},
			ev:    excludeB(cluster.BundlePolicy{}), phase: PhaseLoading, effs: []string{"save held", "start load"}},
		{name: "the unreachable node excluded while loaded: the gate opens", in: PhaseLoaded,
			given: []func(*machine){withAPI, withPeers(&peer.PeerStatus{Err: errors.New("connection refused")})},
			ev:    excludeB(cluster.BundlePolicy{}), phase: PhaseClusterReady, effs: []string{"save held", "save held", "ask upgrade held"}},
		{name: "a spec cleanup of a bundle waiting for approval takes it out", in: PhaseExtracted, given: []func(*machine){approvalRequired, withAPI},
			ev:    evBundlePolicy{name: ResourceName("4.13.7", "x86_64"), policy: cluster.BundlePolicy{Cleanup: true}},
			phase: PhaseExtracted, effs: []string{"start cleanup unload"}},
		{name: "spec.cleanup takes a loaded bundle out", in: PhaseClusterReady, given: []func(*machine){withAPI, notDesired},
			ev:    evBundlePolicy{name: ResourceName("4.13.7", "x86_64"), policy: cluster.BundlePolicy{Cleanup: true}},
			phase: PhaseClusterReady, effs: []string{"start cleanup unload"}},
		// Issue 45, item 2: never while ClusterVersion asks for the release.
		{name: "spec.cleanup while desiredUpdate names the release is refused with the way out", in: PhaseClusterReady, given: []func(*machine){withAPI, desiredHeld},
			ev:    evBundlePolicy{name: ResourceName("4.13.7", "x86_64"), policy: cluster.BundlePolicy{Cleanup: true}},
			phase: PhaseClusterReady, why: ReasonCleanupRefused, effs: []string{"save held"},
			check: func(t *testing.T, m *machine) {
				if msg := m.records["held"].Condition.Message; !strings.Contains(msg, "oc adm upgrade --clear") || !strings.Contains(msg, meta137.Release) {
					t.Errorf("the status says %q", msg)
				}
			}},
		{name: "spec.cleanup right after ferry asked, its copy not showing it yet, is refused", in: PhaseClusterReady,
			given: []func(*machine){withAPI, notDesired, with(func(m *machine) { m.askedUnseen = true })},
			ev:    evBundlePolicy{name: ResourceName("4.13.7", "x86_64"), policy: cluster.BundlePolicy{Cleanup: true}},
			phase: PhaseClusterReady, why: ReasonCleanupRefused, effs: []string{"save held"}},
		{name: "spec.cleanup at cluster-ready before ClusterVersion is read waits for it", in: PhaseClusterReady, given: []func(*machine){withAPI},
			ev:    evBundlePolicy{name: ResourceName("4.13.7", "x86_64"), policy: cluster.BundlePolicy{Cleanup: true}},
			phase: PhaseClusterReady, why: ReasonCleanupRefused, effs: []string{"save held"}},
		{name: "a reading that desiredUpdate names the release keeps the refusal, not the pending line", in: PhaseClusterReady,
			given: []func(*machine){withAPI, cleanupSpec},
			ev:    evUpgradeSeen{release: meta137.Release, st: cluster.UpgradeStatus{State: cluster.UpgradePending}},
			phase: PhaseClusterReady, why: ReasonCleanupRefused, effs: []string{"save held"}},
		{name: "desiredUpdate cleared (oc adm upgrade --clear): the standing spec.cleanup goes on", in: PhaseClusterReady,
			given: []func(*machine){withAPI, cleanupSpec, desiredHeld},
			ev:    evUpgradeSeen{release: meta137.Release, st: cluster.UpgradeStatus{State: cluster.UpgradeNotAsked}},
			phase: PhaseClusterReady, effs: []string{"start cleanup unload"}},
		{name: "ferry cleanup while desiredUpdate names the release is refused", in: PhaseClusterReady, given: []func(*machine){withAPI, desiredHeld},
			ev: evRequest{kind: reqCleanup, reply: reply}, phase: PhaseClusterReady, effs: []string{"reply error"}},
		{name: "the gate never asks for a release whose bundle spec.cleanup takes out", in: PhaseLoaded,
			given: []func(*machine){withAPI, withPeers(nil), cleanupSpec},
			ev:    viewOf(peerIn(PhaseLoaded, heldDigest)), phase: PhaseClusterReady, effs: []string{"save held"}},
		{name: "spec.proceed on Manual asks for the upgrade", in: PhaseClusterReady,
			given: []func(*machine){withAPI, with(func(m *machine) { m.cfg.Schedule = "Manual" })},
			ev:    evBundlePolicy{name: ResourceName("4.13.7", "x86_64"), policy: cluster.BundlePolicy{Schedule: "Manual", Proceed: true}},
			phase: PhaseClusterReady, effs: []string{"save held", "ask upgrade held"}},
		{name: "Manual in the spec: the gate opens, nothing asked", in: PhaseLoaded,
			given: []func(*machine){withAPI, withPeers(nil), with(func(m *machine) {
				m.bundleName, m.bundlePolicy = ResourceName("4.13.7", "x86_64"), &cluster.BundlePolicy{Schedule: "Manual"}
			})},
			ev: viewOf(peerIn(PhaseLoaded, heldDigest)), phase: PhaseClusterReady, effs: []string{"save held"}},
		{name: "another bundle's spec does nothing here", in: PhaseClusterReady, given: []func(*machine){withAPI},
			ev: evBundlePolicy{name: ResourceName("4.13.8", "x86_64"), policy: cluster.BundlePolicy{Cleanup: true}}, phase: PhaseClusterReady},

		// Following the cluster's upgrade.
		{name: "the ask refused is retried, said once", in: PhaseClusterReady,
			given: []func(*machine){withAPI, with(func(m *machine) { m.asking = true; m.records["held"].Upgrade = &UpgradeRun{Requested: m.now()} })},
			ev:    evUpgradeAsked{id: "held", err: errors.New("connection refused")}, phase: PhaseClusterReady, why: ReasonUpgradeRequestFailed, effs: []string{"save held"}},
		{name: "the release not approved by the administrator: waiting, healthy, the command that approves it shown", in: PhaseClusterReady,
			given: []func(*machine){withAPI, with(func(m *machine) { m.asking = true; m.records["held"].Upgrade = &UpgradeRun{Requested: m.now()} })},
			ev:    evUpgradeAsked{id: "held", err: fmt.Errorf("writing the release signatures: %w: denied", cluster.ErrReleaseUnapproved)},
			phase: PhaseClusterReady, why: ReasonReleaseUnapproved, effs: []string{"save held"},
			check: func(t *testing.T, m *machine) {
				s := m.status()
				if !s.Healthy || !strings.Contains(annotations(s)[AnnotationReason], cluster.ApproveCommand(meta137.Release)) || !m.asking {
					t.Errorf("status %+v asking %v: want healthy, the oc command on the Node, still asking", s, m.asking)
				}
			}},
		{name: "the ask accepted runs the hook", in: PhaseClusterReady,
			given: []func(*machine){withAPI, with(func(m *machine) { m.asking = true; m.records["held"].Upgrade = &UpgradeRun{Requested: m.now()} })},
			ev:    evUpgradeAsked{id: "held"}, phase: PhaseClusterReady, effs: []string{"save held", "save held", "run hook held"}},
		{name: "the operator at work: upgrading", in: PhaseClusterReady, given: []func(*machine){withAPI},
			ev:    evUpgradeSeen{release: meta137.Release, st: cluster.UpgradeStatus{State: cluster.UpgradeRunning, Message: "Working towards 4.13.7"}},
			phase: PhaseUpgrading, effs: []string{"save held"}},
		{name: "the operator not started yet", in: PhaseClusterReady, given: []func(*machine){withAPI},
			ev: evUpgradeSeen{release: meta137.Release, st: cluster.UpgradeStatus{State: cluster.UpgradePending}}, phase: PhaseClusterReady, why: ReasonUpgradePending, effs: []string{"save held"}},
		{name: "the release refused, in the operator's words", in: PhaseClusterReady, given: []func(*machine){withAPI},
			ev:    evUpgradeSeen{release: meta137.Release, st: cluster.UpgradeStatus{State: cluster.UpgradeRefused, Reason: "cannot be verified"}},
			phase: PhaseClusterReady, why: ReasonReleaseRefused, effs: []string{"save held"},
			check: func(t *testing.T, m *machine) {
				if s := m.status(); s.Healthy || !strings.Contains(annotations(s)[AnnotationReason], "cannot be verified") {
					t.Errorf("status %+v: want unhealthy, the operator's words on the Node", s)
				}
			}},
		{name: "an upgrade found completed at cluster-ready: upgraded", in: PhaseClusterReady, given: []func(*machine){withAPI},
			ev: evUpgradeSeen{release: meta137.Release, st: cluster.UpgradeStatus{State: cluster.UpgradeCompleted}}, phase: PhaseUpgraded, why: ReasonNodeUnread, effs: []string{"save held"}},
		{name: "another release's upgrade says nothing of this bundle", in: PhaseClusterReady, given: []func(*machine){withAPI},
			ev: evUpgradeSeen{release: meta138.Release, st: cluster.UpgradeStatus{State: cluster.UpgradeCompleted}}, phase: PhaseClusterReady},
		{name: "completed, the node not read yet: it waits for its state", in: PhaseUpgrading, given: []func(*machine){withAPI},
			ev: evUpgradeSeen{release: meta137.Release, st: cluster.UpgradeStatus{State: cluster.UpgradeCompleted}}, phase: PhaseUpgraded, why: ReasonNodeUnread, effs: []string{"save held"}},
		{name: "cluster-ready: the node's config from before the upgrade is recorded", in: PhaseClusterReady, given: []func(*machine){withAPI},
			ev: evNodeSeen{managed("Done", "rendered-old", "rendered-old", "rendered-old", false)}, phase: PhaseClusterReady, effs: []string{"save held"},
			check: func(t *testing.T, m *machine) {
				if got := m.records["held"].MachineConfig; got != "rendered-old" {
					t.Errorf("machine config %q", got)
				}
			}},
		{name: "cluster-ready on a node without the MCO: no config recorded", in: PhaseClusterReady, given: []func(*machine){withAPI},
			ev: evNodeSeen{cluster.NodeUpdate{}}, phase: PhaseClusterReady,
			check: func(t *testing.T, m *machine) {
				if got := m.records["held"].MachineConfig; got != "" {
					t.Errorf("machine config %q", got)
				}
			}},
		{name: "upgraded, the pool not at the node yet: it keeps the bundle", in: PhaseUpgraded, given: []func(*machine){upgradedWaiting},
			ev: evNodeSeen{managed("Done", "rendered-old", "rendered-old", "rendered-new", false)}, phase: PhaseUpgraded, why: ReasonNodeUpdating, effs: []string{"save held"}},
		{name: "upgraded, the MCO at work on the node: it keeps the bundle", in: PhaseUpgraded, given: []func(*machine){upgradedWaiting},
			ev: evNodeSeen{managed("Working", "rendered-old", "rendered-new", "rendered-new", false)}, phase: PhaseUpgraded, why: ReasonNodeUpdating, effs: []string{"save held"}},
		{name: "upgraded, the pool paused: it keeps the bundle", in: PhaseUpgraded, given: []func(*machine){upgradedWaiting},
			ev: evNodeSeen{managed("Done", "rendered-old", "rendered-old", "rendered-new", true)}, phase: PhaseUpgraded, why: ReasonPoolPaused, effs: []string{"save held"}},
		{name: "upgraded, done on the config from before: not done", in: PhaseUpgraded, given: []func(*machine){upgradedWaiting},
			ev: evNodeSeen{managed("Done", "rendered-old", "rendered-old", "", false)}, phase: PhaseUpgraded, why: ReasonNodeUpdating, effs: []string{"save held"}},
		{name: "upgraded, the MCO done with the node: retired", in: PhaseUpgraded, given: []func(*machine){upgradedWaiting},
			ev: evNodeSeen{managed("Done", "rendered-new", "rendered-new", "rendered-new", false)}, phase: PhaseUpgraded, why: ReasonCleaningUp,
			effs: []string{"save held", "start retire unload retain"},
			check: func(t *testing.T, m *machine) {
				if m.readsNode() {
					t.Error("the node's machine config state is still read once retiring")
				}
			}},
		{name: "upgraded, a node without the MCO is done at Completed", in: PhaseUpgraded, given: []func(*machine){upgradedWaiting},
			ev: evNodeSeen{cluster.NodeUpdate{}}, phase: PhaseUpgraded, why: ReasonCleaningUp, effs: []string{"save held", "start retire unload retain"}},

		// The running release's kept tree.
		{name: "a runtime check on an idle node restores the running release", in: PhaseIdle, given: []func(*machine){runningRelease},
			ev: evRuntimeCheck{"CRI-O restarted"}, phase: PhaseIdle, effs: []string{"start restore"}},
		{name: "a runtime check while a bundle loads waits for it", in: PhaseLoading, given: []func(*machine){runningRelease, running(jobLoad)},
			ev: evRuntimeCheck{"periodic check"}, phase: PhaseLoading,
			check: func(t *testing.T, m *machine) {
				if m.restoreDue != "periodic check" {
					t.Errorf("restore due %q", m.restoreDue)
				}
			}},
		{name: "a runtime check without a kept tree does nothing", in: PhaseIdle, ev: evRuntimeCheck{"CRI-O restarted"}, phase: PhaseIdle},
	})
}

// onDisk is the start of a node whose state dir holds the held bundle's
// record, in phase p, as f leaves it.
func onDisk(p Phase, f func(*Record)) evStart {
	r := heldRecord()
	r.Phase, r.Times = p, map[Phase]time.Time{p: time.Date(2026, 11, 22, 7, 0, 0, 0, time.UTC)}
	if f != nil {
		f(r)
	}
	return evStart{records: []*Record{r}}
}

func TestStepTable_Restarts(t *testing.T) {
	runRows(t, []stepRow{
		{name: "a restart mid-copy removes the published dir and waits for the stick", in: PhaseIdle, ev: onDisk(PhaseDetected, nil),
			phase: PhaseDetected, why: ReasonCopyInterrupted, effs: []string{"remove 4.13.7-x86_64", "save held"}},
		{name: "a restart with the waiting bundle now approved loads it", in: PhaseIdle,
			given: []func(*machine){approvalRequired, with(func(m *machine) { m.policy.ApprovedDigests = []string{heldDigest} })},
			ev:    onDisk(PhaseExtracted, func(r *Record) { r.Approval = bundle.ApprovalNone }),
			phase: PhaseLoading, effs: []string{"share held", "save held", "start load"}},
		{name: "a restart at cluster-ready does not run the hook again", in: PhaseIdle,
			ev: onDisk(PhaseClusterReady, func(r *Record) {
				r.Hook = &HookRun{Started: r.Times[PhaseClusterReady], Finished: r.Times[PhaseClusterReady]}
			}),
			phase: PhaseClusterReady, effs: []string{"share held", "resume loader held"}},
	})
}

// excludeB is the administrator's spec for the held bundle, with node b
// (the peer at peerB) left out of the gate.
func excludeB(p cluster.BundlePolicy) evBundlePolicy {
	p.ExcludedNodes = []string{"b"}
	return evBundlePolicy{name: ResourceName("4.13.7", "x86_64"), policy: p,
		excluded: map[string]string{"b": "listed in spec.excludedNodes"}, hosts: map[string]string{"b": "10.0.0.2"}}
}

// withoutFerry: the API lists b and this node with a record, and the
// machine config operator counts n more nodes (no ferry there).
func withoutFerry(n int) func(*machine) {
	return func(m *machine) { m.recorded, m.unrecorded = []string{"b", "node-a"}, n }
}

// TestStepTable_NodesWithoutFerry: the gate waits for the nodes the
// machine config operator counts and no record names (ferry does not run
// there), unless the administrator excludes them by name; loading goes on.
func TestStepTable_NodesWithoutFerry(t *testing.T) {
	reply := ReplyID(1)
	loadedB := withPeers(peerIn(PhaseLoaded, heldDigest))
	threeMachines := evPeerList{peers: []string{peerB}, recorded: []string{"b", "node-a"}, unrecorded: 1}
	runRows(t, []stepRow{
		{name: "3 machines, 2 with ferry, both loaded: not cluster-ready, saying why", in: PhaseLoaded, given: []func(*machine){loadedB},
			ev: threeMachines, phase: PhaseLoaded, why: ReasonNodesWithoutFerry, effs: []string{"save held"},
			check: func(t *testing.T, m *machine) {
				held := m.records["held"].Condition
				if s := m.status(); s.Message != held.Message || !held.Healthy() || m.unrecorded != 1 {
					t.Errorf("status %+v", s)
				}
				if d := m.cluster(m.standing()).Decision; d.Verdict != Waiting || d.Message != held.Message {
					t.Errorf("ferry status --cluster: %+v", d)
				}
			}},
		{name: "the same at the next poll of the peers saves nothing", in: PhaseLoaded,
			given: []func(*machine){loadedB, withoutFerry(1), with(func(m *machine) { m.records["held"].Condition = m.nodesWithoutFerry() })},
			ev:    viewOf(peerIn(PhaseLoaded, heldDigest)), phase: PhaseLoaded, why: ReasonNodesWithoutFerry},
		{name: "alone with ferry among 2 machines: the gate stays shut", in: PhaseLoaded, given: []func(*machine){withPeers(nil)},
			ev: evPeerList{recorded: []string{"node-a"}, unrecorded: 1}, phase: PhaseLoaded, why: ReasonNodesWithoutFerry, effs: []string{"save held"}},
		{name: "the administrator excludes the third name: the gate opens", in: PhaseLoaded, given: []func(*machine){withAPI, loadedB, withoutFerry(1)},
			ev: evBundlePolicy{name: ResourceName("4.13.7", "x86_64"), policy: cluster.BundlePolicy{ExcludedNodes: []string{"c"}},
				excluded: map[string]string{"c": "listed in spec.excludedNodes"}},
			phase: PhaseClusterReady, effs: []string{"save held", "save held", "ask upgrade held"}},
		{name: "excluding a node that runs ferry leaves out none without it", in: PhaseLoaded, given: []func(*machine){withAPI, loadedB, withoutFerry(1)},
			ev: excludeB(cluster.BundlePolicy{}), phase: PhaseLoaded, why: ReasonNodesWithoutFerry, effs: []string{"save held"}},
		{name: "pools unknown (no MCO): the gate opens as before", in: PhaseLoaded, given: []func(*machine){loadedB},
			ev: evPeerList{peers: []string{peerB}, recorded: []string{"b", "node-a"}}, phase: PhaseClusterReady, effs: []string{"save held", "save held", "run hook held"}},
		{name: "cluster-ready, a node without ferry counted before the ask: no hook, no ask", in: PhaseClusterReady, given: []func(*machine){loadedB},
			ev: threeMachines, phase: PhaseClusterReady, why: ReasonNodesWithoutFerry, effs: []string{"save held"}},
		{name: "ferry runs on every node counted now: the wait clears, the hook runs", in: PhaseClusterReady,
			given: []func(*machine){loadedB, withoutFerry(1), with(func(m *machine) { m.records["held"].Condition = m.nodesWithoutFerry() })},
			ev:    evPeerList{peers: []string{peerB}, recorded: []string{"b", "node-a"}}, phase: PhaseClusterReady, effs: []string{"save held", "save held", "run hook held"}},
		{name: "the upgrade asked already: a node without ferry changes nothing", in: PhaseClusterReady,
			given: []func(*machine){withAPI, loadedB, with(func(m *machine) { m.records["held"].Upgrade = &UpgradeRun{Requested: m.now()} })},
			ev:    threeMachines, phase: PhaseClusterReady},
		{name: "ferry proceed while nodes run no ferry is refused", in: PhaseLoaded,
			given: []func(*machine){loadedB, withoutFerry(1), with(func(m *machine) { m.records["held"].Condition = m.nodesWithoutFerry() })},
			ev:    evRequest{kind: reqProceed, reply: reply}, phase: PhaseLoaded, why: ReasonNodesWithoutFerry, effs: []string{"reply error"},
			check: func(t *testing.T, m *machine) {
				var err error
				for _, e := range m.step(evRequest{kind: reqProceed, reply: reply}) {
					if r, ok := e.(effReply); ok {
						err = r.err
					}
				}
				if err == nil || !strings.Contains(err.Error(), "counts 3 nodes, 2 run ferry") {
					t.Errorf("reply %v", err)
				}
			}},
		{name: "nodes without ferry do not hold the load back", in: PhaseExtracted,
			given: []func(*machine){approvedHeld, withPeers(peerIn(PhaseExtracted, heldDigest)), withoutFerry(1)},
			ev:    evRetry{}, phase: PhaseLoading, effs: []string{"save held", "start load"}},
	})
}
