package create

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// A blob fetch that survives a poor link: a response cut in the middle is
// resumed where it stopped with a Range request, so each byte crosses the
// link once; only a source that makes no progress for several tries in a
// row fails the blob. The store verifies the whole blob against its digest
// when it commits it, as before.

// blobRetries is how many opens in a row may fail, or end with no byte
// read, before a blob's fetch gives up; the wait between them doubles from
// blobBackoff up to 16 s.
const (
	blobRetries = 6
	blobBackoff = 500 * time.Millisecond
)

// blobFetcher opens registry blobs at an offset, with one authenticated
// transport per repository (its bearer token is fetched once).
type blobFetcher struct {
	keychain authn.Keychain
	base     http.RoundTripper
	ua       string

	mu  sync.Mutex
	rts map[string]http.RoundTripper // by repository
}

func (f *blobFetcher) transport(ctx context.Context, repo name.Repository) (http.RoundTripper, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if rt, ok := f.rts[repo.String()]; ok {
		return rt, nil
	}
	auth, err := authn.Resolve(ctx, f.keychain, repo)
	if err != nil {
		return nil, err
	}
	rt, err := transport.NewWithContext(ctx, repo.Registry, auth, transport.NewUserAgent(f.base, f.ua), []string{repo.Scope(transport.PullScope)})
	if err != nil {
		return nil, err
	}
	if f.rts == nil {
		f.rts = map[string]http.RoundTripper{}
	}
	f.rts[repo.String()] = rt
	return rt, nil
}

// openAt opens blob desc of repo from byte off on. A registry that
// ignores the Range header sends the whole blob: its first off bytes are
// skipped.
func (f *blobFetcher) openAt(ctx context.Context, repo name.Repository, desc ocispec.Descriptor, off int64) (io.ReadCloser, error) {
	rt, err := f.transport(ctx, repo)
	if err != nil {
		return nil, err
	}
	u := fmt.Sprintf("%s://%s/v2/%s/blobs/%s", repo.Registry.Scheme(), repo.RegistryStr(), repo.RepositoryStr(), desc.Digest)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if off > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", off))
	}
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		return nil, err
	}
	switch {
	case off > 0 && resp.StatusCode == http.StatusPartialContent:
		return resp.Body, nil
	case resp.StatusCode == http.StatusOK:
		if off > 0 {
			if _, err := io.CopyN(io.Discard, resp.Body, off); err != nil {
				resp.Body.Close()
				return nil, err
			}
		}
		return resp.Body, nil
	}
	defer resp.Body.Close()
	return nil, transport.CheckError(resp, http.StatusOK, http.StatusPartialContent)
}

// resumingBlob reads a blob to its size, opening it again where it
// stopped when a response ends early or fails.
type resumingBlob struct {
	ctx   context.Context
	open  func(off int64) (io.ReadCloser, error)
	size  int64
	pace  func(ctx context.Context, n int) error // nil: no rate limit
	onCut func(off int64, err error)

	rc    io.ReadCloser
	got   int64 // bytes the open response gave
	off   int64
	fails int
}

func (b *resumingBlob) Read(p []byte) (int, error) {
	if b.off >= b.size && b.size > 0 {
		return 0, io.EOF
	}
	for {
		if b.rc == nil {
			rc, err := b.open(b.off)
			if err != nil {
				if permanent(err) {
					return 0, err
				}
				if werr := b.retry(err); werr != nil {
					return 0, werr
				}
				continue
			}
			b.rc, b.got = rc, 0
		}
		n, err := b.rc.Read(p)
		if n > 0 {
			b.off += int64(n)
			b.got += int64(n)
			b.fails = 0
			if b.pace != nil {
				if perr := b.pace(b.ctx, n); perr != nil {
					return n, perr
				}
			}
		}
		switch {
		case err == nil:
			return n, nil
		case errors.Is(err, io.EOF) && (b.size <= 0 || b.off >= b.size):
			return n, io.EOF
		}
		// Cut short (a dropped connection, a proxy's reset): resume here,
		// at once if this response gave bytes, else after a wait.
		b.rc.Close()
		b.rc = nil
		if b.onCut != nil {
			b.onCut(b.off, err)
		}
		if n > 0 {
			return n, nil
		}
		if b.got > 0 {
			continue
		}
		if werr := b.retry(err); werr != nil {
			return 0, werr
		}
	}
}

// permanent reports whether a registry's answer cannot change by asking
// again: a 4xx other than 408 and 429 (no such blob, no access).
func permanent(err error) bool {
	var te *transport.Error
	if !errors.As(err, &te) {
		return false
	}
	return te.StatusCode >= 400 && te.StatusCode < 500 && te.StatusCode != http.StatusRequestTimeout && te.StatusCode != http.StatusTooManyRequests
}

// retry waits before the next open, or gives up after blobRetries tries
// with no byte read.
func (b *resumingBlob) retry(err error) error {
	b.fails++
	if b.fails > blobRetries {
		return fmt.Errorf("no progress after %d tries (at byte %d of %d): %w", blobRetries, b.off, b.size, err)
	}
	wait := min(blobBackoff<<(b.fails-1), 16*time.Second)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-b.ctx.Done():
		return b.ctx.Err()
	case <-t.C:
		return nil
	}
}

func (b *resumingBlob) Close() error {
	if b.rc != nil {
		return b.rc.Close()
	}
	return nil
}

// rateLimiter keeps the bytes fetched by every blob together at or below
// a rate: each read reserves its time on one shared clock.
type rateLimiter struct {
	perSecond int64

	mu   sync.Mutex
	next time.Time
}

// wait holds the caller until n more bytes fit the rate.
func (l *rateLimiter) wait(ctx context.Context, n int) error {
	if l == nil || l.perSecond <= 0 {
		return nil
	}
	l.mu.Lock()
	now := time.Now()
	if l.next.Before(now) {
		l.next = now
	}
	at := l.next
	l.next = l.next.Add(time.Duration(int64(n) * int64(time.Second) / l.perSecond))
	l.mu.Unlock()
	d := time.Until(at)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
