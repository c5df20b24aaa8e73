// Package agent is the state machine that drives one node: it takes a
// bundle from a stick (or a file, or its peers), verifies and extracts it,
// has it loaded into CRI-O, persists every step and reports status.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/peer"
)

// DeviceEvent is a block device appearing, changing or going away.
type DeviceEvent struct {
	Action string // "add", "change", "remove"
	Device string // /dev/sda1
	FSType string // "" for none (a raw tar, or not yet probed)
}

// DeviceSource delivers device events, starting with the devices present.
type DeviceSource interface {
	Events(ctx context.Context) (<-chan DeviceEvent, error)
}

// MediaOpener mounts (or opens raw) a device and lists the bundles on it.
type MediaOpener interface {
	Open(ctx context.Context, ev DeviceEvent) (Medium, error)
}

// Medium is an opened stick.
type Medium interface {
	Bundles() []bundle.Source
	Close() error
}

// Loader puts an extracted bundle into the container runtime and takes it
// out again.
type Loader interface {
	Load(ctx context.Context, meta *bundle.Metadata, dir string, progress func(done, total int)) error
	// Resume serves a loaded bundle again after a restart (its registry).
	Resume(ctx context.Context, meta *bundle.Metadata, dir string) error
	Cleanup(ctx context.Context, meta *bundle.Metadata, dir string) error
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
	Notify  Notifier
	Log     *slog.Logger
	Now     func() time.Time
}

// Agent drives one node.
type Agent struct {
	cfg    Config
	deps   Deps
	log    *slog.Logger
	store  *Store
	policy bundle.Policy

	mu      sync.Mutex // guards the fields below, read by the status API
	records map[string]*Record
	active  *Record
	lastBad *Record // the newest refusal, shown until a bundle succeeds
	busy    string  // what the running job does, "" when idle

	reqs    chan request
	done    chan jobResult
	jobStop context.CancelFunc
	jobDev  string // device the running job reads
	medium  Medium // kept open while its bundle is read
	retry   *time.Timer
	backoff time.Duration
	beat    time.Time // last turn of the main loop, for the watchdog
	view    view      // the peers, as last polled
}

type request struct {
	kind  string // "load", "cleanup", "proceed"
	path  string
	reply chan error
}

type jobResult struct {
	kind string // "fetch", "extract", "load"
	rec  *Record
	res  *bundle.Result
	ix   *bundle.Index
	// pieces hashed the peers' piece list in the extraction pass (nil:
	// not asked for)
	pieces *peer.PieceHasher
	err    error
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
	return &Agent{
		cfg: cfg, deps: deps, log: deps.Log, store: store,
		policy:  bundle.Policy{Arch: cfg.Arch, ApprovedDigests: cfg.ApprovedDigests, TrustedKeys: keys},
		records: map[string]*Record{},
		reqs:    make(chan request),
		done:    make(chan jobResult, 1),
	}, nil
}

type nopNotifier struct{}

func (nopNotifier) Ready()        {}
func (nopNotifier) Status(string) {}

// Run watches for bundles until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	if len(a.policy.ApprovedDigests) == 0 && len(a.policy.TrustedKeys) == 0 {
		a.log.Warn("approval is off: any bundle whose sha256 checks will be loaded; set approved_digests or trusted_keys in the config")
	}
	if err := a.resume(ctx); err != nil {
		return err
	}
	var events <-chan DeviceEvent
	if a.deps.Devices != nil {
		var err error
		if events, err = a.deps.Devices.Events(ctx); err != nil {
			return fmt.Errorf("watching devices: %w", err)
		}
	}
	views := make(chan view)
	if a.deps.Peers != nil && len(a.cfg.Peer.Peers) > 0 {
		go a.pollPeers(ctx, 2*time.Second, views)
	}
	a.deps.Notify.Ready()
	a.announce()
	defer a.stopJob()
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		a.mu.Lock()
		a.beat = time.Now()
		a.mu.Unlock()
		var retry <-chan time.Time
		if a.retry != nil {
			retry = a.retry.C
		}
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return errors.New("device events stopped")
			}
			a.onDevice(ctx, ev)
		case req := <-a.reqs:
			req.reply <- a.onRequest(ctx, req)
		case r := <-a.done:
			a.onJobDone(ctx, r)
		case v := <-views:
			a.onView(ctx, v)
		case <-retry:
			a.retry = nil
			a.next(ctx)
		case <-tick.C:
		}
		a.announce()
	}
}

// resume picks up where the last run stopped.
func (a *Agent) resume(ctx context.Context) error {
	recs, err := a.store.Load()
	if err != nil {
		return err
	}
	// Leftover staging dirs are never taken as good.
	if ents, err := os.ReadDir(a.cfg.Paths.ExtractDir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".staging-") {
				a.log.Info("removing an interrupted extraction", "dir", e.Name())
				os.RemoveAll(filepath.Join(a.cfg.Paths.ExtractDir, e.Name()))
			}
		}
	}
	a.mu.Lock()
	for _, r := range recs {
		a.records[r.ID] = r
		if r.Phase.Active() {
			a.active = r
		}
		if r.Phase == PhaseRejected || r.Phase == PhaseConflict {
			a.lastBad = r
		}
	}
	r := a.active
	a.mu.Unlock()
	if r == nil {
		return nil
	}
	a.log.Info("resuming", "phase", string(r.Phase), "bundle", r.Name, "digest", r.Digest)
	if r.Phase == PhaseDetected {
		// Interrupted mid-extraction: a published dir without the
		// extracted record is not trusted either.
		if r.Dir != "" {
			os.RemoveAll(r.Dir)
		}
		if r.Origin == "file" && r.Source != "" {
			if _, err := os.Stat(r.Source); err == nil {
				return a.startFile(ctx, r.Source)
			}
		}
		a.update(r, PhaseDetected, "interrupted before the copy finished: plug the stick in again", Progress{})
		return nil
	}
	if r.Phase != PhaseFetching {
		a.share(r, nil)
	}
	if (r.Phase == PhaseLoaded || r.Phase == PhaseClusterReady) && a.deps.Loader != nil {
		// In the background: CRI-O may still be starting.
		go func(meta *bundle.Metadata, name, dir string) {
			if err := a.deps.Loader.Resume(ctx, meta, dir); err != nil {
				a.log.Error("cannot serve the loaded bundle again", "bundle", name, "err", err)
			}
		}(r.Metadata, r.Name, r.Dir)
	}
	a.next(ctx)
	return nil
}

// next starts whatever the active bundle needs next, if nothing runs.
func (a *Agent) next(ctx context.Context) {
	a.mu.Lock()
	r, busy := a.active, a.busy
	a.mu.Unlock()
	if r == nil || busy != "" {
		return
	}
	switch r.Phase {
	case PhaseFetching:
		a.startFetch(ctx, r)
	case PhaseExtracted, PhaseLoading:
		if ok, why := a.peersAgree(r); !ok {
			if r.Reason != why {
				a.log.Info("not loading yet", "phase", string(r.Phase), "bundle", r.Name, "reason", why)
				a.update(r, r.Phase, why, r.Progress)
			}
			return
		}
		if a.deps.Loader == nil {
			return // this node only verifies, extracts and shares
		}
		a.startLoad(ctx, r)
	}
}

func (a *Agent) onDevice(ctx context.Context, ev DeviceEvent) {
	log := a.log.With("device", ev.Device)
	if ev.Action == "remove" {
		a.mu.Lock()
		reading := a.jobDev == ev.Device
		a.mu.Unlock()
		if reading {
			log.Warn("the stick was pulled while it was being read")
			a.stopJob()
		}
		return
	}
	if a.deps.Media == nil {
		return
	}
	a.mu.Lock()
	if a.jobDev == ev.Device {
		a.mu.Unlock()
		return // a change event for the stick being read
	}
	a.mu.Unlock()
	m, err := a.deps.Media.Open(ctx, ev)
	if err != nil {
		log.Debug("not an upgrade stick", "err", err)
		return
	}
	srcs := m.Bundles()
	if len(srcs) == 0 {
		m.Close()
		return
	}
	log.Info("upgrade stick found", "bundles", len(srcs))
	if !a.offer(ctx, srcs[0], "stick", ev.Device, m) {
		m.Close()
	}
}

// offer decides what to do with a bundle seen on a stick or given as a
// file; it reports whether it took ownership of m.
func (a *Agent) offer(ctx context.Context, src bundle.Source, origin, device string, m Medium) bool {
	log := a.log.With("bundle", src.Name(), "device", device)
	meta, err := bundle.InspectFile(src.Path)
	if err != nil {
		a.reject(&Record{Name: src.Name(), Origin: origin, Source: src.Path}, err)
		return false
	}
	digest := a.expectedDigest(src)
	a.mu.Lock()
	act, busy := a.active, a.busy
	a.mu.Unlock()
	if act != nil {
		same := digest != "" && digest == act.Digest ||
			digest == "" && act.Digest == "" && act.Name == src.Name()
		if digest == "" && act.Digest != "" {
			// A raw device says its digest only when read whole.
			res, err := bundle.Verify(ctx, src, bundle.Options{Policy: bundle.Policy{SpaceFactor: -1, ApprovedDigests: []string{act.Digest}}})
			same = err == nil && res.Digest == act.Digest
		}
		switch {
		case same && act.Phase == PhaseDetected && busy == "":
			log.Info("resuming the copy of this bundle")
		case same:
			log.Info("this bundle is already here; nothing to do", "phase", string(act.Phase))
			return false
		default:
			reason := fmt.Sprintf("%s differs from the bundle this node already holds (%s, %s): remove this stick; run 'ferry cleanup' first to replace the bundle",
				src.Name(), act.Name, act.Phase)
			log.Warn("conflict: a second, different bundle", "reason", reason)
			id := "conflict-" + strings.TrimPrefix(digest, "sha256:")
			if digest == "" {
				id = "conflict-" + meta.DirName()
			}
			r := &Record{ID: id, Digest: digest, Name: src.Name(), Metadata: meta, Origin: origin, Source: src.Path}
			a.save(r, PhaseConflict, reason, Progress{})
			a.mu.Lock()
			a.lastBad = r
			a.mu.Unlock()
			return false
		}
	}
	r := act
	if r == nil {
		id := strings.TrimPrefix(digest, "sha256:")
		if id == "" {
			id = "pending-" + meta.DirName()
		}
		r = &Record{ID: id, Digest: digest, Name: src.Name(), Metadata: meta, Origin: origin,
			Plugged: origin != "peer"}
	}
	a.mu.Lock()
	r.Metadata = meta
	r.Source = src.Path
	if origin == "stick" {
		r.Source = device
	}
	r.Dir = filepath.Join(a.cfg.Paths.ExtractDir, meta.DirName())
	a.active = r
	a.mu.Unlock()
	a.update(r, PhaseDetected, "", Progress{Total: meta.SizeBytes, Unit: "bytes"})
	a.startExtract(ctx, r, src, device, m)
	return true
}

// expectedDigest is the digest a source claims (.sha256), if any.
func (a *Agent) expectedDigest(src bundle.Source) string {
	if src.SHA256Path == "" {
		return ""
	}
	b, err := os.ReadFile(src.SHA256Path)
	if err != nil {
		return ""
	}
	d, err := bundle.ParseSHA256Line(b, src.Name())
	if err != nil {
		return ""
	}
	return d
}

func (a *Agent) startFile(ctx context.Context, path string) error {
	src, err := bundle.FindSource(path, "")
	if err != nil {
		return err
	}
	a.offer(ctx, src, "file", "", nil)
	return nil
}

func (a *Agent) startExtract(ctx context.Context, r *Record, src bundle.Source, device string, m Medium) {
	a.startExtractWith(ctx, r, src, device, m, a.policy)
}

func (a *Agent) startExtractWith(ctx context.Context, r *Record, src bundle.Source, device string, m Medium, pol bundle.Policy) {
	jctx, cancel := context.WithCancel(ctx)
	a.mu.Lock()
	a.busy, a.jobStop, a.jobDev, a.medium = "extract", cancel, device, m
	a.mu.Unlock()
	os.RemoveAll(r.Dir) // never trust a dir whose extraction was not recorded
	a.log.Info("verifying and extracting", "phase", "verifying", "bundle", r.Name, "device", device)
	go func() {
		var ix bundle.Index
		opts := bundle.Options{Policy: pol, Sync: true, Index: &ix, Log: a.log,
			Progress: a.throttle(r, "bytes")}
		var pieces *peer.PieceHasher
		if a.deps.Peers != nil && r.Origin != "peer" {
			// The piece list for the peers, hashed in the same pass. A
			// fetched bundle's shelf entry keeps the list it was fetched
			// and checked with.
			pieces = peer.NewPieceHasher(peer.DefaultPieceSize)
			opts.Tee = pieces
		}
		res, err := bundle.Extract(jctx, src, r.Dir, opts)
		a.done <- jobResult{kind: "extract", rec: r, res: res, ix: &ix, pieces: pieces, err: err}
	}()
}

func (a *Agent) startLoad(ctx context.Context, r *Record) {
	jctx, cancel := context.WithCancel(ctx)
	a.mu.Lock()
	a.busy, a.jobStop = "load", cancel
	a.mu.Unlock()
	a.update(r, PhaseLoading, "", Progress{Total: int64(len(r.Metadata.AllImages())), Unit: "images"})
	a.log.Info("loading into CRI-O", "phase", string(PhaseLoading), "bundle", r.Name, "digest", r.Digest)
	go func() {
		p := a.throttle(r, "images")
		err := a.deps.Loader.Load(jctx, r.Metadata, r.Dir, func(done, total int) { p(int64(done), int64(total)) })
		a.done <- jobResult{kind: "load", rec: r, err: err}
	}()
}

// throttle returns a progress callback that updates the record's progress
// and the status line at most every 500 ms.
func (a *Agent) throttle(r *Record, unit string) func(done, total int64) {
	var last time.Time
	return func(done, total int64) {
		a.mu.Lock()
		r.Progress = Progress{Done: done, Total: total, Unit: unit}
		a.mu.Unlock()
		if now := time.Now(); now.Sub(last) > 500*time.Millisecond || done == total {
			last = now
			a.announce()
		}
	}
}

func (a *Agent) stopJob() {
	a.mu.Lock()
	stop := a.jobStop
	a.mu.Unlock()
	if stop != nil {
		stop()
	}
}

func (a *Agent) onJobDone(ctx context.Context, j jobResult) {
	a.mu.Lock()
	a.busy, a.jobStop, a.jobDev = "", nil, ""
	m := a.medium
	a.medium = nil
	a.mu.Unlock()
	if m != nil {
		if err := m.Close(); err != nil {
			a.log.Warn("unmounting the stick", "err", err)
		}
	}
	r := j.rec
	switch j.kind {
	case "fetch":
		a.fetchDone(ctx, r, j.err)
	case "extract":
		a.extractDone(ctx, r, j)
	case "load":
		if j.err != nil {
			if ctx.Err() != nil {
				return
			}
			if Permanent(j.err) {
				a.backoff = 0
				a.log.Error("loading failed and cannot heal by retrying", "phase", string(PhaseFailed), "bundle", r.Name, "err", j.err)
				a.update(r, PhaseFailed, j.err.Error(), r.Progress)
				return
			}
			a.backoff = min(max(2*a.backoff, 5*time.Second), 5*time.Minute)
			reason := fmt.Sprintf("loading failed, retrying in %s: %v", a.backoff, j.err)
			a.log.Error("loading failed", "phase", string(PhaseLoading), "bundle", r.Name, "err", j.err)
			a.update(r, PhaseLoading, reason, r.Progress)
			a.retryIn(a.backoff)
			return
		}
		a.backoff = 0
		a.update(r, PhaseLoaded, "", r.Progress)
		a.log.Info("loaded: every image is present and pinned", "phase", string(PhaseLoaded), "bundle", r.Name, "digest", r.Digest)
		a.mu.Lock()
		v := a.view
		a.mu.Unlock()
		a.gate(ctx, r, v)
	}
}

func (a *Agent) retryIn(d time.Duration) {
	if a.retry != nil {
		a.retry.Stop()
	}
	a.retry = time.NewTimer(d)
}

func (a *Agent) extractDone(ctx context.Context, r *Record, j jobResult) {
	if r.Origin == "peer" && (j.err == nil || bundle.IsRefusal(j.err)) {
		defer a.removeIncoming(r)
	}
	if j.err != nil {
		if bundle.IsRefusal(j.err) {
			a.mu.Lock()
			a.active = nil
			a.mu.Unlock()
			a.reject(r, j.err)
			return
		}
		reason := "the stick was pulled or could not be read before the copy finished: plug it in again"
		if ctx.Err() != nil {
			reason = "interrupted: the agent stopped before the copy finished"
		}
		a.log.Warn("extraction interrupted", "phase", string(PhaseDetected), "bundle", r.Name, "err", j.err)
		a.update(r, PhaseDetected, reason+" ("+j.err.Error()+")", Progress{})
		return
	}
	a.mu.Lock()
	old := r.ID
	r.Digest, r.ID = j.res.Digest, strings.TrimPrefix(j.res.Digest, "sha256:")
	delete(a.records, old)
	a.mu.Unlock()
	if old != r.ID {
		os.Remove(a.store.path(old))
	}
	if j.ix != nil {
		if err := j.ix.WriteFile(a.store.IndexPath(r.ID)); err != nil {
			a.log.Warn("cannot keep the tar index; peers will not be served", "err", err)
		}
	}
	a.update(r, PhaseExtracted, "", Progress{Done: j.res.TarSize, Total: j.res.TarSize, Unit: "bytes"})
	var pieces *peer.PieceList
	if j.pieces != nil {
		pieces = j.pieces.List(r.Digest)
	}
	a.share(r, pieces)
	a.mu.Lock()
	a.lastBad = nil
	a.mu.Unlock()
	a.log.Info("verified and extracted: the stick can be unplugged", "phase", string(PhaseExtracted),
		"bundle", r.Name, "digest", r.Digest, "approval", j.res.Approval)
	a.next(ctx)
}

func (a *Agent) reject(r *Record, err error) {
	a.mu.Lock()
	if r.ID == "" || strings.HasPrefix(r.ID, "pending-") {
		delete(a.records, r.ID)
		r.ID = "rejected-" + strings.TrimSuffix(r.Name, ".tar")
	}
	a.mu.Unlock()
	reason := strings.TrimPrefix(err.Error(), "bundle "+r.Name+": ")
	a.log.Error("bundle refused", "phase", string(PhaseRejected), "bundle", r.Name, "reason", reason)
	a.save(r, PhaseRejected, reason, Progress{})
	a.mu.Lock()
	a.lastBad = r
	a.mu.Unlock()
}

func (a *Agent) onRequest(ctx context.Context, req request) error {
	switch req.kind {
	case "load":
		a.mu.Lock()
		busy := a.busy
		a.mu.Unlock()
		if busy != "" {
			return fmt.Errorf("busy (%s); try again when it is done", busy)
		}
		return a.startFile(ctx, req.path)
	case "cleanup":
		return a.cleanup(ctx)
	case "proceed":
		return a.proceed(ctx)
	}
	return fmt.Errorf("unknown request %q", req.kind)
}

// cleanup takes the active bundle out of CRI-O and removes its files.
func (a *Agent) cleanup(ctx context.Context) error {
	a.mu.Lock()
	r, busy := a.active, a.busy
	a.mu.Unlock()
	if r == nil {
		return errors.New("no bundle to clean up")
	}
	if busy != "" {
		a.stopJob()
		for a.busyNow() != "" {
			a.onJobDone(ctx, <-a.done)
		}
	}
	if a.deps.Loader != nil && r.Metadata != nil && r.Phase != PhaseDetected {
		if err := a.deps.Loader.Cleanup(ctx, r.Metadata, r.Dir); err != nil {
			return fmt.Errorf("cleanup of %s: %w", r.Name, err)
		}
	}
	if r.Dir != "" {
		if err := os.RemoveAll(r.Dir); err != nil {
			return err
		}
	}
	if a.deps.Peers != nil {
		a.deps.Peers.Unshare(r.Digest)
	}
	os.Remove(a.store.IndexPath(r.ID))
	a.update(r, PhaseCleaned, "", Progress{})
	a.mu.Lock()
	a.active = nil
	a.mu.Unlock()
	a.log.Info("cleaned up", "phase", string(PhaseCleaned), "bundle", r.Name, "digest", r.Digest)
	return nil
}

func (a *Agent) busyNow() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.busy
}

// update moves r to phase and persists it.
func (a *Agent) update(r *Record, p Phase, reason string, prog Progress) {
	a.save(r, p, reason, prog)
}

func (a *Agent) save(r *Record, p Phase, reason string, prog Progress) {
	a.mu.Lock()
	if r.Times == nil {
		r.Times = map[Phase]time.Time{}
	}
	if r.Phase != p || r.Times[p].IsZero() {
		r.Times[p] = a.deps.Now().UTC()
	}
	r.Phase, r.Reason, r.Progress = p, reason, prog
	a.records[r.ID] = r
	cp := r.clone()
	a.mu.Unlock()
	if err := a.store.Save(cp); err != nil {
		a.log.Error("cannot save state", "err", err)
	}
	a.announce()
}

// announce sends the status line to systemd.
func (a *Agent) announce() {
	a.deps.Notify.Status(a.Status().Line)
}

// Request asks the running agent to do something (from the status API).
func (a *Agent) Request(ctx context.Context, kind, path string) error {
	req := request{kind: kind, path: path, reply: make(chan error, 1)}
	select {
	case a.reqs <- req:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-req.reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Alive reports whether the main loop turned recently: the watchdog is
// pinged only then, so systemd restarts an agent that is stuck.
func (a *Agent) Alive() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return time.Since(a.beat) < 30*time.Second
}

// Permanent reports whether err says that retrying cannot fix it (an
// image the bundle lacks, bytes that do not match their digest): such a
// load ends in failed instead of retrying forever. An error opts in by
// having a Permanent() bool method returning true, so the agent needs no
// import of the part that raised it.
func Permanent(err error) bool {
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}
