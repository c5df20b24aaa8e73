package machine

import (
	"time"

	"github.com/ferry-edge/ferry/bundle/meta"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
)

// The loop turns everything that happens into an event, hands it to step
// (step.go), which alone changes the agent's state, and performs the
// effects step returns (loop.go). Nothing else touches the state.

type Event interface{ isEvent() }

// The machine holds no open file and no channel: the agent keeps them and
// gives the machine their ids (0: none).
type (
	// MediumID names an open stick or the files ferry load passed.
	MediumID uint64
	// ReplyID names a caller waiting for its request's answer.
	ReplyID uint64
)

// evStart: the agent starts with the records found on disk.
type EvStart struct{ Records []*Record }

// evDevice: a block device appeared, changed or went away.
type EvDevice struct{ DeviceEvent }

// evOffer: a probe (effProbe) looked at a stick or a file.
type EvOffer struct {
	Origin Origin
	Device string // "" for a file
	Src    meta.Source
	Medium MediumID // open until step keeps it for an extraction or closes it
	Meta   *meta.Metadata
	// digest is what the source says it is (.sha256, or a raw device read
	// whole because the node holds a bundle already); "" when unknown.
	Digest digest.Digest
	// err: no bundle there (noBundle) or one that cannot be read.
	Err      error
	NoBundle bool
	// differs: a raw device read whole does not hold the held bundle.
	Differs bool
	Reply   ReplyID // ferry load waits for the decision
}

// evJobDone: the running job ended.
type EvJobDone struct {
	Kind    jobKind
	ID      string
	Stopped bool // cancelled (agent stopping, stick pulled, cleanup)
	Res     *meta.Result
	Err     error
	// restore: how many images CRI-O lacked
	Restored int
}

// evRuntimeCheck: CRI-O restarted, or it is time to check that it still
// holds the running release's images.
type EvRuntimeCheck struct{ Why string }

// evProgress: the running job moved (throttled by the job).
type EvProgress struct {
	ID string
	P  Progress
}

// evView: a fresh poll of the peers.
type EvView struct{ View }

// evRequest: a request from the status API.
type EvRequest struct {
	Kind   RequestKind
	Medium MediumID // load: the bundle's open files (ferry load passes them)
	// approve is the digest of a bundle this node made from the registry
	// as asked (registry mode): the request is its approval.
	Approve string
	Reply   ReplyID
}

// evHookDone: the on_ready hook finished.
type EvHookDone struct {
	ID  string
	Run HookRun
}

// evUpgradeAsked: one try at asking the cluster for the upgrade (err nil:
// accepted).
type EvUpgradeAsked struct {
	ID  string
	Err error
}

// evUpgradeSeen: how the cluster's upgrade to release stands.
type EvUpgradeSeen struct {
	Release string
	St      cluster.UpgradeStatus
}

// evNodeSeen: how the machine config operator stands with this node.
type EvNodeSeen struct{ St cluster.NodeUpdate }

// evPreflight: the cluster's preflight warnings on the bundle being read.
type EvPreflight struct {
	ID       string
	Warnings []string
}

// evPeerList: the other nodes, as the cluster's API lists them; the names
// of the nodes with a record (this one's included), and how many nodes
// the machine config operator counts beyond them (ferry does not run
// there: 0 without the MCO).
type EvPeerList struct {
	Peers      []string
	Recorded   []string
	Unrecorded int
}

// EvCluster: one reading of the cluster's UpgradeBundles, by the one
// follower of their watched list. A part is nil when that reading did not
// change it, or could not read it.
type EvCluster struct {
	// Approvals: every UpgradeBundle's spec.approvedDigest.
	Approvals *ApprovalsRead
	// Sources: the releases their spec.source asks for, as they approve.
	Sources *SourcesRead
	// Policy: the active bundle's own UpgradeBundle.
	Policy *PolicyRead
}

// evRetry: the backoff timer fired.
type EvRetry struct{}

func (EvStart) isEvent()        {}
func (EvDevice) isEvent()       {}
func (EvOffer) isEvent()        {}
func (EvJobDone) isEvent()      {}
func (EvProgress) isEvent()     {}
func (EvView) isEvent()         {}
func (EvRequest) isEvent()      {}
func (EvHookDone) isEvent()     {}
func (EvRetry) isEvent()        {}
func (EvUpgradeAsked) isEvent() {}
func (EvUpgradeSeen) isEvent()  {}
func (EvPeerList) isEvent()     {}
func (EvNodeSeen) isEvent()     {}
func (EvPreflight) isEvent()    {}
func (EvRuntimeCheck) isEvent() {}

type jobKind string

const (
	JobExtract jobKind = "extract"
	JobFetch   jobKind = "fetch"
	JobLoad    jobKind = "load"
	JobCleanup jobKind = "cleanup" // taken out before it was the cluster's release
	JobRetire  jobKind = "retire"  // upgraded: registry, mirror go (files too unless kept); the previous bundle's pins go
	JobRestore jobKind = "restore" // the running release's images CRI-O lost, loaded again from the tree kept
)

type RequestKind string

const (
	ReqLoad    RequestKind = "load"
	ReqCleanup RequestKind = "cleanup"
	reqProceed RequestKind = "proceed"
)

// Effects: what step asks the loop to do. Each is performed in order on
// the loop goroutine; long ones start a goroutine that reports back with
// an event.

type Effect interface{ isEffect() }

// effSave persists a record (the loop is the only writer).
type EffSave struct{ Rec *Record }

// effForget deletes a record from the store (a refused offer expired).
type EffForget struct{ ID string }

// effProbe opens a device (or a file, for ferry load) and reads its
// metadata; a raw device is read whole only when the node holds a bundle
// whose digest it must be compared with.
type EffProbe struct {
	Origin Origin
	Ev     DeviceEvent   // a stick
	Medium MediumID      // a file given to ferry load, open
	Held   digest.Digest // the held bundle's digest, "" for none
	Reply  ReplyID
}

// effStartJob starts the one job a node runs at a time.
type EffStartJob struct {
	Kind jobKind
	Rec  *Record
	// extract
	Src    meta.Source
	Policy meta.Policy
	Pieces bool // hash the peers' piece list in the same pass
	// load: pins of the previous bundle to keep
	Keep []string
	// cleanup
	Unload bool
	// retire: the previous bundle, whose pins go now; retain keeps the
	// bundle's files as the running release's source
	Previous *Record
	Retain   bool
}

// effUnshare stops serving a bundle to the peers.
type EffUnshare struct{ Digest digest.Digest }

// effStopJob cancels the running job; its evJobDone follows.
type EffStopJob struct{}

type EffCloseMedium struct{ M MediumID }

// effShare serves an extracted bundle to the peers.
type EffShare struct {
	Rec *Record
}

// effRemove deletes a path (a dir never to be trusted, a fetched tar).
type EffRemove struct{ Path string }

// effResumeLoader serves a loaded bundle's registry again after a restart.
type EffResumeLoader struct {
	Rec  *Record
	Keep []string
}

// effRunHook runs on_ready; its record is already marked started.
type EffRunHook struct{ Rec *Record }

// effAskUpgrade asks the cluster for the upgrade, retrying until accepted.
type EffAskUpgrade struct{ Rec *Record }

// effRetryIn arms the backoff timer.
type EffRetryIn struct{ After time.Duration }

// effAnnounce tells systemd the status line of the state a record moved
// into (a step may move it twice: extracted, then loading).
type EffAnnounce struct{ Rep report }

// effReply answers a request.
type EffReply struct {
	Ch  ReplyID
	Err error
}

func (EffSave) isEffect()         {}
func (EffForget) isEffect()       {}
func (EffProbe) isEffect()        {}
func (EffStartJob) isEffect()     {}
func (EffUnshare) isEffect()      {}
func (EffStopJob) isEffect()      {}
func (EffCloseMedium) isEffect()  {}
func (EffShare) isEffect()        {}
func (EffRemove) isEffect()       {}
func (EffResumeLoader) isEffect() {}
func (EffRunHook) isEffect()      {}
func (EffRetryIn) isEffect()      {}
func (EffReply) isEffect()        {}
func (EffAnnounce) isEffect()     {}
func (EffAskUpgrade) isEffect()   {}
func (EvCluster) isEvent()        {}

// DeviceEvent is a block device appearing, changing or going away.
type DeviceEvent struct {
	Action string // "add", "change", "remove"
	Device string // /dev/sda1
	FSType string // "" for none (a raw tar, or not yet probed)
}
