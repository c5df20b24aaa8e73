package crio

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// After a bundle's upgrade is done its images stay pinned until the next
// upgrade is done (the running release must not be garbage-collected),
// while its mirror and registry go. These are the two halves of Unload.

// RemoveMirror deletes ferry's registries.conf.d drop-in and the CA for
// addr; the pins stay.
func (d *Dropins) RemoveMirror(addr string) (Change, error) {
	var ch Change
	var err error
	if ch.Mirrors, err = removeIfExists(filepath.Join(d.RegistriesConfDir, DropinName)); err != nil {
		return ch, err
	}
	if ch.Attachments, err = d.removeAttachments(); err != nil {
		return ch, err
	}
	if addr != "" {
		if ch.CA, err = removeIfExists(filepath.Join(d.CertsDir, addr, "ca.crt")); err != nil {
			return ch, err
		}
		os.Remove(filepath.Join(d.CertsDir, addr)) // only if empty
	}
	return ch, nil
}

// Unpin rewrites ferry's pins without the references drop (pins of the
// drop-ins before ferry's stay, since ferry's list must hold them); when
// nothing of ferry's own is left the file goes.
func (d *Dropins) Unpin(drop []string, label string) (Change, error) {
	var ch Change
	path := filepath.Join(d.CRIOConfDir, DropinName)
	pins, _, err := readPins(path)
	if errors.Is(err, os.ErrNotExist) {
		return ch, nil
	}
	if err != nil {
		return ch, err
	}
	before, err := d.PinsBefore()
	if err != nil {
		return ch, err
	}
	var kept []string
	own := false
	for _, p := range pins {
		switch {
		case slices.Contains(before, p):
			kept = append(kept, p)
		case !slices.Contains(drop, p):
			kept, own = append(kept, p), true
		}
	}
	if !own {
		ch.Pins, err = removeIfExists(path)
		return ch, err
	}
	conf, err := PinsConf(kept, label)
	if err != nil {
		return ch, err
	}
	if ch.Pins, err = writeIfChanged(path, conf, 0o644); err != nil {
		return ch, fmt.Errorf("%w: crio.conf.d: %v", ErrDropin, err)
	}
	return ch, nil
}

// Retire removes the mirror and CA of the registry at req.Addr and
// reloads CRI-O; the pins stay.
func (l *Loader) Retire(ctx context.Context, req Request) error {
	ch, err := l.Dropins.RemoveMirror(req.Addr)
	if err != nil {
		return err
	}
	l.log().Info("CRI-O mirror removed; pins kept until the next upgrade", "bundle_dir", req.Label, "change", ch.String())
	if !ch.NeedsReload() {
		return nil
	}
	return l.reload(ctx, firstOr(req.Pull, "ferry.invalid/probe"))
}

// Unpin takes req.Pull out of ferry's pins, reloads CRI-O and waits
// until they are no longer pinned (except those still pinned elsewhere).
func (l *Loader) Unpin(ctx context.Context, req Request) error {
	ch, err := l.Dropins.Unpin(req.Pull, req.Label)
	if err != nil {
		return err
	}
	return l.applyUnpin(ctx, ch, req, "the previous bundle's images unpinned")
}

// stillPinned is what ferry's own drop-in still pins (after Unpin).
func (l *Loader) stillPinned() []string {
	pins, _ := l.Dropins.PinnedBy()
	return pins
}

func firstOr(s []string, def string) string {
	if len(s) > 0 {
		return s[0]
	}
	return def
}
