package crio

import (
	"context"
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
	d.mu.Lock()
	defer d.mu.Unlock()
	l, err := d.readLedger()
	if err != nil {
		return ch, err
	}
	if l.Mirror != nil {
		l.Mirror = nil
		if err := d.saveLedger(l); err != nil {
			return ch, err
		}
	}
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

// Unpin takes the bundle label's pins out of ferry's drop-in, and drop
// out of the pins of an unknown bundle (EarlierPins); what another bundle
// of ferry's or another drop-in pins stays. When ferry pins nothing more
// the file goes.
func (d *Dropins) Unpin(drop []string, label string) (Change, error) {
	return d.update(func(l *ledger) {
		delete(l.Pins, ledgerKey(label))
		l.Pins[EarlierPins] = slices.DeleteFunc(l.Pins[EarlierPins], func(p string) bool { return slices.Contains(drop, p) })
	}, nil)
}

// Retire removes the mirror and CA of the registry at req.Addr and
// reloads CRI-O; the pins stay.
func (l *Runtime) Retire(ctx context.Context, req Request) error {
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
func (l *Runtime) Unpin(ctx context.Context, req Request) error {
	ch, err := l.Dropins.Unpin(req.Pull, req.Label)
	if err != nil {
		return err
	}
	return l.applyUnpin(ctx, ch, req, "the previous bundle's images unpinned")
}

// stillPinned is what ferry's own drop-in still pins (after Unpin).
func (l *Runtime) stillPinned() []string {
	pins, _ := l.Dropins.PinnedBy()
	return pins
}

func firstOr(s []string, def string) string {
	if len(s) > 0 {
		return s[0]
	}
	return def
}
