package agent

import (
	"cmp"
	"context"
	"errors"
	"github.com/ferry-edge/ferry/agent/machine"
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
		a.log.Warn(machine.ApprovalOffWarning + ": remove approval = \"off\" from the config and set approved_digests or trusted_keys")
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
	a.turn(jctx, machine.EvStart{Records: recs})

	var devices <-chan machine.DeviceEvent
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
		var ev machine.Event
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-devices:
			if !ok {
				return errors.New("device events stopped")
			}
			ev = machine.EvDevice{DeviceEvent: d}
		case ev = <-a.events:
		case p := <-a.progress:
			ev = p
		case v := <-views:
			ev = machine.EvView{View: v}
		case <-retry:
			a.retry = nil
			ev = machine.EvRetry{}
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
func (a *Agent) watchers(ctx context.Context) <-chan machine.View {
	views := make(chan machine.View)
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
func (a *Agent) turn(ctx context.Context, ev machine.Event) {
	effs := a.m.Step(ev)
	a.publish()
	for _, e := range effs {
		a.perform(ctx, e)
	}
	a.announce()
}

// perform carries out one effect on the loop goroutine; anything long is
// started in the background and reports back with an event.
func (a *Agent) perform(ctx context.Context, e machine.Effect) {
	switch e := e.(type) {
	case machine.EffSave:
		if err := a.store.Save(e.Rec.Clone()); err != nil {
			a.log.Error("cannot save state", "bundle", e.Rec.Name, "err", err)
		}
	case machine.EffForget:
		if err := a.store.Delete(e.ID); err != nil {
			a.log.Warn("cannot remove an expired record", "record", e.ID, "err", err)
		}
	case machine.EffProbe:
		a.background(ctx, func(ctx context.Context) machine.Event { return a.probe(ctx, e) })
	case machine.EffStartJob:
		// The job gets copies, made here on the loop: the loop goes on
		// changing the records (progress) while the job runs.
		e.Rec = e.Rec.Clone()
		if e.Previous != nil {
			e.Previous = e.Previous.Clone()
		}
		jctx, cancel := context.WithCancel(ctx)
		a.jobStop = cancel
		a.background(jctx, func(ctx context.Context) machine.Event {
			defer cancel()
			return a.runJob(ctx, e)
		})
	case machine.EffStopJob:
		if a.jobStop != nil {
			a.jobStop()
		}
	case machine.EffCloseMedium:
		if m := a.handles.takeMedium(e.M); m == nil {
			a.log.Warn("no open medium to close", "medium", e.M)
		} else if err := m.Close(); err != nil {
			a.log.Warn("unmounting the stick", "err", err)
		}
	case machine.EffShare:
		a.share(e.Rec, a.handles.takePieces(e.Rec.ID))
	case machine.EffUnshare:
		if a.deps.Peers != nil {
			a.deps.Peers.Unshare(e.Digest)
		}
	case machine.EffRemove:
		if err := os.RemoveAll(e.Path); err != nil {
			a.log.Warn("cannot remove", "path", e.Path, "err", err)
		}
	case machine.EffResumeLoader:
		// In the background: CRI-O may still be starting.
		meta, images, name, dir, keep := e.Rec.Metadata, e.Rec.Images(), e.Rec.Name, e.Rec.Dir, e.Keep
		a.bg.Add(1)
		go func() {
			defer a.bg.Done()
			if err := a.deps.Loader.Resume(ctx, meta, images, dir, keep); err != nil && ctx.Err() == nil {
				a.log.Error("cannot serve the loaded bundle again", "bundle", name, "err", err)
			}
		}()
	case machine.EffRunHook:
		r := e.Rec.Clone()
		a.background(ctx, func(ctx context.Context) machine.Event { return a.runHook(ctx, r) })
	case machine.EffAskUpgrade:
		a.askUpgrade(ctx, e.Rec.Clone())
	case machine.EffRetryIn:
		if a.retry != nil {
			a.retry.Stop()
		}
		a.retry = time.NewTimer(e.After)
	case machine.EffAnnounce:
		a.say(e.Rep.Text().Line)
	case machine.EffReply:
		if ch := a.handles.takeReply(e.Ch); ch != nil {
			ch <- e.Err
		}
	default:
		panic("agent: unknown effect")
	}
}

// background runs fn in its own goroutine and posts its event to the loop
// (unless the loop itself has ended: a cancelled job still reports).
func (a *Agent) background(ctx context.Context, fn func(context.Context) machine.Event) {
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
func (a *Agent) removeStaging(recs []*machine.Record) {
	ents, err := os.ReadDir(a.cfg.Paths.ExtractDir)
	if err != nil {
		return
	}
	resumes := map[string]bool{}
	for _, r := range recs {
		if r.Phase == machine.PhaseFetching && r.Dir != "" && !a.cfg.Peer.Serial {
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
	line = machine.SanitizeText(line, machine.MaxLine) // one line: a newline would add a field
	if line != a.lastLine {
		a.lastLine = line
		a.deps.Notify.Status(line)
	}
}
