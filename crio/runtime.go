package crio

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

var (
	// ErrNotLoaded means images are missing or unpinned after a load; the
	// error names them.
	ErrNotLoaded = errors.New("images not loaded")
	// ErrNotApplied means CRI-O did not take up the new drop-ins after a
	// reload (it keeps its old configuration when any drop-in is broken).
	ErrNotApplied = errors.New("CRI-O did not apply the new configuration")
)

// Runtime is CRI-O as a bundle's load needs it: it puts the images of a
// Request into CRI-O, pinned, and takes them out (load.Runtime). The
// work is split by job: applying the drop-ins and reloading (apply.go),
// the pull pool (pullpool.go) and the pin checks (pincheck.go).
type Runtime struct {
	CRI      ImageService
	Dropins  *Dropins
	Reloader Reloader
	Log      *slog.Logger

	// Workers bounds concurrent pulls; 0 is DefaultWorkers().
	Workers int
	// Pacer, when set, lowers the pulls in flight while the node's other
	// work stalls (internal/pacing): worker i waits while i >=
	// Pacer.Workers(Workers).
	Pacer Pacer
	// Attempts is how many times one image is pulled before the load
	// fails on it; 0 is 4. Waiting for an unreachable CRI-O is not an
	// attempt.
	Attempts int
	// Backoff is the wait before the first retry, doubled each time up to
	// 8×; 0 is 250ms.
	Backoff time.Duration
	// CRIOWait is how long CRI-O may stay unreachable (stopped,
	// restarting) before the load gives up; 0 is 5 minutes.
	CRIOWait time.Duration
	// PinWait is how long CRI-O may take to apply a reload; 0 is 1 minute.
	PinWait time.Duration
	// Poll is the interval of status polls; 0 is 50ms.
	Poll time.Duration

	mu        sync.Mutex
	downSince time.Time
}

// Request is one set of images to load or unload, and the registry that
// serves them.
type Request struct {
	// Pull are the references to pull and pin, each name@sha256:… or
	// name:tag, in the order to pull them.
	Pull []string
	// Mirrors maps each repository of Pull to its path on the registry
	// at Addr (needed by Load only).
	Mirrors map[string]string
	// Keep are more pins to hold (e.g. a previous bundle's, until its
	// cleanup).
	Keep []string
	// Addr is the embedded registry, "127.0.0.1:<port>"; CACert its
	// certificate (PEM), installed as certs.d's ca.crt for Addr.
	Addr   string
	CACert []byte
	// Label names the bundle in drop-ins and messages ("4.13.7-x86_64").
	Label string
	// Progress, if set, is called with the references done so far
	// (pulled, or found present and pinned) and the total.
	Progress func(done, total int)
}

// Result tells what a load did.
type Result struct {
	Total, Pulled, Skipped int
	Change                 Change
	Reloaded               bool
	Elapsed                time.Duration
}

func (l *Runtime) log() *slog.Logger {
	if l.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l.Log
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Load writes the drop-ins, reloads CRI-O if they changed, pulls every
// reference of req.Pull through the mirror (skipping those already present
// and pinned) and checks that all are present and pinned.
func (l *Runtime) Load(ctx context.Context, req Request) (Result, error) {
	start := time.Now()
	res := Result{}
	refs := req.Pull
	res.Total = len(refs)
	ch, err := l.Dropins.Apply(req)
	res.Change = ch
	if err != nil {
		return res, err
	}
	log := l.log().With("bundle_dir", req.Label)
	log.Info("CRI-O drop-ins written", "change", ch.String(), "images", len(refs))
	reload := ch.NeedsReload()
	if !reload && !l.applied(ctx, refs) {
		// Files in place but not in effect: an earlier run stopped
		// between writing them and reloading.
		log.Info("CRI-O drop-ins unchanged but not in effect; reloading")
		reload = true
	}
	var reloadTook time.Duration
	if reload {
		reloadStart := time.Now()
		if err := l.reload(ctx, refs[0]); err != nil {
			return res, err
		}
		res.Reloaded = true
		if err := l.waitApplied(ctx, refs); err != nil {
			return res, err
		}
		reloadTook = time.Since(reloadStart)
	}
	// One List instead of a status call per image: present and pinned
	// images are skipped.
	have, err := l.inventory(ctx)
	if err != nil {
		return res, err
	}
	var todo []string
	for _, r := range refs {
		if !have[r] {
			todo = append(todo, r)
		}
	}
	res.Skipped = len(refs) - len(todo)
	pullStart := time.Now()
	pulled, err := l.pullAll(ctx, todo, res.Skipped, len(refs), req.Progress)
	res.Pulled = pulled
	if err != nil {
		return res, err
	}
	pullsTook, checkStart := time.Since(pullStart), time.Now()
	if err := l.verify(ctx, refs); err != nil {
		return res, err
	}
	res.Elapsed = time.Since(start)
	log.Info("bundle images loaded and pinned", "images", len(refs), "pulled", pulled, "skipped", res.Skipped, "elapsed", res.Elapsed.Round(time.Millisecond),
		"reload", reloadTook.Round(time.Millisecond), "pulls", pullsTook.Round(time.Millisecond), "pin_check", time.Since(checkStart).Round(time.Millisecond))
	return res, nil
}

// Unload removes the pins of the bundle req.Label, its mirror and the CA
// for req.Addr, reloads CRI-O and waits until the bundle's images are no
// longer pinned, except those other drop-ins or other bundles of ferry's
// (the running release's) still pin. The images themselves stay, for the
// kubelet's garbage collection to remove when unused.
func (l *Runtime) Unload(ctx context.Context, req Request) error {
	ch, err := l.Dropins.Remove(req.Addr, req.Label)
	if err != nil {
		return err
	}
	l.log().Info("CRI-O drop-ins removed", "bundle_dir", req.Label, "change", ch.String())
	return l.applyUnpin(ctx, ch, req, "bundle images unpinned")
}

// applyUnpin reloads CRI-O after a change that unpins req.Pull and waits
// until they are unpinned (except those still pinned elsewhere).
func (l *Runtime) applyUnpin(ctx context.Context, ch Change, req Request, done string) error {
	refs := req.Pull
	if !ch.NeedsReload() || len(refs) == 0 {
		return nil
	}
	if err := l.reload(ctx, refs[0]); err != nil {
		return err
	}
	if err := l.waitUnpinned(ctx, refs, req.Keep); err != nil {
		return err
	}
	l.log().Info(done, "bundle_dir", req.Label, "images", len(refs))
	return nil
}

func (l *Runtime) poll() time.Duration { return orDefault(l.Poll, 50*time.Millisecond) }

// Present tells which of refs CRI-O holds, pinned or not (each by the
// name it was pulled as).
func (l *Runtime) Present(ctx context.Context, refs []string) (map[string]bool, error) {
	imgs, err := l.CRI.List(ctx)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, img := range imgs {
		for _, n := range append(img.RepoTags, img.RepoDigests...) {
			have[n] = true
		}
	}
	out := make(map[string]bool, len(refs))
	for _, r := range refs {
		out[r] = have[r]
	}
	return out, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
