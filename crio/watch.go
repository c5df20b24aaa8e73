package crio

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// settle is how long WatchConf waits for a burst of changes to end (an
// editor's temporary file and rename, the MCO writing several files)
// before it renders ferry's drop-ins again.
const settle = 250 * time.Millisecond

// WatchConf keeps ferry's drop-ins a true copy of the node's own files:
// whenever a file in crio.conf.d (the MCO's 50-pinned-images first of
// all), registries.conf.d or registries.conf changes, it renders them
// again (Dropins.Sync) and reloads CRI-O if they changed. It syncs once
// at start too: a change made while ferry was stopped. It returns when
// ctx ends; a directory that does not exist yet is looked for again
// every minute.
func (l *Runtime) WatchConf(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	d := l.Dropins
	dirs := []string{filepath.Clean(d.CRIOConfDir), filepath.Clean(d.RegistriesConfDir), filepath.Dir(d.registriesConf())}
	watched := map[string]bool{}
	watch := func() {
		for _, dir := range dirs {
			if !watched[dir] && w.Add(dir) == nil {
				watched[dir] = true
			}
		}
	}
	watch()
	l.Resync(ctx, "ferry started")
	var fire <-chan time.Time
	var why string
	retry := time.NewTicker(time.Minute)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-w.Events:
			if !l.concerns(ev.Name) {
				continue
			}
			if ev.Op&fsnotify.Remove != 0 && slices.Contains(dirs, ev.Name) {
				delete(watched, ev.Name)
			}
			why = filepath.Base(ev.Name) + " changed"
			fire = time.After(settle)
		case err := <-w.Errors:
			l.log().Warn("watching CRI-O's configuration", "err", err)
		case <-retry.C:
			watch()
		case <-fire:
			fire = nil
			l.Resync(ctx, why)
		}
	}
}

// concerns reports whether a change to path may change what ferry's
// drop-ins must hold: another file in crio.conf.d or registries.conf.d,
// or registries.conf; not ferry's own files and temporary files.
func (l *Runtime) concerns(path string) bool {
	d := l.Dropins
	base := filepath.Base(path)
	if base == DropinName || strings.HasPrefix(base, ".") {
		return false
	}
	ours := []string{filepath.Clean(d.CRIOConfDir), filepath.Clean(d.RegistriesConfDir)}
	return slices.Contains(ours, filepath.Dir(path)) || slices.Contains(ours, path) || path == d.registriesConf()
}

// Resync renders ferry's drop-ins again and reloads CRI-O when they
// changed, saying why in the journal. Failures are logged: the next change
// or restart tries again.
func (l *Runtime) Resync(ctx context.Context, why string) {
	ch, err := l.Dropins.Sync()
	log := l.log().With("cause", why)
	if err != nil {
		log.Error("ferry's CRI-O drop-ins could not follow the node's files", "err", err)
		return
	}
	if !ch.NeedsReload() {
		return
	}
	pins, _ := l.Dropins.PinnedBy()
	log.Info("ferry's CRI-O drop-ins follow the node's files; reloading CRI-O", "change", ch.String(), "pins", len(pins))
	if err := l.reload(ctx, firstOr(pins, "ferry.invalid/probe")); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("reloading CRI-O after following the node's files", "err", err)
	}
}
