package crio

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

func (l *Runtime) workers() int {
	if l.Workers > 0 {
		return l.Workers
	}
	return DefaultWorkers()
}

// pullAll pulls refs with a bounded pool. One image failing does not stop
// the others; every failure is named in the error. Progress counts from
// offset (images skipped) up to total.
func (l *Runtime) pullAll(ctx context.Context, refs []string, offset, total int, progress func(done, total int)) (pulled int, err error) {
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
			if errors.Is(failed[broken[0]], ErrImageRejected) {
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
func (l *Runtime) pullOne(ctx context.Context, ref string) error {
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
	case codes.InvalidArgument, codes.Unimplemented:
		return false
	}
	return !cannotHeal(err)
}

// cannotHeal says whether a pull error is one retrying cannot fix: the
// registry lacks what the bundle names or refuses it, serves bytes that
// are not it, or the node's signature policy rejects the image (the
// Client tells these apart, ErrImageMissing and the others); pulling
// again pulls the same.
func cannotHeal(err error) bool {
	switch status.Code(err) {
	case codes.NotFound, codes.PermissionDenied, codes.Unauthenticated:
		return true
	}
	return errors.Is(err, ErrImageMissing) || errors.Is(err, ErrImageDenied) ||
		errors.Is(err, ErrImageDamaged) || errors.Is(err, ErrImageRejected)
}

// PermanentError is a load that retrying cannot complete: the bundle lacks
// images, or holds bytes that are not them. Permanent reports true, so the
// agent ends the bundle in failed instead of retrying.
type PermanentError struct{ error }

func (PermanentError) Permanent() bool { return true }
func (e PermanentError) Unwrap() error { return e.error }
