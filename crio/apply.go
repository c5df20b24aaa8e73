package crio

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Applying the drop-ins: CRI-O reloaded once it answers, and waited for
// until its live configuration pins what the drop-ins pin (or no longer
// pins what they dropped); CRI-O that stops answering is waited for, up
// to CRIOWait.

// reload reloads CRI-O once it answers on its socket. A CRI-O that is
// stopped or still starting is waited for first: a SIGHUP before CRI-O
// has set up its handler kills it, and one that was starting may have
// read the old files. A reload that fails while CRI-O answers is an error.
func (l *Runtime) reload(ctx context.Context, probe string) error {
	for {
		_, _, serr := l.CRI.Status(ctx, probe)
		if serr == nil || !errors.Is(serr, ErrUnavailable) {
			err := l.Reloader.Reload(ctx)
			if err == nil {
				l.cameBack()
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if !errors.Is(err, ErrNotRunning) {
				return fmt.Errorf("reload CRI-O after writing its drop-ins: %w", err)
			}
			serr = fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		if werr := l.waitCRIO(ctx, serr); werr != nil {
			return fmt.Errorf("reload CRI-O: %w", werr)
		}
	}
}

// applied says whether CRI-O's live configuration pins refs already. An
// image service that cannot tell is taken to have applied them.
func (l *Runtime) applied(ctx context.Context, refs []string) bool {
	pl, ok := l.CRI.(PinLister)
	if !ok {
		return true
	}
	live, err := pl.PinnedImages(ctx)
	if err != nil {
		return true // verify will tell
	}
	for _, r := range refs {
		if !slices.Contains(live, r) {
			return false
		}
	}
	return true
}

// waitApplied waits until CRI-O's live configuration pins refs, when the
// image service can tell (PinLister); otherwise verify's poll covers it.
func (l *Runtime) waitApplied(ctx context.Context, refs []string) error {
	pl, ok := l.CRI.(PinLister)
	if !ok {
		return nil
	}
	wait := orDefault(l.PinWait, time.Minute)
	deadline := time.Now().Add(wait)
	var missing string
	for {
		live, err := pl.PinnedImages(ctx)
		switch {
		case errors.Is(err, ErrUnavailable):
			if werr := l.waitCRIO(ctx, err); werr != nil {
				return werr
			}
			continue
		case err != nil:
			l.log().Debug("cannot read CRI-O's live config; checking pins through image status instead", "err", err)
			return nil
		}
		l.cameBack()
		missing = ""
		for _, r := range refs {
			if !slices.Contains(live, r) {
				missing = r
				break
			}
		}
		if missing == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s: after the reload, CRI-O's pinned_images still lacks %s (%s later): look for \"Unable to reload configuration\" in journalctl -u crio, and check the other files in %s",
				ErrNotApplied, DropinName, missing, wait, l.Dropins.CRIOConfDir)
		}
		if err := sleep(ctx, l.poll()); err != nil {
			return err
		}
	}
}

// waitUnpinned waits until CRI-O no longer pins refs, except those other
// drop-ins (or keep) still pin.
func (l *Runtime) waitUnpinned(ctx context.Context, refs, keep []string) error {
	others, err := l.Dropins.PinsBefore()
	if err != nil {
		return err
	}
	held := compilePins(append(append(others, keep...), l.stillPinned()...))
	deadline := time.Now().Add(orDefault(l.PinWait, time.Minute))
	for _, ref := range refs {
		if matchesAny(held, ref) {
			continue
		}
		for {
			present, pinned, err := l.CRI.Status(ctx, ref)
			if err == nil && (!present || !pinned) {
				break
			}
			if err != nil {
				if werr := l.waitCRIO(ctx, err); werr != nil {
					return werr
				}
				continue
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%w: %s still pinned %s after removing its pin and reloading: look for \"Unable to reload configuration\" in journalctl -u crio",
					ErrNotApplied, ref, orDefault(l.PinWait, time.Minute))
			}
			if err := sleep(ctx, l.poll()); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitCRIO is called when CRI-O did not answer: it waits a little, or
// returns an error once CRI-O has been unreachable longer than CRIOWait.
func (l *Runtime) waitCRIO(ctx context.Context, cause error) error {
	limit := orDefault(l.CRIOWait, 5*time.Minute)
	l.mu.Lock()
	if l.downSince.IsZero() {
		l.downSince = time.Now()
		l.log().Warn(fmt.Sprintf("CRI-O is not answering; waiting up to %s for it to come back", limit), "err", cause)
	}
	since := time.Since(l.downSince)
	l.mu.Unlock()
	if since > limit {
		return fmt.Errorf("%w for %s: start it (systemctl start crio) and ferry resumes the load: %v", ErrUnavailable, since.Round(time.Second), cause)
	}
	return sleep(ctx, 5*l.poll())
}

func (l *Runtime) cameBack() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.downSince.IsZero() {
		l.log().Info("CRI-O is answering again", "after", time.Since(l.downSince).Round(time.Millisecond))
		l.downSince = time.Time{}
	}
}
