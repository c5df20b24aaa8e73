package crio

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ferry-edge/ferry/internal/diskspace"
)

var (
	// ErrNotLoaded means images are missing or unpinned after a load; the
	// error names them.
	ErrNotLoaded = errors.New("images not loaded")
	// ErrNotApplied means CRI-O did not take up the new drop-ins after a
	// reload (it keeps its old configuration when any drop-in is broken).
	ErrNotApplied = errors.New("CRI-O did not apply the new configuration")
)

// DefaultWorkers is the pull concurrency for this node: CRI-O's pulls of
// small images are CPU-bound, so a couple per core keeps it busy without
// queueing behind its own locks.
func DefaultWorkers() int { return max(2, 2*runtime.NumCPU()) }

// Pacer scales the pull concurrency by the node's pressure.
type Pacer interface {
	// Workers is how many of n workers may run now (at least 1).
	Workers(n int) int
}

// pacerPoll is how often a worker held back by the Pacer looks again.
const pacerPoll = 250 * time.Millisecond

// Loader puts a bundle's images into CRI-O, pinned, and takes them out.
type Loader struct {
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
	// Limits are what the kubelet tolerates on the image store (its
	// eviction and image GC thresholds); zero: read from KubeletConfig
	// at each check (the MCO may change it), else the kubelet's defaults.
	Limits        diskspace.Limits
	KubeletConfig string
	// StorageDir is CRI-O's image store, checked by CheckRoom.
	StorageDir string

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

func (l *Loader) log() *slog.Logger {
	if l.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l.Log
}

func (l *Loader) workers() int {
	if l.Workers > 0 {
		return l.Workers
	}
	return DefaultWorkers()
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
func (l *Loader) Load(ctx context.Context, req Request) (Result, error) {
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
func (l *Loader) Unload(ctx context.Context, req Request) error {
	ch, err := l.Dropins.Remove(req.Addr, req.Label)
	if err != nil {
		return err
	}
	l.log().Info("CRI-O drop-ins removed", "bundle_dir", req.Label, "change", ch.String())
	return l.applyUnpin(ctx, ch, req, "bundle images unpinned")
}

// applyUnpin reloads CRI-O after a change that unpins req.Pull and waits
// until they are unpinned (except those still pinned elsewhere).
func (l *Loader) applyUnpin(ctx context.Context, ch Change, req Request, done string) error {
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

// waitUnpinned waits until CRI-O no longer pins refs, except those other
// drop-ins (or keep) still pin.
func (l *Loader) waitUnpinned(ctx context.Context, refs, keep []string) error {
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

func (l *Loader) poll() time.Duration { return orDefault(l.Poll, 50*time.Millisecond) }

// reload reloads CRI-O once it answers on its socket. A CRI-O that is
// stopped or still starting is waited for first: a SIGHUP before CRI-O
// has set up its handler kills it, and one that was starting may have
// read the old files. A reload that fails while CRI-O answers is an error.
func (l *Loader) reload(ctx context.Context, probe string) error {
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
func (l *Loader) applied(ctx context.Context, refs []string) bool {
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
func (l *Loader) waitApplied(ctx context.Context, refs []string) error {
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

// pullAll pulls refs with a bounded pool. One image failing does not stop
// the others; every failure is named in the error. Progress counts from
// offset (images skipped) up to total.
func (l *Loader) pullAll(ctx context.Context, refs []string, offset, total int, progress func(done, total int)) (pulled int, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	jobs := make(chan string)
	var (
		mu     sync.Mutex
		done   = offset
		failed = map[string]error{}
		wg     sync.WaitGroup
	)
	if progress != nil {
		progress(done, total)
	}
	n := min(l.workers(), len(refs))
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				// Held back: worker 0 always runs, the others while
				// the node is quiet enough for them.
				for l.Pacer != nil && i >= l.Pacer.Workers(n) {
					if sleep(ctx, pacerPoll) != nil {
						break
					}
				}
				ref, ok := <-jobs
				if !ok {
					return
				}
				err := l.pullOne(ctx, ref)
				mu.Lock()
				switch {
				case errors.Is(err, errFatal):
					cancel(err)
				case err != nil:
					failed[ref] = err
				default:
					pulled++
				}
				done++
				if progress != nil {
					progress(done, total)
				}
				mu.Unlock()
			}
		}()
	}
feed:
	for _, r := range refs {
		select {
		case jobs <- r:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if cause := context.Cause(ctx); cause != nil {
		return pulled, unfatal(cause)
	}
	if len(failed) > 0 {
		var names, broken []string
		for r, err := range failed {
			names = append(names, r)
			if cannotHeal(err) {
				broken = append(broken, r)
			}
		}
		slices.Sort(names)
		slices.Sort(broken)
		if len(broken) > 0 {
			fix := "the bundle is incomplete or damaged; make it again"
			if first := failed[broken[0]]; strings.Contains(strings.ToLower(first.Error()), "source image rejected") {
				fix = "the node's signature policy (policy.json) refuses it; make the bundle again with the signatures the policy requires"
			}
			return pulled, PermanentError{fmt.Errorf("%w: %d of %d images cannot be pulled from the bundle, and retrying cannot fix it: %s (first error: %v): %s",
				ErrNotLoaded, len(broken), total, strings.Join(broken, ", "), failed[broken[0]], fix)}
		}
		return pulled, fmt.Errorf("%w: %d of %d images could not be pulled through the embedded registry: %s (first error: %v)",
			ErrNotLoaded, len(failed), total, strings.Join(names, ", "), failed[names[0]])
	}
	return pulled, nil
}

// inventory lists CRI-O's images once: the names (tags and digests) of
// those present and pinned.
func (l *Loader) inventory(ctx context.Context) (map[string]bool, error) {
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

// errFatal marks errors that end the whole load (CRI-O gone for too long,
// context ended).
var errFatal = errors.New("fatal")

type fatalError struct{ err error }

func (f fatalError) Error() string        { return f.err.Error() }
func (f fatalError) Is(target error) bool { return target == errFatal }
func (f fatalError) Unwrap() error        { return f.err }

func unfatal(err error) error {
	var f fatalError
	if errors.As(err, &f) {
		return f.err
	}
	return err
}

// pullOne pulls ref, retrying failures with backoff and waiting out an
// unreachable CRI-O.
func (l *Loader) pullOne(ctx context.Context, ref string) error {
	attempts := l.Attempts
	if attempts <= 0 {
		attempts = 4
	}
	backoff := orDefault(l.Backoff, 250*time.Millisecond)
	for attempt := 1; ; {
		if ctx.Err() != nil {
			return fatalError{context.Cause(ctx)}
		}
		_, err := l.CRI.Pull(ctx, ref)
		if err == nil {
			l.cameBack()
			return nil
		}
		if ctx.Err() != nil {
			return fatalError{context.Cause(ctx)}
		}
		if errors.Is(err, ErrUnavailable) {
			if werr := l.waitCRIO(ctx, err); werr != nil {
				return fatalError{werr}
			}
			continue
		}
		l.cameBack()
		if !retryable(err) || attempt >= attempts {
			return err
		}
		wait := min(backoff<<(attempt-1), 8*backoff)
		l.log().Warn("pull failed; retrying", "image", ref, "attempt", attempt, "retry_in", wait, "err", err)
		attempt++
		if err := sleep(ctx, wait); err != nil {
			return fatalError{err}
		}
	}
}

// retryable says whether a pull error may go away by itself.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.Unimplemented, codes.PermissionDenied, codes.Unauthenticated:
		return false
	}
	return !cannotHeal(err)
}

// healless are what CRI-O says when the registry lacks what the bundle
// names, or serves bytes that are not it, or the node's signature policy
// refuses the image ("Source image rejected"): retrying pulls the same.
var healless = []string{"manifest unknown", "blob unknown", "name unknown", "unauthorized", "denied",
	"digest did not match", "does not match", "digest mismatch", "invalid checksum", "source image rejected"}

// cannotHeal says whether a pull error is one retrying cannot fix.
func cannotHeal(err error) bool {
	switch status.Code(err) {
	case codes.PermissionDenied, codes.Unauthenticated:
		return true
	}
	msg := strings.ToLower(err.Error())
	for _, h := range healless {
		if strings.Contains(msg, h) {
			return true
		}
	}
	return false
}

// PermanentError is a load that retrying cannot complete: the bundle lacks
// images, or holds bytes that are not them. Permanent reports true, so the
// agent ends the bundle in failed instead of retrying.
type PermanentError struct{ error }

func (PermanentError) Permanent() bool { return true }
func (e PermanentError) Unwrap() error { return e.error }

// waitCRIO is called when CRI-O did not answer: it waits a little, or
// returns an error once CRI-O has been unreachable longer than CRIOWait.
func (l *Loader) waitCRIO(ctx context.Context, cause error) error {
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

func (l *Loader) cameBack() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.downSince.IsZero() {
		l.log().Info("CRI-O is answering again", "after", time.Since(l.downSince).Round(time.Millisecond))
		l.downSince = time.Time{}
	}
}

// verify checks that every ref is present and pinned, polling while
// CRI-O applies the pins (asynchronously after a reload).
func (l *Loader) verify(ctx context.Context, refs []string) error {
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

// Present tells which of refs CRI-O holds, pinned or not (each by the
// name it was pulled as).
func (l *Loader) Present(ctx context.Context, refs []string) (map[string]bool, error) {
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

// SameFilesystem tells whether dir is on the image store's filesystem (on
// RHCOS, /var/lib/upgrade and /var/lib/containers both are /var).
func (l *Loader) SameFilesystem(dir string) bool {
	var a, b unix.Stat_t
	return l.StorageDir != "" && unix.Stat(l.StorageDir, &a) == nil && unix.Stat(dir, &b) == nil && a.Dev == b.Dev
}

// CheckRoom returns diskspace.ErrNoSpace when writing need bytes (what,
// in words) to CRI-O's image store would cross what the kubelet tolerates
// there (Limits): it would evict pods or delete images. No store yet:
// nothing to check.
func (l *Loader) CheckRoom(need int64, what string) error {
	if _, err := os.Stat(l.StorageDir); l.StorageDir == "" || err != nil {
		return nil
	}
	return diskspace.CheckKubelet(l.StorageDir, need, l.limits(), what, "'crictl rmi --prune' removes the images no container uses")
}

func (l *Loader) limits() diskspace.Limits {
	if l.Limits != (diskspace.Limits{}) {
		return l.Limits
	}
	if l.KubeletConfig == "" {
		return diskspace.DefaultLimits
	}
	lim, err := diskspace.ReadKubeletLimits(l.KubeletConfig)
	if err != nil {
		l.log().Warn("cannot read some of the kubelet's thresholds; using its defaults for those (imagefs.available 15%, image GC at 85%)", "err", err)
	}
	return lim
}
