package peer

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"sync"

	"github.com/ferry-edge/ferry/internal/digest"
)

// prefixHash computes a file's whole sha256 while a fetch fills it: it
// hashes the pieces held from the file's start on as they arrive, so the
// check at the end reads only the pieces that came last instead of the
// whole file again.
type prefixHash struct {
	f      io.ReaderAt
	pl     *PieceList
	cancel context.CancelFunc
	wake   chan struct{} // 1-buffered
	exited chan struct{}

	mu     sync.Mutex
	held   int           // pieces [0, held) are held
	digest digest.Digest // "sha256:…" once every piece is hashed
	err    error
}

func startPrefixHash(ctx context.Context, f io.ReaderAt, pl *PieceList) *prefixHash {
	ctx, cancel := context.WithCancel(ctx)
	p := &prefixHash{f: f, pl: pl, cancel: cancel, wake: make(chan struct{}, 1), exited: make(chan struct{})}
	go p.run(ctx)
	return p
}

// advance tells it pieces [0, held) are held.
func (p *prefixHash) advance(held int) {
	p.mu.Lock()
	p.held = max(p.held, held)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *prefixHash) run(ctx context.Context) {
	defer close(p.exited)
	h := sha256.New()
	buf := make([]byte, 1<<20)
	next := 0
	for {
		p.mu.Lock()
		upto := p.held
		p.mu.Unlock()
		for ; next < upto; next++ {
			off, n := p.pl.Bounds(next)
			if _, err := io.CopyBuffer(h, io.NewSectionReader(p.f, off, n), buf); err != nil {
				p.finish("", fmt.Errorf("read back piece %d: %w", next, err))
				return
			}
			if ctx.Err() != nil {
				return
			}
		}
		if next == p.pl.N() {
			p.finish(digest.FromSHA256(h.Sum(nil)), nil)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
	}
}

func (p *prefixHash) finish(digest digest.Digest, err error) {
	p.mu.Lock()
	p.digest, p.err = digest, err
	p.mu.Unlock()
}

// sum waits until every piece is hashed (advance(N) must have been
// called) and returns the digest.
func (p *prefixHash) sum() (digest.Digest, error) {
	<-p.exited
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.digest == "" && p.err == nil {
		return "", fmt.Errorf("hashing stopped before the last piece")
	}
	return p.digest, p.err
}

// stop ends the hashing and waits until the file is no longer read.
func (p *prefixHash) stop() {
	p.cancel()
	<-p.exited
}
