package agent

import (
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/peer"
)

// The loop turns everything that happens into an event, hands it to step
// (step.go), which alone changes the agent's state, and performs the
// effects step returns (loop.go). Nothing else touches the state.

type event interface{ isEvent() }

// The machine holds no open file and no channel: the agent keeps them and
// gives the machine their ids (0: none).
type (
	// MediumID names an open stick or the files ferry load passed.
	MediumID uint64
	// ReplyID names a caller waiting for its request's answer.
	ReplyID uint64
)

// evStart: the agent starts with the records found on disk.
type evStart struct{ records []*Record }

// evDevice: a block device appeared, changed or went away.
type evDevice struct{ DeviceEvent }

// evOffer: a probe (effProbe) looked at a stick or a file.
type evOffer struct {
	origin Origin
	device string // "" for a file
	src    bundle.Source
	medium MediumID // open until step keeps it for an extraction or closes it
	meta   *bundle.Metadata
	// digest is what the source says it is (.sha256, or a raw device read
	// whole because the node holds a bundle already); "" when unknown.
	digest digest.Digest
	// err: no bundle there (noBundle) or one that cannot be read.
	err      error
	noBundle bool
	// differs: a raw device read whole does not hold the held bundle.
	differs bool
	reply   ReplyID // ferry load waits for the decision
}

// evJobDone: the running job ended.
type evJobDone struct {
	kind    jobKind
	id      string
	stopped bool // cancelled (agent stopping, stick pulled, cleanup)
	res     *bundle.Result
	pieces  *peer.PieceList
	err     error
	// restore: how many images CRI-O lacked
	restored int
}

// evRuntimeCheck: CRI-O restarted, or it is time to check that it still
// holds the running release's images.
type evRuntimeCheck struct{ why string }

// evProgress: the running job moved (throttled by the job).
type evProgress struct {
	id string
	p  Progress
}

// evView: a fresh poll of the peers.
type evView struct{ view }

// evRequest: a request from the status API.
type evRequest struct {
	kind   requestKind
	medium MediumID // load: the bundle's open files (ferry load passes them)
	// approve is the digest of a bundle this node made from the registry
	// as asked (registry mode): the request is its approval.
	approve string
	reply   ReplyID
}

// evHookDone: the on_ready hook finished.
type evHookDone struct {
	id  string
	run HookRun
}

// evUpgradeAsked: one try at asking the cluster for the upgrade (err nil:
// accepted).
type evUpgradeAsked struct {
	id  string
	err error
}

// evUpgradeSeen: how the cluster's upgrade to release stands.
type evUpgradeSeen struct {
	release string
	st      cluster.UpgradeStatus
}

// evNodeSeen: how the machine config operator stands with this node.
type evNodeSeen struct{ st cluster.NodeUpdate }

// evPreflight: the cluster's preflight warnings on the bundle being read.
type evPreflight struct {
	id       string
	warnings []string
}

// evPeerList: the other nodes, as the cluster's API lists them; the names
// of the nodes with a record (this one's included), and how many nodes
// the machine config operator counts beyond them (ferry does not run
// there: 0 without the MCO).
type evPeerList struct {
	peers      []string
	recorded   []string
	unrecorded int
}

// evRetry: the backoff timer fired.
type evRetry struct{}

func (evStart) isEvent()        {}
func (evDevice) isEvent()       {}
func (evOffer) isEvent()        {}
func (evJobDone) isEvent()      {}
func (evProgress) isEvent()     {}
func (evView) isEvent()         {}
func (evRequest) isEvent()      {}
func (evHookDone) isEvent()     {}
func (evRetry) isEvent()        {}
func (evUpgradeAsked) isEvent() {}
func (evUpgradeSeen) isEvent()  {}
func (evPeerList) isEvent()     {}
func (evNodeSeen) isEvent()     {}
func (evPreflight) isEvent()    {}
func (evRuntimeCheck) isEvent() {}

type jobKind string

const (
	jobExtract jobKind = "extract"
	jobFetch   jobKind = "fetch"
	jobLoad    jobKind = "load"
	jobCleanup jobKind = "cleanup" // taken out before it was the cluster's release
	jobRetire  jobKind = "retire"  // upgraded: registry, mirror go (files too unless kept); the previous bundle's pins go
	jobRestore jobKind = "restore" // the running release's images CRI-O lost, loaded again from the tree kept
)

type requestKind string

const (
	reqLoad    requestKind = "load"
	reqCleanup requestKind = "cleanup"
	reqProceed requestKind = "proceed"
)

// Effects: what step asks the loop to do. Each is performed in order on
// the loop goroutine; long ones start a goroutine that reports back with
// an event.

type effect interface{ isEffect() }

// effSave persists a record (the loop is the only writer).
type effSave struct{ rec *Record }

// effForget deletes a record from the store (a refused offer expired).
type effForget struct{ id string }

// effProbe opens a device (or a file, for ferry load) and reads its
// metadata; a raw device is read whole only when the node holds a bundle
// whose digest it must be compared with.
type effProbe struct {
	origin Origin
	ev     DeviceEvent   // a stick
	medium MediumID      // a file given to ferry load, open
	held   digest.Digest // the held bundle's digest, "" for none
	reply  ReplyID
}

// effStartJob starts the one job a node runs at a time.
type effStartJob struct {
	kind jobKind
	rec  *Record
	// extract
	src    bundle.Source
	policy bundle.Policy
	pieces bool // hash the peers' piece list in the same pass
	// load: pins of the previous bundle to keep
	keep []string
	// cleanup
	unload bool
	// retire: the previous bundle, whose pins go now; retain keeps the
	// bundle's files as the running release's source
	previous *Record
	retain   bool
}

// effUnshare stops serving a bundle to the peers.
type effUnshare struct{ digest digest.Digest }

// effStopJob cancels the running job; its evJobDone follows.
type effStopJob struct{}

type effCloseMedium struct{ m MediumID }

// effShare serves an extracted bundle to the peers.
type effShare struct {
	rec    *Record
	pieces *peer.PieceList
}

// effRemove deletes a path (a dir never to be trusted, a fetched tar).
type effRemove struct{ path string }

// effResumeLoader serves a loaded bundle's registry again after a restart.
type effResumeLoader struct {
	rec  *Record
	keep []string
}

// effRunHook runs on_ready; its record is already marked started.
type effRunHook struct{ rec *Record }

// effAskUpgrade asks the cluster for the upgrade, retrying until accepted.
type effAskUpgrade struct{ rec *Record }

// effRetryIn arms the backoff timer.
type effRetryIn struct{ after time.Duration }

// effAnnounce tells systemd the status line of the state a record moved
// into (a step may move it twice: extracted, then loading).
type effAnnounce struct{ rep report }

// effReply answers a request.
type effReply struct {
	ch  ReplyID
	err error
}

func (effSave) isEffect()         {}
func (effForget) isEffect()       {}
func (effProbe) isEffect()        {}
func (effStartJob) isEffect()     {}
func (effUnshare) isEffect()      {}
func (effStopJob) isEffect()      {}
func (effCloseMedium) isEffect()  {}
func (effShare) isEffect()        {}
func (effRemove) isEffect()       {}
func (effResumeLoader) isEffect() {}
func (effRunHook) isEffect()      {}
func (effRetryIn) isEffect()      {}
func (effReply) isEffect()        {}
func (effAnnounce) isEffect()     {}
func (effAskUpgrade) isEffect()   {}
