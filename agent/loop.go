package agent

import (
	"cmp"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/bundle"
)

// Run watches for bundles until ctx ends. It is the only goroutine that
// changes the agent's state.
func (a *Agent) Run(ctx context.Context) error {
	if a.cfg.ApprovalOff() {
		a.log.Warn(approvalOffWarning + ": remove approval = \"off\" from the config and set approved_digests or trusted_keys")
	}
	recs, err := a.store.Load()
	if err != nil {
		return err
	}
	a.removeStaging(recs)
	jctx, stopAll := context.WithCancel(ctx)
	a.life = jctx
	defer func() {
		// Jobs, probes and hooks end with the loop: nothing of theirs
		// outlives Run.
		stopAll()
		a.bg.Wait()
	}()
	a.turn(jctx, evStart{records: recs})

	var devices <-chan DeviceEvent
	if a.deps.Devices != nil {
		if devices, err = a.deps.Devices.Events(ctx); err != nil {
			return errors.New("watching devices: " + err.Error())
		}
	}
	views := a.watchers(jctx)
	a.deps.Notify.Ready()
	a.announce()
	tick := time.NewTicker(tickEvery)
	defer tick.Stop()
	for {
		a.beat.Store(time.Now().UnixNano())
		var retry <-chan time.Time
		if a.retry != nil {
			retry = a.retry.C
		}
		var ev event
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-devices:
			if !ok {
				return errors.New("device events stopped")
			}
			ev = evDevice{d}
		case ev = <-a.events:
		case p := <-a.progress:
			ev = p
		case v := <-views:
			ev = evView{v}
		case <-retry:
			a.retry = nil
			ev = evRetry{}
		case <-tick.C:
			if a.pacingChanged() || a.pullChanged() {
				a.publish()
				a.announce()
			}
			continue
		}
		a.turn(jctx, ev)
	}
}

// tickEvery is how often the loop turns with nothing to do: the watchdog's
// heartbeat, and the status line's "holding back" kept current.
const tickEvery = 2 * time.Second

// watchers starts what watches the outside for the loop: the peers' view
// (sent on the returned channel), and with an API the Node's annotations,
// the cluster's upgrade and, when the config names none, the peer list.
func (a *Agent) watchers(ctx context.Context) <-chan view {
	views := make(chan view)
	goBG := func(f func()) {
		a.bg.Add(1)
		go func() { defer a.bg.Done(); f() }()
	}
	if a.deps.Peers != nil {
		goBG(func() { a.pollPeers(ctx, cmp.Or(a.deps.PeerPoll, 2*time.Second), views) })
	}
	if a.deps.Loader != nil && a.cfg.Retention.KeepRunningRelease {
		goBG(func() { a.watchRuntime(ctx, runtimePoll, time.Duration(a.cfg.Retention.CheckMinutes)*time.Minute) })
	}
	if a.deps.API != nil {
		goBG(func() { a.annotate(ctx, 5*time.Second) })
		goBG(func() { a.followUpgrade(ctx) })
		goBG(func() { a.followBundle(ctx, a.deps.API) })
		if a.deps.Peers != nil && len(a.cfg.Peer.Peers) == 0 {
			goBG(func() { a.findPeers(ctx, 30*time.Second) })
		}
	}
	return views
}

// turn is one step: the state changes, the snapshot is published, then
// the effects are performed in order.
func (a *Agent) turn(ctx context.Context, ev event) {
	effs := a.m.step(ev)
	a.publish()
	for _, e := range effs {
		a.perform(ctx, e)
	}
	a.announce()
}

// perform carries out one effect on the loop goroutine; anything long is
// started in the background and reports back with an event.
func (a *Agent) perform(ctx context.Context, e effect) {
	switch e := e.(type) {
	case effSave:
		if err := a.store.Save(e.rec.clone()); err != nil {
			a.log.Error("cannot save state", "bundle", e.rec.Name, "err", err)
		}
	case effForget:
		if err := a.store.Delete(e.id); err != nil {
			a.log.Warn("cannot remove an expired record", "record", e.id, "err", err)
		}
	case effProbe:
		a.background(ctx, func(ctx context.Context) event { return a.probe(ctx, e) })
	case effStartJob:
		// The job gets copies, made here on the loop: the loop goes on
		// changing the records (progress) while the job runs.
		e.rec = e.rec.clone()
		if e.previous != nil {
			e.previous = e.previous.clone()
		}
		jctx, cancel := context.WithCancel(ctx)
		a.jobStop = cancel
		a.background(jctx, func(ctx context.Context) event {
			defer cancel()
			return a.runJob(ctx, e)
		})
	case effStopJob:
		if a.jobStop != nil {
			a.jobStop()
		}
	case effCloseMedium:
		if m := a.handles.takeMedium(e.m); m == nil {
			a.log.Warn("no open medium to close", "medium", e.m)
		} else if err := m.Close(); err != nil {
			a.log.Warn("unmounting the stick", "err", err)
		}
	case effShare:
		a.share(e.rec, e.pieces)
	case effUnshare:
		if a.deps.Peers != nil {
			a.deps.Peers.Unshare(e.digest)
		}
	case effRemove:
		if err := os.RemoveAll(e.path); err != nil {
			a.log.Warn("cannot remove", "path", e.path, "err", err)
		}
	case effResumeLoader:
		// In the background: CRI-O may still be starting.
		meta, images, name, dir, keep := e.rec.Metadata, e.rec.Images(), e.rec.Name, e.rec.Dir, e.keep
		a.bg.Add(1)
		go func() {
			defer a.bg.Done()
			if err := a.deps.Loader.Resume(ctx, meta, images, dir, keep); err != nil && ctx.Err() == nil {
				a.log.Error("cannot serve the loaded bundle again", "bundle", name, "err", err)
			}
		}()
	case effRunHook:
		r := e.rec.clone()
		a.background(ctx, func(ctx context.Context) event { return a.runHook(ctx, r) })
	case effAskUpgrade:
		a.askUpgrade(ctx, e.rec.clone())
	case effRetryIn:
		if a.retry != nil {
			a.retry.Stop()
		}
		a.retry = time.NewTimer(e.after)
	case effAnnounce:
		a.say(e.rep.text().Line)
	case effReply:
		if ch := a.handles.takeReply(e.ch); ch != nil {
			ch <- e.err
		}
	default:
		panic("agent: unknown effect")
	}
}

// background runs fn in its own goroutine and posts its event to the loop
// (unless the loop itself has ended: a cancelled job still reports).
func (a *Agent) background(ctx context.Context, fn func(context.Context) event) {
	a.bg.Add(1)
	go func() {
		defer a.bg.Done()
		ev := fn(ctx)
		select {
		case a.events <- ev:
		case <-a.life.Done():
		}
	}()
}

// removeStaging drops staging dirs left by a crash: they are never taken
// as good. A bundle being fetched keeps its own: its fetch extracts as it
// goes and resumes there (every byte read back is checked again).
func (a *Agent) removeStaging(recs []*Record) {
	ents, err := os.ReadDir(a.cfg.Paths.ExtractDir)
	if err != nil {
		return
	}
	resumes := map[string]bool{}
	for _, r := range recs {
		if r.Phase == PhaseFetching && r.Dir != "" && !a.cfg.Peer.Serial {
			resumes[filepath.Base(bundle.StagingDir(r.Dir))] = true
		}
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".staging-") && !resumes[e.Name()] {
			a.log.Info("removing an interrupted extraction", "dir", e.Name())
			os.RemoveAll(filepath.Join(a.cfg.Paths.ExtractDir, e.Name()))
		}
	}
}

// announce sends the current status line to systemd when it changed.
func (a *Agent) announce() { a.say(a.snap.Load().status.Line) }

func (a *Agent) say(line string) {
	line = sanitizeText(line, maxLine) // one line: a newline would add a field
	if line != a.lastLine {
		a.lastLine = line
		a.deps.Notify.Status(line)
	}
}
