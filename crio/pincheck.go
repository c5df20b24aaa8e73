package crio

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Pin checks: what CRI-O holds and pins, read once (inventory), then each
// image polled until present and pinned (verify); and CRI-O's own
// pinned_images patterns, to tell which images another drop-in still pins.

// inventory lists CRI-O's images once: the names (tags and digests) of
// those present and pinned.
func (l *Runtime) inventory(ctx context.Context) (map[string]bool, error) {
	for {
		imgs, err := l.CRI.List(ctx)
		if errors.Is(err, ErrUnavailable) {
			if werr := l.waitCRIO(ctx, err); werr != nil {
				return nil, werr
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			l.log().Debug("cannot list CRI-O's images; checking each", "err", err)
			return map[string]bool{}, nil
		}
		l.cameBack()
		have := map[string]bool{}
		for _, img := range imgs {
			if img.Pinned {
				for _, n := range append(img.RepoTags, img.RepoDigests...) {
					have[n] = true
				}
			}
		}
		return have, nil
	}
}

// verify checks that every ref is present and pinned, polling while
// CRI-O applies the pins (asynchronously after a reload).
func (l *Runtime) verify(ctx context.Context, refs []string) error {
	wait := orDefault(l.PinWait, time.Minute)
	deadline := time.Now().Add(wait)
	have, err := l.inventory(ctx)
	if err != nil {
		return err
	}
	var pending []string
	for _, r := range refs {
		if !have[r] {
			pending = append(pending, r)
		}
	}
	if len(pending) == 0 {
		return nil
	}
	repulled := false
	for {
		var absent, unpinned []string
		for _, ref := range pending {
			present, pinned, err := l.CRI.Status(ctx, ref)
			for errors.Is(err, ErrUnavailable) {
				if werr := l.waitCRIO(ctx, err); werr != nil {
					return werr
				}
				present, pinned, err = l.CRI.Status(ctx, ref)
			}
			switch {
			case err != nil:
				return fmt.Errorf("verify %s: %w", ref, err)
			case !present:
				absent = append(absent, ref)
			case !pinned:
				unpinned = append(unpinned, ref)
			}
		}
		l.cameBack()
		if len(absent) > 0 && !repulled {
			// CRI-O restarted after an unclean stop repairs its storage
			// and may drop images: pull those once more.
			repulled = true
			l.log().Warn("images missing from CRI-O after their pull; pulling them again", "images", len(absent))
			if _, err := l.pullAll(ctx, absent, 0, len(absent), nil); err != nil {
				return err
			}
			pending = append(absent, unpinned...)
			continue
		}
		if len(absent) > 0 {
			return fmt.Errorf("%w: %d images missing from CRI-O after pulling them: %s: CRI-O may have removed them (disk pressure?): load again",
				ErrNotLoaded, len(absent), strings.Join(absent, ", "))
		}
		if len(unpinned) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %d images present but not pinned %s after the reload: %s: check %s and the drop-ins after it, and journalctl -u crio for \"Unable to reload configuration\"",
				ErrNotLoaded, len(unpinned), wait, strings.Join(unpinned, ", "), l.Dropins.CRIOConfDir)
		}
		pending = unpinned
		if err := sleep(ctx, l.poll()); err != nil {
			return err
		}
	}
}

// compilePins turns pinned_images patterns into matchers the way CRI-O
// does: "*kw*" contains kw, "prefix*" starts with prefix, anything else is
// exact; all case-insensitive.
func compilePins(patterns []string) []*regexp.Regexp {
	out := make([]*regexp.Regexp, 0, len(patterns))
	for _, p := range patterns {
		switch {
		case len(p) > 1 && strings.HasPrefix(p, "*") && strings.HasSuffix(p, "*"):
			out = append(out, regexp.MustCompile("(?i)"+regexp.QuoteMeta(p[1:len(p)-1])))
		case strings.HasSuffix(p, "*"):
			out = append(out, regexp.MustCompile("(?i)^"+regexp.QuoteMeta(p[:len(p)-1])))
		default:
			out = append(out, regexp.MustCompile("(?i)^"+regexp.QuoteMeta(p)+"$"))
		}
	}
	return out
}

func matchesAny(res []*regexp.Regexp, s string) bool {
	for _, re := range res {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}
