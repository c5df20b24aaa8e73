// Package agent drives one node: it takes a bundle from a stick (or a
// file, or its peers), verifies and extracts it, has it loaded into
// CRI-O, persists every step and reports status.
//
// One goroutine, the loop (loop.go), owns the state machine
// (agent/machine): events go into its Step, the transition table, which
// returns effects that the loop performs; long work runs as jobs (jobs.go)
// that report back with events.
// After each step the loop publishes an immutable snapshot that Status,
// PeerStatus and Cluster read without locks.
package agent

import (
	"context"
	"errors"
	"fmt"
	"github.com/ferry-edge/ferry/agent/machine"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/pacing"
	"github.com/ferry-edge/ferry/pull/pullspec"
)

// DeviceSource delivers device events, starting with the devices present.
type DeviceSource interface {
	Events(ctx context.Context) (<-chan machine.DeviceEvent, error)
}

// MediaOpener mounts (or opens raw) a device and lists the bundles on it.
type MediaOpener interface {
	Open(ctx context.Context, ev machine.DeviceEvent) (Medium, error)
}

// Medium is an opened stick.
type Medium interface {
	Bundles() []bundle.Source
	Close() error
}

// Loader puts an extracted bundle into the container runtime and takes it
// out again (load.Loader, wired in cmd/ferry).
type Loader interface {
	// Load pulls and pins images, meta's as this node loads them
	// (Record.Images: some perhaps by digest only); keep are pins of the
	// previous bundle, whose release runs until this one's upgrade is
	// done.
	Load(ctx context.Context, meta *bundle.Metadata, images []string, dir string, keep []string, progress func(done, total int)) error
	// Resume serves a loaded bundle again after a restart (its registry).
	Resume(ctx context.Context, meta *bundle.Metadata, images []string, dir string, keep []string) error
	// Retire is the end of a bundle whose upgrade is done: its registry,
	// mirror and CA go, its pins stay.
	Retire(ctx context.Context, meta *bundle.Metadata, dir string) error
	// Restore loads the images of a retired bundle that CRI-O lacks again
	// from its tree in dir (served for as long as it takes), and tells
	// how many it lacked.
	Restore(ctx context.Context, meta *bundle.Metadata, images []string, dir string) (int, error)
	// Unpin drops the pins of a bundle (the previous one, once the next
	// upgrade is done): images are its images.
	Unpin(ctx context.Context, meta *bundle.Metadata, images []string) error
	// Cleanup takes out a bundle that never became the cluster's release:
	// pins, mirror, CA and registry.
	Cleanup(ctx context.Context, meta *bundle.Metadata, dir string) error
	// CheckRoomBefore fails (diskspace.ErrNoSpace) when there is no room
	// to write the bundle's bytes (writes: bytes by directory) and then
	// load it.
	CheckRoomBefore(ctx context.Context, meta *bundle.Metadata, writes map[string]int64) error
}

// Notifier is systemd's view of the agent (no-ops off systemd).
type Notifier interface {
	Ready()
	Status(line string)
}

// Deps are the agent's outside parts; nil ones are off.
type Deps struct {
	Devices DeviceSource
	Media   MediaOpener
	Loader  Loader
	Peers   Peers
	API     ClusterAPI // nil: no Kubernetes API; the on_ready hook is the only way out
	Notify  Notifier
	// Admit, when set, checks each verified bundle before it leaves its
	// staging dir (the node's signature policy): its error refuses it.
	Admit func(*bundle.Metadata, bundle.Tree) (bundle.Admission, error)
	Log   *slog.Logger
	Now   func() time.Time
	// APIPoll is how often the followers of the cluster's API read again
	// when nothing woke them (a resync: ClusterAPI.Changes and the node's
	// own changes wake them at once); 0 is a minute.
	APIPoll time.Duration
	// PeerPoll is how often the peers are asked when no bundle moves; 0
	// is 2 s (tests ask more often, to wait on polls rather than sleep).
	PeerPoll time.Duration
	// RetryBase is the first wait before the cluster's API is tried
	// again after a failure (asking for the upgrade, annotating the
	// Node), doubled at each failure up to a minute; 0 is a second.
	RetryBase time.Duration
	// Warnings are lasting faults of the node's setup that do not stop it
	// (e.g. a kubeconfig that does not check the API server's
	// certificate): logged at start and shown in every status.
	Warnings []string
	// Pacer, when set, paces extraction by the node's pressure, and its
	// reason shows in the status line (NewPacer; nil: full speed).
	Pacer Pacer
	// Puller, when set, is registry mode: releases pulled from the site's
	// registry (ferry load --release), handed back with RequestPulled.
	Puller Puller
	// Published, when set, is given every status the loop publishes, in
	// order (the metrics follow the phases with it); it must not block.
	Published func(Status)
}

// Puller copies a release from the site's registry into a bundle on this
// node (pull.Puller).
type Puller interface {
	// Start pulls req, again if it failed or was done before (the
	// technician's ferry load --release).
	Start(req pullspec.Request) error
	// Ensure pulls req unless it is under way, done or failed for good
	// (the cluster's UpgradeBundle, read again and again).
	Ensure(req pullspec.Request) error
	// Unfollow ends this node's following of another's pull of release
	// (the agent holds it already).
	Unfollow(release string)
	Status() *pullspec.Status
}

// Pacer holds the bulk work back while the node is under pressure
// (internal/pacing.Governor).
type Pacer interface {
	bundle.Pacer
	// HoldingBack says why the bulk work is slowed ("io pressure 23%"),
	// or "" when it runs at full speed.
	HoldingBack() string
}

// NewPacer is the governor cfg asks for, and the sampler to run beside the
// agent; nil, nil with pacing off.
func NewPacer(cfg Pacing, log *slog.Logger) (*pacing.Governor, func(ctx context.Context) error) {
	lim, ok := pacing.LimitsFor(cfg.Politeness)
	if !cfg.Enabled || !ok {
		return nil, nil
	}
	dir := pacing.WatchDir(cfg.Watch)
	log.Info("pacing by pressure", "politeness", cfg.Politeness, "watch", dir)
	g := pacing.New(pacing.NewPSI(dir), lim, 0, log)
	return g, func(ctx context.Context) error { g.Run(ctx); return nil }
}

// Agent drives one node.
type Agent struct {
	cfg   Config
	deps  Deps
	log   *slog.Logger
	store *Store
	m     *machine.Machine // owned by the loop goroutine
	// handles are the open media and waiting callers the machine names.
	handles handles

	snap atomic.Pointer[snapshot]
	beat atomic.Int64 // unix nanos of the loop's last turn, for the watchdog
	// awaitingSource: the cluster asks for a release from the registry
	// that this node does not hold yet (registry.go): it moves.
	awaitingSource atomic.Bool
	// peerNodes is each peer's address by the node its certificate names
	// (never by the name it reports): a node follows the pulling node's
	// pull at its address.
	peerNodes atomic.Pointer[map[string]string]
	// postedSources are the sources last given to the loop.
	postedSources atomic.Pointer[[]bundle.ReleaseSource]
	// madePulls are the pullers' records that name the bundle made, by
	// bundle and puller: final, so not read again (followBundle's alone).
	madePulls map[string]*cluster.PullRecord
	// followed is fired when what the API's followers act on changes in
	// the snapshot (followKey).
	followed signal

	events   chan machine.Event      // from jobs, probes, hooks, requests
	progress chan machine.EvProgress // throttled job progress; dropped when full
	// annotations carries the newest Node annotations to annotate (nil
	// without an API).
	annotations chan map[string]string

	// Loop-owned handles of what runs in the background.
	life     context.Context // ends with Run
	jobStop  context.CancelFunc
	retry    *time.Timer
	bg       sync.WaitGroup
	lastLine string
}

// New prepares an agent; Run starts it.
func New(cfg Config, deps Deps) (*Agent, error) {
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.Notify == nil {
		deps.Notify = nopNotifier{}
	}
	keys, err := bundle.LoadTrustedKeys(cfg.TrustedKeys)
	if err != nil {
		return nil, fmt.Errorf("%w: trusted_keys: %v", ErrConfig, err)
	}
	store, err := OpenStore(cfg.Paths.StateDir)
	if err != nil {
		return nil, err
	}
	// An unapproved bundle from a stick or a file is verified, extracted
	// and shared, and waits for approval; one from the peers is not
	// fetched (PreApproved clears Unapproved).
	policy := bundle.Policy{Arch: cfg.Arch, ApprovedDigests: cfg.ApprovedDigests, TrustedKeys: keys,
		Required: !cfg.ApprovalOff(), Off: cfg.ApprovalOff(), Unapproved: true}
	a := &Agent{
		cfg: cfg, deps: deps, log: deps.Log, store: store,
		m: machine.NewMachine(settingsOf(cfg), policy, machine.Wiring{Now: deps.Now, Log: deps.Log, Media: deps.Media != nil,
			Loader: deps.Loader != nil, Peers: deps.Peers != nil, API: deps.API != nil, Warnings: deps.Warnings,
			ParseMetadata: bundle.ParseMetadata, ApproveOffer: bundle.ApproveOffer}),
		events:   make(chan machine.Event, 16),
		progress: make(chan machine.EvProgress, 1),
	}
	if deps.API != nil {
		a.annotations = make(chan map[string]string, 1)
	}
	a.publish()
	a.beat.Store(time.Now().UnixNano()) // alive from the start: the loop turns at once
	return a, nil
}

type nopNotifier struct{}

func (nopNotifier) Ready()        {}
func (nopNotifier) Status(string) {}

// Request asks the running agent to do something (from the status API):
// "load" the bundle in m (files ferry load opened and passed), "cleanup",
// or "proceed" (m nil). The agent owns m from then on.
func (a *Agent) Request(ctx context.Context, kind string, m Medium) error {
	return a.ask(ctx, machine.EvRequest{Kind: machine.RequestKind(kind), Medium: a.handles.addMedium(m)})
}

// ask sends req to the loop and waits for its reply.
func (a *Agent) ask(ctx context.Context, req machine.EvRequest) error {
	id, reply := a.handles.addReply()
	req.Reply = id
	select {
	case a.events <- req:
	case <-ctx.Done():
		a.handles.takeReply(id)
		if m := a.handles.takeMedium(req.Medium); m != nil {
			m.Close()
		}
		return ctx.Err()
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// RequestPulled gives the agent a bundle this node made from the registry
// as asked: loaded like a file given to ferry load, approved by the
// request (its digest is approved here, on this node only).
func (a *Agent) RequestPulled(ctx context.Context, m Medium, digest digest.Digest) error {
	return a.ask(ctx, machine.EvRequest{Kind: machine.ReqLoad, Medium: a.handles.addMedium(m), Approve: string(digest)})
}

// Pull asks for a release from the site's registry (ferry load --release).
func (a *Agent) Pull(req pullspec.Request) error {
	if a.deps.Puller == nil {
		return errors.New("registry mode is off on this node")
	}
	return a.deps.Puller.Start(req)
}

// Alive reports whether the main loop turned recently: the watchdog is
// pinged only then, so systemd restarts an agent that is stuck.
func (a *Agent) Alive() bool {
	return time.Since(time.Unix(0, a.beat.Load())) < 30*time.Second
}
