package machine

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
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/peer/wire"
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
	given []func(*Machine) // more of the state before: config, peers, a job…
	ev    Event
	phase Phase    // the subject's phase after (PhaseIdle: no subject)
	why   string   // its condition's Reason after ("": none)
	effs  []string // effKey of each effect, in order
	check func(t *testing.T, m *Machine)
}

// subject is the record a row looks at after the step: the held bundle,
// else the one that holds the node, else the newest refusal.
func subject(m *Machine) *Record {
	if r := m.Records["held"]; r != nil {
		return r
	}
	if m.Active != nil {
		return m.Active
	}
	return m.LastBad
}

// effKey names an effect by its type and key fields.
func effKey(e Effect) string {
	switch e := e.(type) {
	case EffSave:
		return "save " + e.Rec.ID
	case EffForget:
		return "forget " + e.ID
	case EffProbe:
		k := "probe " + string(e.Origin)
		if e.Held != "" {
			k += " held"
		}
		return k
	case EffStartJob:
		k := "start " + string(e.Kind)
		if e.Unload {
			k += " unload"
		}
		if e.Previous != nil {
			k += " previous=" + e.Previous.ID
		}
		if e.Retain {
			k += " retain"
		}
		return k
	case EffUnshare:
		return "unshare"
	case EffStopJob:
		return "stop job"
	case EffCloseMedium:
		return "close medium"
	case EffShare:
		return "share " + e.Rec.ID
	case EffRemove:
		return "remove " + filepath.Base(e.Path)
	case EffResumeLoader:
		return "resume loader " + e.Rec.ID
	case EffRunHook:
		return "run hook " + e.Rec.ID
	case EffAskUpgrade:
		return "ask upgrade " + e.Rec.ID
	case EffRetryIn:
		return "retry in " + e.After.String()
	case EffReply:
		if e.Err != nil {
			return "reply error"
		}
		return "reply ok"
	case EffAnnounce:
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
			for _, e := range m.Step(row.ev) {
				if _, ok := e.(EffAnnounce); !ok {
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
			if s := m.NodeStatus(); !machineReason.MatchString(s.Reason) {
				t.Errorf("status reason %q is not a machine reason", s.Reason)
			}
			if row.check != nil {
				row.check(t, m)
			}
		})
	}
}

// Givens: the state a row starts from, beyond the held bundle's phase.

func running(k jobKind) func(*Machine) {
	return func(m *Machine) { m.Job = &Job{Kind: k, ID: "held", device: "/dev/sdb"} }
}

func withAPI(m *Machine) { m.HasAPI = true }

// notDesired: ClusterVersion was read, and its desiredUpdate names
// another release than the held bundle's.
func notDesired(m *Machine) { m.desired = desiredRead{release: meta137.Release} }

// desiredHeld: ClusterVersion's desiredUpdate names the held bundle's
// release, the operator not started yet.
func desiredHeld(m *Machine) { m.desired = desiredRead{release: meta137.Release, names: true} }

// cleanupSpec is the held bundle's spec with cleanup: true.
func cleanupSpec(m *Machine) {
	m.bundleName, m.bundlePolicy = ResourceName("4.13.7", "x86_64"), &cluster.BundlePolicy{Cleanup: true}
}

func noLoader(m *Machine) { m.hasLoader = false }

func noHook(m *Machine) { m.cfg.OnReady = nil }

// approvalRequired: approval = "required", nothing approved, and the
// held bundle extracted unapproved.
func approvalRequired(m *Machine) {
	m.policy.Required = true
	if r := m.Records["held"]; r != nil {
		r.Approval = bundle.ApprovalNone
	}
}

func approvedHeld(m *Machine) {
	if r := m.Records["held"]; r != nil {
		r.Approval = bundle.ApprovalDigest
	}
}

// withPeers gives the machine one peer, b, last seen in st (nil: never
// heard from).
func withPeers(st *wire.PeerStatus) func(*Machine) {
	return func(m *Machine) {
		m.peersOn, m.peers = true, []string{peerB}
		m.view = View{Statuses: map[string]wire.PeerStatus{}, At: m.Now()}
		if st != nil {
			m.view.Statuses[peerB] = *st
		}
	}
}

func with(f func(*Machine)) func(*Machine) { return f }

const peerB = "10.0.0.2:8090"

// heldResource is the held bundle's UpgradeBundle (meta137).
const heldResource = "4.13.7-x86-64"

// heldHex names the dir a fetched tar of the held bundle lands in.
var heldHex = strings.TrimPrefix(heldDigest, "sha256:")

func peerIn(p Phase, digest digest.Digest) *wire.PeerStatus {
	return &wire.PeerStatus{Status: wire.Status{Node: "b", Phase: string(p), Digest: digest, Version: "4.13.7"}}
}

func viewOf(st *wire.PeerStatus, offers ...wire.PeerOffer) EvView {
	v := View{Statuses: map[string]wire.PeerStatus{}, Offers: offers, At: time.Date(2026, 11, 22, 8, 0, 0, 0, time.UTC)}
	if st != nil {
		v.Statuses[peerB] = *st
	}
	return EvView{v}
}

func offerOf(t *testing.T, d string, meta bundle.Metadata) wire.PeerOffer {
	t.Helper()
	meta.FormatVersion, meta.Size, meta.SizeBytes, meta.Images = 1, "1 KiB", 1024, []string{"quay.io/x/app@" + heldDigest}
	b, err := json.Marshal(meta)
	if err != nil {
		t.Fatal(err)
	}
	return wire.PeerOffer{Peer: peerB, Offer: wire.Offer{Digest: digest.Digest(d), Metadata: b, Size: 10, Complete: true}}
}

var (
	meta137 = bundle.Metadata{Version: "4.13.7", Arch: "x86_64", Release: "quay.io/r@" + heldDigest}
	meta138 = bundle.Metadata{Version: "4.13.8", Arch: "x86_64", Release: "quay.io/r@" + otherDigest}
	errBoom = errors.New("crio is down")
)

func stickOffer(meta *bundle.Metadata, digest digest.Digest) EvOffer {
	return EvOffer{Origin: OriginStick, Device: "/dev/sdb", Src: bundle.Source{Path: "/m/upgrade-" + meta.Version + "-x86_64.tar"},
		Medium: MediumID(1), Meta: meta, Digest: digest}
}

func TestStepTable_DevicesAndOffers(t *testing.T) {
	reply := ReplyID(1)
	runRows(t, []stepRow{
		{name: "a stick plugged on an idle node is probed", in: PhaseIdle,
			ev: EvDevice{DeviceEvent{Action: "add", Device: "/dev/sdb"}}, phase: PhaseIdle, effs: []string{"probe stick"}},
		{name: "a stick plugged on a node holding a bundle is probed against it", in: PhaseLoaded,
			ev: EvDevice{DeviceEvent{Action: "add", Device: "/dev/sdb"}}, phase: PhaseLoaded, effs: []string{"probe stick held"}},
		{name: "a change event for a stick being probed does nothing", in: PhaseIdle, given: []func(*Machine){with(func(m *Machine) { m.probing["/dev/sdb"] = true })},
			ev: EvDevice{DeviceEvent{Action: "change", Device: "/dev/sdb"}}, phase: PhaseIdle},
		{name: "a change event for the stick being read does nothing", in: PhaseDetected, given: []func(*Machine){running(JobExtract)},
			ev: EvDevice{DeviceEvent{Action: "change", Device: "/dev/sdb"}}, phase: PhaseDetected},
		{name: "without media, a stick is not looked at", in: PhaseIdle, given: []func(*Machine){with(func(m *Machine) { m.hasMedia = false })},
			ev: EvDevice{DeviceEvent{Action: "add", Device: "/dev/sdb"}}, phase: PhaseIdle},
		{name: "the stick pulled while read stops the job", in: PhaseDetected, given: []func(*Machine){running(JobExtract)},
			ev: EvDevice{DeviceEvent{Action: "remove", Device: "/dev/sdb"}}, phase: PhaseDetected, effs: []string{"stop job"}},
		{name: "another stick pulled does nothing", in: PhaseDetected, given: []func(*Machine){running(JobExtract)},
			ev: EvDevice{DeviceEvent{Action: "remove", Device: "/dev/sdc"}}, phase: PhaseDetected},

		{name: "a bundle offered on an idle node is extracted, its medium kept open", in: PhaseIdle,
			ev: stickOffer(&meta137, heldDigest), phase: PhaseDetected,
			effs: []string{"save 4.13.7-x86_64-20261122T080000", "remove 4.13.7-x86_64", "start extract"},
			check: func(t *testing.T, m *Machine) {
				if !m.Active.Plugged || m.Job.medium == 0 || m.Job.device != "/dev/sdb" {
					t.Errorf("active %+v, job %+v", m.Active, m.Job)
				}
			}},
		{name: "a stick without a bundle is answered, nothing recorded", in: PhaseIdle,
			ev: EvOffer{Origin: OriginFile, NoBundle: true, Err: errNoBundle, Reply: reply}, phase: PhaseIdle, effs: []string{"reply error"}},
		{name: "an unreadable bundle is rejected", in: PhaseIdle,
			ev:    EvOffer{Origin: OriginStick, Device: "/dev/sdb", Src: bundle.Source{Path: "/m/upgrade-x.tar"}, Err: bundle.ErrInvalid},
			phase: PhaseRejected, why: ReasonInvalidBundle, effs: []string{"save x-20261122T080000"},
			check: func(t *testing.T, m *Machine) {
				// syncBundle's Event is a Warning when the report is unhealthy.
				if rep := m.ResourceReport(m.NodeStatus()); rep != nil && rep.Healthy || m.NodeStatus().Healthy {
					t.Errorf("a refusal reported healthy: %+v", rep)
				}
			}},
		{name: "a stick plugged after a refusal is probed", in: PhaseRejected,
			ev: EvDevice{DeviceEvent{Action: "add", Device: "/dev/sdb"}}, phase: PhaseRejected, effs: []string{"probe stick"}},
		{name: "after a cleanup, the next bundle is extracted", in: PhaseCleaned,
			ev: stickOffer(&meta138, otherDigest), phase: PhaseCleaned,
			effs: []string{"save 4.13.8-x86_64-20261122T080000", "remove 4.13.8-x86_64", "start extract"}},
		{name: "the same bundle offered again changes nothing", in: PhaseLoaded,
			ev: stickOffer(&meta137, heldDigest), phase: PhaseLoaded, effs: []string{"close medium"},
			check: func(t *testing.T, m *Machine) {
				if !strings.Contains(m.notice, "is the bundle already held") {
					t.Errorf("notice %q", m.notice)
				}
			}},
		{name: "another bundle offered while one is held is a conflict record", in: PhaseClusterReady,
			ev: stickOffer(&meta138, otherDigest), phase: PhaseClusterReady, effs: []string{"save 4.13.8-x86_64-20261122T080000", "close medium"},
			check: func(t *testing.T, m *Machine) {
				if m.LastBad == nil || m.LastBad.Phase != PhaseConflict || m.LastBad.Condition.Reason != ReasonBundlesDiffer {
					t.Errorf("last refusal %+v", m.LastBad)
				}
				if s := m.NodeStatus(); s.Digest != heldDigest || !strings.Contains(s.Error, "upgrade-4.13.8-x86_64.tar") {
					t.Errorf("status %+v: want the held bundle shown, the other named", s)
				}
			}},
		{name: "the interrupted bundle plugged again resumes its copy", in: PhaseDetected,
			ev: stickOffer(&meta137, heldDigest), phase: PhaseDetected, effs: []string{"save held", "remove 4.13.7-x86_64", "start extract"}},
		{name: "the bundle being read, offered again, is noted", in: PhaseDetected, given: []func(*Machine){running(JobExtract)},
			ev:    func() Event { o := stickOffer(&meta137, heldDigest); o.Reply = reply; return o }(),
			phase: PhaseDetected, effs: []string{"reply ok", "close medium"}},
		{name: "a new bundle offered while a job runs is answered busy", in: PhaseIdle, given: []func(*Machine){running(JobRestore)},
			ev:    func() Event { o := stickOffer(&meta137, heldDigest); o.Reply = reply; return o }(),
			phase: PhaseIdle, effs: []string{"reply error", "close medium"}},
	})
}

func done(k jobKind) EvJobDone { return EvJobDone{Kind: k, ID: "held"} }

func doneErr(k jobKind, err error) EvJobDone { return EvJobDone{Kind: k, ID: "held", Err: err} }

var extracted = &bundle.Result{Digest: heldDigest, TarSize: 10, Approval: bundle.ApprovalDigest, Metadata: &meta137}

func TestStepTable_JobsEnd(t *testing.T) {
	permanent := permanentErr{errBoom}
	diskFull := fmt.Errorf("writing the tar: %w", bundle.ErrDiskFilled)
	runRows(t, []stepRow{
		{name: "extracted and approved: loading starts", in: PhaseDetected, given: []func(*Machine){running(JobExtract)},
			ev: EvJobDone{Kind: JobExtract, ID: "held", Res: extracted}, phase: PhaseLoading,
			effs: []string{"save held", "share held", "save held", "start load"}},
		{name: "extracted unapproved: it waits for approval, shared", in: PhaseDetected, given: []func(*Machine){running(JobExtract), approvalRequired},
			ev:    EvJobDone{Kind: JobExtract, ID: "held", Res: &bundle.Result{Digest: heldDigest, TarSize: 10, Approval: bundle.ApprovalNone, Metadata: &meta137}},
			phase: PhaseExtracted, why: ReasonAwaitingApproval, effs: []string{"save held", "share held"},
			check: func(t *testing.T, m *Machine) {
				if c := m.Records["held"].Condition.Message; !strings.Contains(c, heldDigest) || !strings.Contains(c, "approved_digests") || m.NodeStatus().ApprovalOff {
					t.Errorf("condition %q: want the digest read and the config key to approve it", c)
				}
			}},
		{name: "extracted on a node that loads nothing: it says so", in: PhaseDetected, given: []func(*Machine){running(JobExtract), noLoader},
			ev: EvJobDone{Kind: JobExtract, ID: "held", Res: extracted}, phase: PhaseExtracted, why: ReasonLoadsNothing,
			effs: []string{"save held", "share held", "save held"}},
		{name: "an extraction refused rejects the bundle", in: PhaseDetected, given: []func(*Machine){running(JobExtract)},
			ev: doneErr(JobExtract, fmt.Errorf("%w: sha256 mismatch", bundle.ErrMismatch)), phase: PhaseRejected, why: ReasonDigestMismatch,
			effs: []string{"save held"}, check: func(t *testing.T, m *Machine) {
				if m.Active != nil || m.LastBad != m.Records["held"] {
					t.Errorf("active %v, last refusal %v", m.Active, m.LastBad)
				}
			}},
		{name: "an extraction cut short (stick pulled) waits for the stick", in: PhaseDetected, given: []func(*Machine){running(JobExtract)},
			ev:    EvJobDone{Kind: JobExtract, ID: "held", Stopped: true, Err: errors.New("read: no such device")},
			phase: PhaseDetected, why: ReasonCopyInterrupted, effs: []string{"save held"}},
		{name: "an extraction of a file cut short asks for ferry load of that file again, not for a stick", in: PhaseDetected,
			given: []func(*Machine){running(JobExtract), with(func(m *Machine) {
				m.Records["held"].Origin, m.Records["held"].Source = OriginFile, "/root/upgrade-4.13.7-x86_64.tar"
			})},
			ev:    EvJobDone{Kind: JobExtract, ID: "held", Err: errors.New("read: input/output error")},
			phase: PhaseDetected, why: ReasonCopyInterrupted, effs: []string{"save held"},
			check: func(t *testing.T, m *Machine) {
				// The command to run again names the file the technician gave.
				if msg := m.Records["held"].Condition.Message; !strings.Contains(msg, "ferry load /root/upgrade-4.13.7-x86_64.tar") {
					t.Errorf("message %q", msg)
				}
			}},
		{name: "a tar whose metadata is not the one read before is rejected", in: PhaseDetected, given: []func(*Machine){running(JobExtract)},
			ev:    EvJobDone{Kind: JobExtract, ID: "held", Res: &bundle.Result{Digest: heldDigest, Metadata: &meta138}},
			phase: PhaseRejected, why: ReasonInvalidBundle, effs: []string{"remove 4.13.7-x86_64", "save held"}},
		{name: "a job's end for another phase is ignored", in: PhaseLoaded, given: []func(*Machine){running(JobExtract)},
			ev: EvJobDone{Kind: JobExtract, ID: "held", Res: extracted}, phase: PhaseLoaded},
		{name: "a job's end for a record gone is ignored", in: PhaseIdle, given: []func(*Machine){running(JobLoad)},
			ev: done(JobLoad), phase: PhaseIdle},

		{name: "fetched and extracted in one pass", in: PhaseFetching, given: []func(*Machine){running(JobFetch), fromPeer},
			ev: EvJobDone{Kind: JobFetch, ID: "held", Res: extracted}, phase: PhaseLoading,
			effs: []string{"remove 1111111111111111111111111111111111111111111111111111111111111111", "save held", "share held", "save held", "start load"}},
		{name: "fetched whole (serial): extracted next", in: PhaseFetching, given: []func(*Machine){running(JobFetch)},
			ev: done(JobFetch), phase: PhaseFetching, effs: []string{"remove 4.13.7-x86_64", "start extract"}},
		{name: "a fetch that failed is retried in 10s", in: PhaseFetching, given: []func(*Machine){running(JobFetch)},
			ev: doneErr(JobFetch, errors.New("peer gone")), phase: PhaseFetching, why: ReasonFetchFailed,
			effs: []string{"save held", "retry in 10s"}},
		{name: "a fetch that filled the disk is abandoned", in: PhaseFetching, given: []func(*Machine){running(JobFetch), fromPeer},
			ev: doneErr(JobFetch, diskFull), phase: PhaseFailed, why: ReasonFetchAbandoned,
			effs: []string{"remove 1111111111111111111111111111111111111111111111111111111111111111", "remove .staging-4.13.7-x86_64", "remove 4.13.7-x86_64", "save held"}},
		{name: "a fetched bundle with no room to extract is fetched again", in: PhaseFetching, given: []func(*Machine){running(JobFetch), fromPeer},
			ev: doneErr(JobFetch, fmt.Errorf("%w in /var", bundle.ErrNoSpace)), phase: PhaseFetching, why: ReasonNoRoomToExtract,
			effs: []string{"remove 1111111111111111111111111111111111111111111111111111111111111111", "save held", "retry in 10s"}},
		{name: "a fetch stopped does nothing", in: PhaseFetching, given: []func(*Machine){running(JobFetch)},
			ev: EvJobDone{Kind: JobFetch, ID: "held", Stopped: true}, phase: PhaseFetching},

		{name: "loaded with no peers: cluster-ready, the hook runs where plugged", in: PhaseLoading, given: []func(*Machine){running(JobLoad)},
			ev: done(JobLoad), phase: PhaseClusterReady, effs: []string{"save held", "save held", "save held", "run hook held"}},
		{name: "loaded with a peer not loaded yet: loaded", in: PhaseLoading, given: []func(*Machine){running(JobLoad), withPeers(peerIn(PhaseExtracted, heldDigest))},
			ev: done(JobLoad), phase: PhaseLoaded, effs: []string{"save held"}},
		{name: "a load that failed is retried after 5s", in: PhaseLoading, given: []func(*Machine){running(JobLoad)},
			ev: doneErr(JobLoad, errBoom), phase: PhaseLoading, why: ReasonLoadFailed, effs: []string{"save held", "retry in 5s"}},
		{name: "the backoff doubles", in: PhaseLoading, given: []func(*Machine){running(JobLoad), with(func(m *Machine) { m.backoff = 40 * time.Second })},
			ev: doneErr(JobLoad, errBoom), phase: PhaseLoading, why: ReasonLoadFailed, effs: []string{"save held", "retry in 1m20s"}},
		{name: "a load that cannot heal fails", in: PhaseLoading, given: []func(*Machine){running(JobLoad)},
			ev: doneErr(JobLoad, permanent), phase: PhaseFailed, why: ReasonLoadFailed, effs: []string{"save held"}},
		{name: "the retry after a failed load loads again", in: PhaseLoading, ev: EvRetry{}, phase: PhaseLoading, effs: []string{"save held", "start load"}},
		{name: "a load stopped does nothing", in: PhaseLoading, given: []func(*Machine){running(JobLoad)},
			ev: EvJobDone{Kind: JobLoad, ID: "held", Stopped: true}, phase: PhaseLoading},

		{name: "a cleanup done: cleaned, the request answered", in: PhaseExtracted,
			given: []func(*Machine){running(JobCleanup), with(func(m *Machine) { m.cleanupAsked, m.cleanupReply = true, ReplyID(1) })},
			ev:    done(JobCleanup), phase: PhaseCleaned, effs: []string{"save held", "reply ok"},
			check: func(t *testing.T, m *Machine) {
				if m.Active != nil || m.cleaned != m.Records["held"] || m.cleanupAsked {
					t.Errorf("active %v, cleaned %v, asked %v", m.Active, m.cleaned, m.cleanupAsked)
				}
			}},
		{name: "a cleanup that failed is answered, the bundle kept", in: PhaseExtracted,
			given: []func(*Machine){running(JobCleanup), with(func(m *Machine) { m.cleanupAsked, m.cleanupReply = true, ReplyID(1) })},
			ev:    doneErr(JobCleanup, errBoom), phase: PhaseExtracted, effs: []string{"reply error"}},

		{name: "a retirement done: retired, tree kept", in: PhaseUpgraded, given: []func(*Machine){running(JobRetire), retiringHeld},
			ev: done(JobRetire), phase: PhaseUpgraded, effs: []string{"save held"},
			check: func(t *testing.T, m *Machine) {
				r := m.Records["held"]
				if r.Retirement != RetirementDone || !r.Retained || m.Active != nil || m.previous != r || m.done != r {
					t.Errorf("retirement %v, retained %v; active %v, previous %v", r.Retirement, r.Retained, m.Active, m.previous)
				}
				if s := m.NodeStatus(); s.Phase != string(PhaseUpgraded) || Annotations(s)[AnnotationReason] != "" || m.ReadsNode() {
					t.Errorf("status %+v: want upgraded, no reason on the Node, the node no longer read", s)
				}
			}},
		{name: "a retirement done unpins the previous bundle", in: PhaseUpgraded, given: []func(*Machine){running(JobRetire), retiringHeld, previousBundle},
			ev: done(JobRetire), phase: PhaseUpgraded, effs: []string{"save prev", "save held"},
			check: func(t *testing.T, m *Machine) {
				if p := m.Records["prev"]; p.Retirement != RetirementUnpinned || p.Retained {
					t.Errorf("previous: retirement %v, retained %v", p.Retirement, p.Retained)
				}
			}},
		{name: "a retirement that failed is retried in 30s", in: PhaseUpgraded, given: []func(*Machine){running(JobRetire), retiringHeld},
			ev: doneErr(JobRetire, errBoom), phase: PhaseUpgraded, why: ReasonCleanupFailed, effs: []string{"save held", "retry in 30s"}},

		{name: "a restore that loaded images again says so", in: PhaseIdle, given: []func(*Machine){runningRelease, running(JobRestore)},
			ev: EvJobDone{Kind: JobRestore, ID: "running", Restored: 3}, phase: PhaseIdle,
			check: func(t *testing.T, m *Machine) {
				if !strings.Contains(m.notice, "CRI-O had lost 3 images") {
					t.Errorf("notice %q", m.notice)
				}
			}},
		{name: "a restore that failed is retried in 15s", in: PhaseIdle, given: []func(*Machine){runningRelease, running(JobRestore)},
			ev: EvJobDone{Kind: JobRestore, ID: "running", Err: errBoom}, phase: PhaseIdle, effs: []string{"retry in 15s"},
			check: func(t *testing.T, m *Machine) {
				if m.restoreDue != "retry" {
					t.Errorf("restore due %q", m.restoreDue)
				}
			}},
		{name: "a restore stopped says nothing", in: PhaseIdle, given: []func(*Machine){runningRelease, running(JobRestore)},
			ev: EvJobDone{Kind: JobRestore, ID: "running", Stopped: true}, phase: PhaseIdle},
	})
}

type permanentErr struct{ error }

func (permanentErr) Permanent() bool { return true }

// fromPeer: the held bundle came from the peers.
func fromPeer(m *Machine) { m.Records["held"].Origin, m.Records["held"].Source = OriginPeer, peerB }

// runningRelease: the release the cluster runs, upgraded and retired
// here, its tree kept (record "running").
func runningRelease(m *Machine) {
	r := &Record{ID: "running", Digest: otherDigest, Name: "upgrade-4.13.6-x86_64.tar", Metadata: &bundle.Metadata{Version: "4.13.6", Arch: "x86_64", Release: "quay.io/r@" + otherDigest},
		Origin: OriginStick, Dir: "/nonexistent/4.13.6-x86_64", Retirement: RetirementDone, Retained: true}
	m.Move(r, PhaseUpgraded, Condition{}, Progress{})
	m.done, m.previous = r, r
}

// retiringHeld: the held bundle, upgraded, is being retired.
func retiringHeld(m *Machine) {
	m.Records["held"].Retirement = RetirementStarted
	m.Active = m.Records["held"]
}

// previousBundle: the release before the held bundle, upgraded, retired,
// its pins kept.
func previousBundle(m *Machine) {
	old := bundle.Metadata{Version: "4.13.6", Arch: "x86_64", Release: "quay.io/r@" + otherDigest}
	p := &Record{ID: "prev", Digest: otherDigest, Name: "upgrade-4.13.6-x86_64.tar", Metadata: &old, Origin: OriginStick,
		Dir: "/nonexistent/4.13.6-x86_64", Retirement: RetirementDone, Retained: true}
	m.Move(p, PhaseUpgraded, Condition{}, Progress{})
	m.previous, m.done = p, p
}

func TestStepTable_PeersRequestsAndTheCluster(t *testing.T) {
	reply := ReplyID(1)
	cleanupAsked := with(func(m *Machine) { m.cleanupAsked, m.cleanupReply = true, ReplyID(1) })
	managed := func(st string, cur, des, target string, paused bool) cluster.NodeUpdate {
		return cluster.NodeUpdate{Managed: true, State: st, Current: cur, Desired: des, Pool: "worker", Target: target, Paused: paused}
	}
	upgradedWaiting := with(func(m *Machine) {
		m.HasAPI = true
		m.Records["held"].MachineConfig = "rendered-old"
		m.Active = m.Records["held"]
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
			ev: func() EvView {
				liar := offerOf(t, otherDigest, meta138)
				liar.Peer = "10.0.0.9:8090"
				v := viewOf(nil, offerOf(t, heldDigest, meta137), liar)
				v.Statuses[liar.Peer] = wire.PeerStatus{Verified: "node-x", Err: fmt.Errorf("peer %s: %w", liar.Peer, wire.ErrNodeMismatch)}
				return v
			}(), phase: PhaseFetching,
			effs: []string{"save 4.13.7-x86_64-20261122T080000", "remove 4.13.7-x86_64", "start fetch"}},
		{name: "an offer from a node the administrator excluded is not looked at: no conflict", in: PhaseIdle,
			given: []func(*Machine){with(func(m *Machine) { m.Excluded = map[string]string{"node-x": "listed in spec.excludedNodes"} })},
			ev: func() EvView {
				other := offerOf(t, otherDigest, meta138)
				other.Peer = "10.0.0.9:8090"
				v := viewOf(nil, offerOf(t, heldDigest, meta137), other)
				v.Statuses[other.Peer] = wire.PeerStatus{Status: wire.Status{Node: "node-x", Phase: string(PhaseLoaded), Digest: otherDigest}, Verified: "node-x"}
				return v
			}(), phase: PhaseFetching,
			effs: []string{"save 4.13.7-x86_64-20261122T080000", "remove 4.13.7-x86_64", "start fetch"}},
		{name: "an offer this node's policy refuses is rejected before a byte is fetched", in: PhaseIdle, given: []func(*Machine){approvalRequired},
			ev: viewOf(nil, offerOf(t, heldDigest, meta137)), phase: PhaseRejected, why: ReasonNotApproved,
			effs: []string{"save 4.13.7-x86_64-20261122T080000"},
			check: func(t *testing.T, m *Machine) {
				// It tells its peers which bundle it refused, so that they do not pin it.
				if ps := m.StatusForPeers(m.NodeStatus()); ps.Phase != string(PhaseRejected) || ps.Digest != heldDigest || ps.Error == "" {
					t.Errorf("peer status %+v", ps)
				}
			}},
		{name: "an offer approved only in another UpgradeBundle is refused (issue 45)", in: PhaseIdle,
			given: []func(*Machine){approvalRequired, with(func(m *Machine) { m.clusterApproved = []cluster.Approval{{Bundle: "4.13.7-amd64", Digest: heldDigest}} })},
			ev:    viewOf(nil, offerOf(t, heldDigest, meta137)), phase: PhaseRejected, why: ReasonNotApproved,
			effs: []string{"save 4.13.7-x86_64-20261122T080000"}},
		{name: "an offer approved in its own UpgradeBundle is fetched", in: PhaseIdle,
			given: []func(*Machine){approvalRequired, with(func(m *Machine) { m.clusterApproved = []cluster.Approval{{Bundle: heldResource, Digest: heldDigest}} })},
			ev:    viewOf(nil, offerOf(t, heldDigest, meta137)), phase: PhaseFetching,
			effs: []string{"save 4.13.7-x86_64-20261122T080000", "remove 4.13.7-x86_64", "start fetch"}},
		{name: "a peer's bundle refused before, now approved (a restart with the digest added), is fetched", in: PhaseRejected,
			given: []func(*Machine){fromPeer, approvalRequired, with(func(m *Machine) {
				m.Records["held"].Dir = "" // refused by the policy, never fetched
				m.policy.ApprovedDigests = []string{heldDigest}
			})},
			ev: viewOf(nil, offerOf(t, heldDigest, meta137)), phase: PhaseRejected,
			effs: []string{"save 4.13.7-x86_64-20261122T080000", "remove 4.13.7-x86_64", "start fetch"},
			check: func(t *testing.T, m *Machine) {
				if m.Active == nil || m.Active.Phase != PhaseFetching || m.Active.Digest != heldDigest {
					t.Errorf("active %+v, want the bundle fetched", m.Active)
				}
			}},
		{name: "a bundle cleaned up here is not fetched again", in: PhaseCleaned,
			ev: viewOf(nil, offerOf(t, heldDigest, meta137)), phase: PhaseCleaned},
		{name: "extracted, a peer holding another bundle: a conflict, not loaded", in: PhaseExtracted, given: []func(*Machine){approvedHeld, withPeers(nil)},
			ev: viewOf(peerIn(PhaseExtracted, otherDigest)), phase: PhaseExtracted, why: ReasonPeerHoldsOther, effs: []string{"save held"},
			check: func(t *testing.T, m *Machine) {
				// In conflict, it still tells its peers its bundle: a peer
				// polling it later would otherwise not see the conflict.
				ps := m.StatusForPeers(m.NodeStatus())
				if ps.Digest != heldDigest || ps.Phase != string(PhaseExtracted) {
					t.Errorf("peers are told %s %q", ps.Phase, ps.Digest)
				}
				if d := m.ClusterView(ps).Decision; d.Verdict != Conflict || len(d.Digests) != 2 {
					t.Errorf("cluster decision %+v, want a conflict between both bundles", d)
				}
			}},
		{name: "extracted, a peer refusing the bundle: it waits", in: PhaseExtracted, given: []func(*Machine){approvedHeld, withPeers(nil)},
			ev:    viewOf(&wire.PeerStatus{Status: wire.Status{Node: "b", Phase: string(PhaseRejected), Digest: heldDigest, Error: "not approved"}}),
			phase: PhaseExtracted, why: ReasonPeerRefuses, effs: []string{"save held"}},
		{name: "extracted, a peer unreachable: it waits for it", in: PhaseExtracted, given: []func(*Machine){approvedHeld, withPeers(nil)},
			ev: viewOf(&wire.PeerStatus{Err: errors.New("connection refused")}), phase: PhaseExtracted, why: ReasonPeersNotHolding, effs: []string{"save held"}},
		{name: "extracted, the peer holding it too: loading starts", in: PhaseExtracted, given: []func(*Machine){approvedHeld, withPeers(nil)},
			ev: viewOf(peerIn(PhaseExtracted, heldDigest)), phase: PhaseLoading, effs: []string{"save held", "start load"}},
		{name: "extracted, no view of the peers yet: it waits to hear", in: PhaseExtracted,
			given: []func(*Machine){approvedHeld, withPeers(nil), with(func(m *Machine) { m.view = View{} })},
			ev:    EvRetry{}, phase: PhaseExtracted, why: ReasonPeersUnheard, effs: []string{"save held"}},
		{name: "the same wait again saves nothing", in: PhaseExtracted,
			given: []func(*Machine){approvedHeld, withPeers(nil), with(func(m *Machine) {
				m.view = View{}
				m.Records["held"].Condition = WaitingFor(ReasonPeersUnheard, "waiting to hear from the peers")
			})},
			ev: EvRetry{}, phase: PhaseExtracted, why: ReasonPeersUnheard},
		{name: "the gate opens when every node is loaded: cluster-ready, the hook runs", in: PhaseLoaded, given: []func(*Machine){withPeers(nil)},
			ev: viewOf(peerIn(PhaseLoaded, heldDigest)), phase: PhaseClusterReady, effs: []string{"save held", "save held", "run hook held"}},
		{name: "the gate stays shut while a peer is not loaded", in: PhaseLoaded, given: []func(*Machine){withPeers(nil)},
			ev: viewOf(peerIn(PhaseLoading, heldDigest)), phase: PhaseLoaded},
		{name: "the gate on a peer never heard from stays shut", in: PhaseLoaded, given: []func(*Machine){withPeers(nil)},
			ev: viewOf(nil), phase: PhaseLoaded},
		{name: "the gate opens on Manual without the hook", in: PhaseLoaded,
			given: []func(*Machine){withPeers(nil), with(func(m *Machine) { m.cfg.Schedule = "Manual" })},
			ev:    viewOf(peerIn(PhaseLoaded, heldDigest)), phase: PhaseClusterReady, effs: []string{"save held"}},
		{name: "cluster-ready, another poll does not run the hook again", in: PhaseClusterReady,
			given: []func(*Machine){withPeers(nil), with(func(m *Machine) { m.Records["held"].Hook = &HookRun{Started: m.Now()} })},
			ev:    viewOf(peerIn(PhaseLoaded, heldDigest)), phase: PhaseClusterReady},
		{name: "a node that joins after the upgrade is upgraded at once", in: PhaseLoaded, given: []func(*Machine){withPeers(nil)},
			ev: viewOf(peerIn(PhaseUpgraded, heldDigest)), phase: PhaseUpgraded, why: ReasonCleaningUp,
			effs: []string{"save held", "start retire unload retain"}},

		// Requests from the local socket.
		{name: "ferry load with no bundle is answered", in: PhaseIdle, ev: EvRequest{Kind: ReqLoad, Reply: reply},
			phase: PhaseIdle, effs: []string{"reply error"}},
		{name: "ferry load probes the file", in: PhaseIdle, ev: EvRequest{Kind: ReqLoad, Medium: MediumID(1), Reply: reply},
			phase: PhaseIdle, effs: []string{"probe file"}},
		{name: "ferry load of a bundle made from the registry approves it", in: PhaseIdle,
			ev: EvRequest{Kind: ReqLoad, Medium: MediumID(1), Approve: otherDigest, Reply: reply}, phase: PhaseIdle, effs: []string{"probe file"},
			check: func(t *testing.T, m *Machine) {
				if !m.polFor(nil).Approves(otherDigest) {
					t.Error("the registry's bundle is not approved")
				}
			}},
		{name: "ferry load while busy closes the files and says busy", in: PhaseLoading, given: []func(*Machine){running(JobLoad)},
			ev: EvRequest{Kind: ReqLoad, Medium: MediumID(1), Reply: reply}, phase: PhaseLoading, effs: []string{"close medium", "reply error"}},
		{name: "ferry cleanup with nothing held is answered", in: PhaseIdle, ev: EvRequest{Kind: ReqCleanup, Reply: reply},
			phase: PhaseIdle, effs: []string{"reply error"}},
		{name: "ferry cleanup of an extracted bundle starts its cleanup", in: PhaseExtracted, ev: EvRequest{Kind: ReqCleanup, Reply: reply},
			phase: PhaseExtracted, effs: []string{"start cleanup unload"}},
		{name: "ferry cleanup while a job runs stops it first", in: PhaseLoading, given: []func(*Machine){running(JobLoad)},
			ev: EvRequest{Kind: ReqCleanup, Reply: reply}, phase: PhaseLoading, effs: []string{"stop job"}},
		{name: "ferry cleanup of a loaded bundle without an API is the upgrade done", in: PhaseClusterReady,
			ev: EvRequest{Kind: ReqCleanup, Reply: reply}, phase: PhaseUpgraded, why: ReasonCleaningUp, effs: []string{"save held", "start retire unload retain"}},
		{name: "ferry cleanup while the cluster upgrades to it is refused", in: PhaseUpgrading, given: []func(*Machine){withAPI},
			ev: EvRequest{Kind: ReqCleanup, Reply: reply}, phase: PhaseUpgrading, effs: []string{"reply error"}},
		{name: "a second ferry cleanup is answered", in: PhaseExtracted, given: []func(*Machine){running(JobCleanup), cleanupAsked},
			ev: EvRequest{Kind: ReqCleanup, Reply: reply}, phase: PhaseExtracted, effs: []string{"reply error"}},
		{name: "ferry cleanup of an upgraded bundle waiting for the MCO retires it now", in: PhaseUpgraded, given: []func(*Machine){upgradedWaiting},
			ev: EvRequest{Kind: ReqCleanup, Reply: reply}, phase: PhaseUpgraded, why: ReasonCleaningUp, effs: []string{"save held", "start retire unload retain"}},
		{name: "ferry cleanup of a bundle retired already has nothing to do", in: PhaseUpgraded,
			given: []func(*Machine){with(func(m *Machine) {
				r := m.Records["held"]
				r.Retirement, r.Retained, m.Active, m.done, m.previous = RetirementDone, true, nil, r, r
			})},
			ev: EvRequest{Kind: ReqCleanup, Reply: reply}, phase: PhaseUpgraded, effs: []string{"reply error"}},
		{name: "ferry proceed before cluster-ready is refused", in: PhaseLoaded, ev: EvRequest{Kind: reqProceed, Reply: reply},
			phase: PhaseLoaded, effs: []string{"reply error"}},
		{name: "ferry proceed at cluster-ready runs the hook", in: PhaseClusterReady, ev: EvRequest{Kind: reqProceed, Reply: reply},
			phase: PhaseClusterReady, effs: []string{"save held", "run hook held", "reply ok"}},
		{name: "ferry proceed after the hook succeeded has nothing to do", in: PhaseClusterReady,
			given: []func(*Machine){with(func(m *Machine) { m.Records["held"].Hook = &HookRun{Started: m.Now(), Finished: m.Now()} })},
			ev:    EvRequest{Kind: reqProceed, Reply: reply}, phase: PhaseClusterReady, effs: []string{"reply error"}},
		{name: "ferry proceed after the hook failed runs it again", in: PhaseClusterReady,
			given: []func(*Machine){with(func(m *Machine) {
				m.Records["held"].Hook = &HookRun{Started: m.Now(), Finished: m.Now(), Exit: 1, Error: "exit 1"}
			})},
			ev: EvRequest{Kind: reqProceed, Reply: reply}, phase: PhaseClusterReady, effs: []string{"save held", "run hook held", "reply ok"}},
		{name: "ferry proceed with an API asks the cluster for the upgrade", in: PhaseClusterReady, given: []func(*Machine){withAPI},
			ev: EvRequest{Kind: reqProceed, Reply: reply}, phase: PhaseClusterReady, effs: []string{"save held", "ask upgrade held", "reply ok"}},

		// The cluster's approvals, sources and UpgradeBundle spec.
		{name: "the cluster approving a waiting bundle loads it, no restart", in: PhaseExtracted, given: []func(*Machine){approvalRequired},
			ev: EvCluster{Approvals: &ApprovalsRead{Approvals: []cluster.Approval{{Bundle: heldResource, Digest: heldDigest}}}}, phase: PhaseLoading, effs: []string{"save held", "start load"}},
		{name: "an approval in another UpgradeBundle approves nothing and names the one that counts (issue 45)", in: PhaseExtracted, given: []func(*Machine){approvalRequired, withAPI},
			ev: EvCluster{Approvals: &ApprovalsRead{Approvals: []cluster.Approval{{Bundle: "4.13.7-amd64", Digest: heldDigest}}}}, phase: PhaseExtracted, why: ReasonAwaitingApproval,
			effs: []string{"save held"},
			check: func(t *testing.T, m *Machine) {
				if msg := m.Records["held"].Condition.Message; !strings.Contains(msg, "UpgradeBundle 4.13.7-amd64 approves") || !strings.Contains(msg, "from UpgradeBundle "+heldResource+" only") {
					t.Errorf("the status says %q", msg)
				}
			}},
		{name: "the cluster approving another digest: it still waits", in: PhaseExtracted,
			given: []func(*Machine){approvalRequired, with(func(m *Machine) {
				m.Records["held"].Condition = WaitingFor(ReasonAwaitingApproval, m.WaitingForApproval(m.Records["held"]))
			})},
			ev: EvCluster{Approvals: &ApprovalsRead{Approvals: []cluster.Approval{{Bundle: heldResource, Digest: otherDigest}}}}, phase: PhaseExtracted, why: ReasonAwaitingApproval},
		{name: "the same approvals again do nothing", in: PhaseExtracted,
			given: []func(*Machine){approvalRequired, with(func(m *Machine) { m.clusterApproved = []cluster.Approval{{Bundle: heldResource, Digest: otherDigest}} })},
			ev:    EvCluster{Approvals: &ApprovalsRead{Approvals: []cluster.Approval{{Bundle: heldResource, Digest: otherDigest}}}}, phase: PhaseExtracted},
		{name: "sources read: a bundle extracted unapproved still waits (a source approves at extraction, by what the tree holds)", in: PhaseExtracted,
			given: []func(*Machine){approvalRequired, with(func(m *Machine) {
				m.Records["held"].Condition = WaitingFor(ReasonAwaitingApproval, m.WaitingForApproval(m.Records["held"]))
			})},
			ev: EvCluster{Sources: &SourcesRead{Sources: []bundle.ReleaseSource{{Release: meta137.Release, Digest: heldDigest}}}}, phase: PhaseExtracted, why: ReasonAwaitingApproval,
			check: func(t *testing.T, m *Machine) {
				if len(m.polFor(nil).ApprovedSources) != 1 || m.polFor(nil).SourceFor(heldDigest, &meta137) == nil {
					t.Errorf("sources %+v", m.polFor(nil).ApprovedSources)
				}
				// Only the bundle the puller published is of the source.
				if m.polFor(nil).SourceFor(otherDigest, &meta137) != nil {
					t.Errorf("a bundle the puller did not publish is taken for its source")
				}
			}},
		{name: "sources read while loaded do nothing", in: PhaseLoaded,
			ev: EvCluster{Sources: &SourcesRead{Sources: []bundle.ReleaseSource{{Release: meta137.Release}}}}, phase: PhaseLoaded},
		{name: "a spec approving another digest holds the load", in: PhaseExtracted, given: []func(*Machine){approvedHeld, withAPI},
			ev:    EvCluster{Policy: &PolicyRead{Name: ResourceName("4.13.7", "x86_64"), Policy: cluster.BundlePolicy{ApprovedDigest: otherDigest}}},
			phase: PhaseExtracted, why: ReasonOtherBundleApproved, effs: []string{"save held"}},
		{name: "a spec approving this bundle, the unreachable node excluded: loading starts", in: PhaseExtracted,
			given: []func(*Machine){approvedHeld, withAPI, withPeers(&wire.PeerStatus{Err: errors.New("connection refused")})},
			ev:    excludeB(cluster.BundlePolicy{ApprovedDigest: heldDigest}), phase: PhaseLoading, effs: []string{"save held", "start load"}},
		{name: "the unreachable node excluded (listed, or NotReady too long): loading starts", in: PhaseExtracted,
			given: []func(*Machine){approvedHeld, withAPI, withPeers(&wire.PeerStatus{Err: errors.New("connection refused")})},
			ev:    excludeB(cluster.BundlePolicy{}), phase: PhaseLoading, effs: []string{"save held", "start load"}},
		{name: "the unreachable node excluded while loaded: the gate opens", in: PhaseLoaded,
			given: []func(*Machine){withAPI, withPeers(&wire.PeerStatus{Err: errors.New("connection refused")})},
			ev:    excludeB(cluster.BundlePolicy{}), phase: PhaseClusterReady, effs: []string{"save held", "save held", "ask upgrade held"}},
		{name: "a spec cleanup of a bundle waiting for approval takes it out", in: PhaseExtracted, given: []func(*Machine){approvalRequired, withAPI},
			ev:    EvCluster{Policy: &PolicyRead{Name: ResourceName("4.13.7", "x86_64"), Policy: cluster.BundlePolicy{Cleanup: true}}},
			phase: PhaseExtracted, effs: []string{"start cleanup unload"}},
		{name: "spec.cleanup takes a loaded bundle out", in: PhaseClusterReady, given: []func(*Machine){withAPI, notDesired},
			ev:    EvCluster{Policy: &PolicyRead{Name: ResourceName("4.13.7", "x86_64"), Policy: cluster.BundlePolicy{Cleanup: true}}},
			phase: PhaseClusterReady, effs: []string{"start cleanup unload"}},
		// Issue 45, item 2: never while ClusterVersion asks for the release.
		{name: "spec.cleanup while desiredUpdate names the release is refused with the way out", in: PhaseClusterReady, given: []func(*Machine){withAPI, desiredHeld},
			ev:    EvCluster{Policy: &PolicyRead{Name: ResourceName("4.13.7", "x86_64"), Policy: cluster.BundlePolicy{Cleanup: true}}},
			phase: PhaseClusterReady, why: ReasonCleanupRefused, effs: []string{"save held"},
			check: func(t *testing.T, m *Machine) {
				if msg := m.Records["held"].Condition.Message; !strings.Contains(msg, "oc adm upgrade --clear") || !strings.Contains(msg, meta137.Release) {
					t.Errorf("the status says %q", msg)
				}
			}},
		{name: "spec.cleanup right after ferry asked, its copy not showing it yet, is refused", in: PhaseClusterReady,
			given: []func(*Machine){withAPI, notDesired, with(func(m *Machine) { m.askedUnseen = true })},
			ev:    EvCluster{Policy: &PolicyRead{Name: ResourceName("4.13.7", "x86_64"), Policy: cluster.BundlePolicy{Cleanup: true}}},
			phase: PhaseClusterReady, why: ReasonCleanupRefused, effs: []string{"save held"}},
		{name: "spec.cleanup at cluster-ready before ClusterVersion is read waits for it", in: PhaseClusterReady, given: []func(*Machine){withAPI},
			ev:    EvCluster{Policy: &PolicyRead{Name: ResourceName("4.13.7", "x86_64"), Policy: cluster.BundlePolicy{Cleanup: true}}},
			phase: PhaseClusterReady, why: ReasonCleanupRefused, effs: []string{"save held"}},
		{name: "a reading that desiredUpdate names the release keeps the refusal, not the pending line", in: PhaseClusterReady,
			given: []func(*Machine){withAPI, cleanupSpec},
			ev:    EvUpgradeSeen{Release: meta137.Release, St: cluster.UpgradeStatus{State: cluster.UpgradePending}},
			phase: PhaseClusterReady, why: ReasonCleanupRefused, effs: []string{"save held"}},
		{name: "desiredUpdate cleared (oc adm upgrade --clear): the standing spec.cleanup goes on", in: PhaseClusterReady,
			given: []func(*Machine){withAPI, cleanupSpec, desiredHeld},
			ev:    EvUpgradeSeen{Release: meta137.Release, St: cluster.UpgradeStatus{State: cluster.UpgradeNotAsked}},
			phase: PhaseClusterReady, effs: []string{"start cleanup unload"}},
		{name: "ferry cleanup while desiredUpdate names the release is refused", in: PhaseClusterReady, given: []func(*Machine){withAPI, desiredHeld},
			ev: EvRequest{Kind: ReqCleanup, Reply: reply}, phase: PhaseClusterReady, effs: []string{"reply error"}},
		{name: "the gate never asks for a release whose bundle spec.cleanup takes out", in: PhaseLoaded,
			given: []func(*Machine){withAPI, withPeers(nil), cleanupSpec},
			ev:    viewOf(peerIn(PhaseLoaded, heldDigest)), phase: PhaseClusterReady, effs: []string{"save held"}},
		{name: "spec.proceed on Manual asks for the upgrade", in: PhaseClusterReady,
			given: []func(*Machine){withAPI, with(func(m *Machine) { m.cfg.Schedule = "Manual" })},
			ev:    EvCluster{Policy: &PolicyRead{Name: ResourceName("4.13.7", "x86_64"), Policy: cluster.BundlePolicy{Schedule: "Manual", Proceed: true}}},
			phase: PhaseClusterReady, effs: []string{"save held", "ask upgrade held"}},
		{name: "Manual in the spec: the gate opens, nothing asked", in: PhaseLoaded,
			given: []func(*Machine){withAPI, withPeers(nil), with(func(m *Machine) {
				m.bundleName, m.bundlePolicy = ResourceName("4.13.7", "x86_64"), &cluster.BundlePolicy{Schedule: "Manual"}
			})},
			ev: viewOf(peerIn(PhaseLoaded, heldDigest)), phase: PhaseClusterReady, effs: []string{"save held"}},
		{name: "another bundle's spec does nothing here", in: PhaseClusterReady, given: []func(*Machine){withAPI},
			ev: EvCluster{Policy: &PolicyRead{Name: ResourceName("4.13.8", "x86_64"), Policy: cluster.BundlePolicy{Cleanup: true}}}, phase: PhaseClusterReady},

		// Following the cluster's upgrade.
		{name: "the ask refused is retried, said once", in: PhaseClusterReady,
			given: []func(*Machine){withAPI, with(func(m *Machine) { m.asking = true; m.Records["held"].Upgrade = &UpgradeRun{Requested: m.Now()} })},
			ev:    EvUpgradeAsked{ID: "held", Err: errors.New("connection refused")}, phase: PhaseClusterReady, why: ReasonUpgradeRequestFailed, effs: []string{"save held"}},
		{name: "the release not approved by the administrator: waiting, healthy, the command that approves it shown", in: PhaseClusterReady,
			given: []func(*Machine){withAPI, with(func(m *Machine) { m.asking = true; m.Records["held"].Upgrade = &UpgradeRun{Requested: m.Now()} })},
			ev:    EvUpgradeAsked{ID: "held", Err: fmt.Errorf("writing the release signatures: %w: denied", cluster.ErrReleaseUnapproved)},
			phase: PhaseClusterReady, why: ReasonReleaseUnapproved, effs: []string{"save held"},
			check: func(t *testing.T, m *Machine) {
				s := m.NodeStatus()
				if !s.Healthy || !strings.Contains(Annotations(s)[AnnotationReason], cluster.ApproveCommand(meta137.Release)) || !m.asking {
					t.Errorf("status %+v asking %v: want healthy, the oc command on the Node, still asking", s, m.asking)
				}
			}},
		{name: "the ask accepted runs the hook", in: PhaseClusterReady,
			given: []func(*Machine){withAPI, with(func(m *Machine) { m.asking = true; m.Records["held"].Upgrade = &UpgradeRun{Requested: m.Now()} })},
			ev:    EvUpgradeAsked{ID: "held"}, phase: PhaseClusterReady, effs: []string{"save held", "save held", "run hook held"}},
		{name: "the operator at work: upgrading", in: PhaseClusterReady, given: []func(*Machine){withAPI},
			ev:    EvUpgradeSeen{Release: meta137.Release, St: cluster.UpgradeStatus{State: cluster.UpgradeRunning, Message: "Working towards 4.13.7"}},
			phase: PhaseUpgrading, effs: []string{"save held"}},
		{name: "the operator not started yet", in: PhaseClusterReady, given: []func(*Machine){withAPI},
			ev: EvUpgradeSeen{Release: meta137.Release, St: cluster.UpgradeStatus{State: cluster.UpgradePending}}, phase: PhaseClusterReady, why: ReasonUpgradePending, effs: []string{"save held"}},
		{name: "the release refused, in the operator's words", in: PhaseClusterReady, given: []func(*Machine){withAPI},
			ev:    EvUpgradeSeen{Release: meta137.Release, St: cluster.UpgradeStatus{State: cluster.UpgradeRefused, Reason: "cannot be verified"}},
			phase: PhaseClusterReady, why: ReasonReleaseRefused, effs: []string{"save held"},
			check: func(t *testing.T, m *Machine) {
				if s := m.NodeStatus(); s.Healthy || !strings.Contains(Annotations(s)[AnnotationReason], "cannot be verified") {
					t.Errorf("status %+v: want unhealthy, the operator's words on the Node", s)
				}
			}},
		{name: "an upgrade found completed at cluster-ready: upgraded", in: PhaseClusterReady, given: []func(*Machine){withAPI},
			ev: EvUpgradeSeen{Release: meta137.Release, St: cluster.UpgradeStatus{State: cluster.UpgradeCompleted}}, phase: PhaseUpgraded, why: ReasonNodeUnread, effs: []string{"save held"}},
		{name: "another release's upgrade says nothing of this bundle", in: PhaseClusterReady, given: []func(*Machine){withAPI},
			ev: EvUpgradeSeen{Release: meta138.Release, St: cluster.UpgradeStatus{State: cluster.UpgradeCompleted}}, phase: PhaseClusterReady},
		{name: "completed, the node not read yet: it waits for its state", in: PhaseUpgrading, given: []func(*Machine){withAPI},
			ev: EvUpgradeSeen{Release: meta137.Release, St: cluster.UpgradeStatus{State: cluster.UpgradeCompleted}}, phase: PhaseUpgraded, why: ReasonNodeUnread, effs: []string{"save held"}},
		{name: "cluster-ready: the node's config from before the upgrade is recorded", in: PhaseClusterReady, given: []func(*Machine){withAPI},
			ev: EvNodeSeen{managed("Done", "rendered-old", "rendered-old", "rendered-old", false)}, phase: PhaseClusterReady, effs: []string{"save held"},
			check: func(t *testing.T, m *Machine) {
				if got := m.Records["held"].MachineConfig; got != "rendered-old" {
					t.Errorf("machine config %q", got)
				}
			}},
		{name: "cluster-ready on a node without the MCO: no config recorded", in: PhaseClusterReady, given: []func(*Machine){withAPI},
			ev: EvNodeSeen{cluster.NodeUpdate{}}, phase: PhaseClusterReady,
			check: func(t *testing.T, m *Machine) {
				if got := m.Records["held"].MachineConfig; got != "" {
					t.Errorf("machine config %q", got)
				}
			}},
		{name: "upgraded, the pool not at the node yet: it keeps the bundle", in: PhaseUpgraded, given: []func(*Machine){upgradedWaiting},
			ev: EvNodeSeen{managed("Done", "rendered-old", "rendered-old", "rendered-new", false)}, phase: PhaseUpgraded, why: ReasonNodeUpdating, effs: []string{"save held"}},
		{name: "upgraded, the MCO at work on the node: it keeps the bundle", in: PhaseUpgraded, given: []func(*Machine){upgradedWaiting},
			ev: EvNodeSeen{managed("Working", "rendered-old", "rendered-new", "rendered-new", false)}, phase: PhaseUpgraded, why: ReasonNodeUpdating, effs: []string{"save held"}},
		{name: "upgraded, the pool paused: it keeps the bundle", in: PhaseUpgraded, given: []func(*Machine){upgradedWaiting},
			ev: EvNodeSeen{managed("Done", "rendered-old", "rendered-old", "rendered-new", true)}, phase: PhaseUpgraded, why: ReasonPoolPaused, effs: []string{"save held"}},
		{name: "upgraded, done on the config from before: not done", in: PhaseUpgraded, given: []func(*Machine){upgradedWaiting},
			ev: EvNodeSeen{managed("Done", "rendered-old", "rendered-old", "", false)}, phase: PhaseUpgraded, why: ReasonNodeUpdating, effs: []string{"save held"}},
		{name: "upgraded, the MCO done with the node: retired", in: PhaseUpgraded, given: []func(*Machine){upgradedWaiting},
			ev: EvNodeSeen{managed("Done", "rendered-new", "rendered-new", "rendered-new", false)}, phase: PhaseUpgraded, why: ReasonCleaningUp,
			effs: []string{"save held", "start retire unload retain"},
			check: func(t *testing.T, m *Machine) {
				if m.ReadsNode() {
					t.Error("the node's machine config state is still read once retiring")
				}
			}},
		{name: "upgraded, a node without the MCO is done at Completed", in: PhaseUpgraded, given: []func(*Machine){upgradedWaiting},
			ev: EvNodeSeen{cluster.NodeUpdate{}}, phase: PhaseUpgraded, why: ReasonCleaningUp, effs: []string{"save held", "start retire unload retain"}},

		// The running release's kept tree.
		{name: "a runtime check on an idle node restores the running release", in: PhaseIdle, given: []func(*Machine){runningRelease},
			ev: EvRuntimeCheck{"CRI-O restarted"}, phase: PhaseIdle, effs: []string{"start restore"}},
		{name: "a runtime check while a bundle loads waits for it", in: PhaseLoading, given: []func(*Machine){runningRelease, running(JobLoad)},
			ev: EvRuntimeCheck{"periodic check"}, phase: PhaseLoading,
			check: func(t *testing.T, m *Machine) {
				if m.restoreDue != "periodic check" {
					t.Errorf("restore due %q", m.restoreDue)
				}
			}},
		{name: "a runtime check without a kept tree does nothing", in: PhaseIdle, ev: EvRuntimeCheck{"CRI-O restarted"}, phase: PhaseIdle},
	})
}

// onDisk is the start of a node whose state dir holds the held bundle's
// record, in phase p, as f leaves it.
func onDisk(p Phase, f func(*Record)) EvStart {
	r := heldRecord()
	r.Phase, r.Times = p, map[Phase]time.Time{p: time.Date(2026, 11, 22, 7, 0, 0, 0, time.UTC)}
	if f != nil {
		f(r)
	}
	return EvStart{Records: []*Record{r}}
}

func TestStepTable_Restarts(t *testing.T) {
	runRows(t, []stepRow{
		{name: "a restart mid-copy removes the published dir and waits for the stick", in: PhaseIdle, ev: onDisk(PhaseDetected, nil),
			phase: PhaseDetected, why: ReasonCopyInterrupted, effs: []string{"remove 4.13.7-x86_64", "save held"}},
		{name: "a restart with the waiting bundle now approved loads it", in: PhaseIdle,
			given: []func(*Machine){approvalRequired, with(func(m *Machine) { m.policy.ApprovedDigests = []string{heldDigest} })},
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
func excludeB(p cluster.BundlePolicy) EvCluster {
	p.ExcludedNodes = []string{"b"}
	return EvCluster{Policy: &PolicyRead{Name: ResourceName("4.13.7", "x86_64"), Policy: p,
		Excluded: map[string]string{"b": "listed in spec.excludedNodes"}, Hosts: map[string]string{"b": "10.0.0.2"}}}
}

// withoutFerry: the API lists b and this node with a record, and the
// machine config operator counts n more nodes (no ferry there).
func withoutFerry(n int) func(*Machine) {
	return func(m *Machine) { m.Recorded, m.Unrecorded = []string{"b", "node-a"}, n }
}

// TestStepTable_NodesWithoutFerry: the gate waits for the nodes the
// machine config operator counts and no record names (ferry does not run
// there), unless the administrator excludes them by name; loading goes on.
func TestStepTable_NodesWithoutFerry(t *testing.T) {
	reply := ReplyID(1)
	loadedB := withPeers(peerIn(PhaseLoaded, heldDigest))
	threeMachines := EvPeerList{Peers: []string{peerB}, Recorded: []string{"b", "node-a"}, Unrecorded: 1}
	runRows(t, []stepRow{
		{name: "3 machines, 2 with ferry, both loaded: not cluster-ready, saying why", in: PhaseLoaded, given: []func(*Machine){loadedB},
			ev: threeMachines, phase: PhaseLoaded, why: ReasonNodesWithoutFerry, effs: []string{"save held"},
			check: func(t *testing.T, m *Machine) {
				held := m.Records["held"].Condition
				if s := m.NodeStatus(); s.Message != held.Message || !held.Healthy() || m.Unrecorded != 1 {
					t.Errorf("status %+v", s)
				}
				if d := m.ClusterView(m.standing()).Decision; d.Verdict != Waiting || d.Message != held.Message {
					t.Errorf("ferry status --cluster: %+v", d)
				}
			}},
		{name: "the same at the next poll of the peers saves nothing", in: PhaseLoaded,
			given: []func(*Machine){loadedB, withoutFerry(1), with(func(m *Machine) { m.Records["held"].Condition = m.nodesWithoutFerry() })},
			ev:    viewOf(peerIn(PhaseLoaded, heldDigest)), phase: PhaseLoaded, why: ReasonNodesWithoutFerry},
		{name: "alone with ferry among 2 machines: the gate stays shut", in: PhaseLoaded, given: []func(*Machine){withPeers(nil)},
			ev: EvPeerList{Recorded: []string{"node-a"}, Unrecorded: 1}, phase: PhaseLoaded, why: ReasonNodesWithoutFerry, effs: []string{"save held"}},
		{name: "the administrator excludes the third name: the gate opens", in: PhaseLoaded, given: []func(*Machine){withAPI, loadedB, withoutFerry(1)},
			ev: EvCluster{Policy: &PolicyRead{Name: ResourceName("4.13.7", "x86_64"), Policy: cluster.BundlePolicy{ExcludedNodes: []string{"c"}},
				Excluded: map[string]string{"c": "listed in spec.excludedNodes"}}},
			phase: PhaseClusterReady, effs: []string{"save held", "save held", "ask upgrade held"}},
		{name: "excluding a node that runs ferry leaves out none without it", in: PhaseLoaded, given: []func(*Machine){withAPI, loadedB, withoutFerry(1)},
			ev: excludeB(cluster.BundlePolicy{}), phase: PhaseLoaded, why: ReasonNodesWithoutFerry, effs: []string{"save held"}},
		{name: "pools unknown (no MCO): the gate opens as before", in: PhaseLoaded, given: []func(*Machine){loadedB},
			ev: EvPeerList{Peers: []string{peerB}, Recorded: []string{"b", "node-a"}}, phase: PhaseClusterReady, effs: []string{"save held", "save held", "run hook held"}},
		{name: "cluster-ready, a node without ferry counted before the ask: no hook, no ask", in: PhaseClusterReady, given: []func(*Machine){loadedB},
			ev: threeMachines, phase: PhaseClusterReady, why: ReasonNodesWithoutFerry, effs: []string{"save held"}},
		{name: "ferry runs on every node counted now: the wait clears, the hook runs", in: PhaseClusterReady,
			given: []func(*Machine){loadedB, withoutFerry(1), with(func(m *Machine) { m.Records["held"].Condition = m.nodesWithoutFerry() })},
			ev:    EvPeerList{Peers: []string{peerB}, Recorded: []string{"b", "node-a"}}, phase: PhaseClusterReady, effs: []string{"save held", "save held", "run hook held"}},
		{name: "the upgrade asked already: a node without ferry changes nothing", in: PhaseClusterReady,
			given: []func(*Machine){withAPI, loadedB, with(func(m *Machine) { m.Records["held"].Upgrade = &UpgradeRun{Requested: m.Now()} })},
			ev:    threeMachines, phase: PhaseClusterReady},
		{name: "ferry proceed while nodes run no ferry is refused", in: PhaseLoaded,
			given: []func(*Machine){loadedB, withoutFerry(1), with(func(m *Machine) { m.Records["held"].Condition = m.nodesWithoutFerry() })},
			ev:    EvRequest{Kind: reqProceed, Reply: reply}, phase: PhaseLoaded, why: ReasonNodesWithoutFerry, effs: []string{"reply error"},
			check: func(t *testing.T, m *Machine) {
				var err error
				for _, e := range m.Step(EvRequest{Kind: reqProceed, Reply: reply}) {
					if r, ok := e.(EffReply); ok {
						err = r.Err
					}
				}
				if err == nil || !strings.Contains(err.Error(), "counts 3 nodes, 2 run ferry") {
					t.Errorf("reply %v", err)
				}
			}},
		{name: "nodes without ferry do not hold the load back", in: PhaseExtracted,
			given: []func(*Machine){approvedHeld, withPeers(peerIn(PhaseExtracted, heldDigest)), withoutFerry(1)},
			ev:    EvRetry{}, phase: PhaseLoading, effs: []string{"save held", "start load"}},
	})
}

// errNoBundle is what the agent's probe says of a stick without a bundle.
var errNoBundle = errors.New("no upgrade bundle here")
