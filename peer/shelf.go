package peer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"

	"github.com/ferry-edge/ferry/internal/atomicfile"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// ShelfOptions configure NewShelf.
type ShelfOptions struct {
	// PieceSize of the piece lists this node publishes for whole bundles;
	// 0: DefaultPieceSize.
	PieceSize int64
	// CacheDir, when set, keeps computed piece lists across restarts
	// (<CacheDir>/<hex>.pieces.json) so a 16 GiB bundle is hashed once.
	CacheDir string
	// Log: nil discards.
	Log *slog.Logger
}

// Shelf is the set of bundles a node serves to its peers: whole ones the
// agent Adds (verified, extracted) and ones a Fetcher is receiving, served
// piece by piece as they are verified. It implements Store.
type Shelf struct {
	opts   ShelfOptions
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	entries map[digest.Digest]*entry
}

var _ Store = (*Shelf)(nil)

// NewShelf makes an empty shelf. Close stops its background hashing.
func NewShelf(opts ShelfOptions) *Shelf {
	if opts.PieceSize == 0 {
		opts.PieceSize = DefaultPieceSize
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Shelf{opts: opts, ctx: ctx, cancel: cancel, entries: map[digest.Digest]*entry{}}
}

// Close stops background hashing and closes every reader the shelf holds.
func (s *Shelf) Close() error {
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for d, e := range s.entries {
		closeReader(e.r)
		delete(s.entries, d)
	}
	return nil
}

func closeReader(r io.ReaderAt) {
	if c, ok := r.(io.Closer); ok {
		_ = c.Close()
	}
}

// Add serves a whole, verified bundle: the tar's bytes are r[0:size]. Its
// piece list is computed in the background (or read from CacheDir); until
// then the bundle is listed but its pieces answer "not ready". Hashing also
// checks r against the digest: a reader that does not give the bundle's
// bytes stops being served. Add replaces an entry for the same digest: when
// that is a bundle a Fetcher got, its piece list (the one peers already
// use) stays, served at once, and r is checked against it in the
// background. The shelf owns r from now on and closes it (if it is an
// io.Closer) when the entry is removed or replaced.
func (s *Shelf) Add(digest digest.Digest, meta []byte, r io.ReaderAt, size int64) error {
	return s.add(digest, meta, r, size, nil)
}

// AddHashed is Add for a bundle whose piece list was computed from its
// bytes as they were verified against the digest (a PieceHasher on
// bundle.Options.Tee): it is served at once, kept in the cache for later
// Adds, and r is not read to hash it again. r must give the same bytes (a
// tar regenerated from its Index does); a peer checks every piece it gets,
// so a reader that does not is caught there.
func (s *Shelf) AddHashed(digest digest.Digest, meta []byte, r io.ReaderAt, pl *PieceList) error {
	if pl == nil || pl.Digest != digest || pl.Validate() != nil {
		return fmt.Errorf("peer shelf: no valid piece list for bundle %s", digest)
	}
	return s.add(digest, meta, r, pl.Size, pl)
}

func (s *Shelf) add(digest digest.Digest, meta []byte, r io.ReaderAt, size int64, hashed *PieceList) error {
	if !sha256digest.Valid(digest) {
		return fmt.Errorf("peer shelf: %q is not a sha256 digest", digest)
	}
	if size <= 0 {
		return fmt.Errorf("peer shelf: bundle %s has size %d", digest, size)
	}
	ctx, cancel := context.WithCancel(s.ctx)
	o := Offer{Digest: digest, Metadata: append([]byte(nil), meta...), Size: size, PieceSize: s.opts.PieceSize}
	var known *PieceList
	s.mu.Lock()
	if old := s.entries[digest]; old != nil && (old.state.complete() || old.state == stateListed) && old.pieces != nil && old.offer.Size == size {
		known = old.pieces // fetched and checked whole: peers already use this list
	}
	s.mu.Unlock()
	check := known != nil && hashed == nil // hash r anyway, to check it against that list
	if known == nil {
		known = hashed
	}
	if known == nil {
		known = s.loadCached(digest, size) // checked when cached: no need to hash again
	}
	st := stateHashing
	if known != nil {
		st, o.PieceSize = stateWhole, known.PieceSize
	}
	e := newEntry(st, o, r, known, cancel)
	s.put(digest, e)
	if hashed != nil && known == hashed {
		s.saveCached(hashed)
	}
	if known == nil || check {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.hash(ctx, e, known)
		}()
	}
	return nil
}

// Remove stops serving digest.
func (s *Shelf) Remove(digest digest.Digest) {
	s.mu.Lock()
	e := s.entries[digest]
	delete(s.entries, digest)
	s.mu.Unlock()
	if e != nil {
		e.cancel()
		closeReader(e.r)
	}
}

func (s *Shelf) put(digest digest.Digest, e *entry) {
	s.mu.Lock()
	old := s.entries[digest]
	s.entries[digest] = e
	s.mu.Unlock()
	if old != nil {
		old.cancel()
		if old.r != e.r {
			closeReader(old.r)
		}
	}
}

// WaitPieces blocks until digest's piece list is computed (or ctx ends).
// Tests and the agent's status use it; serving does not need it.
func (s *Shelf) WaitPieces(ctx context.Context, digest digest.Digest) (*PieceList, error) {
	for {
		p, err := s.Pieces(digest)
		if !errors.Is(err, ErrNotReady) {
			return p, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-afterPoll():
		}
	}
}

// hash computes e's piece list from its reader, checking the whole digest;
// with known set, it checks the reader against that list instead.
func (s *Shelf) hash(ctx context.Context, e *entry, known *PieceList) {
	d, size := e.offer.Digest, e.offer.Size
	ps := s.opts.PieceSize
	if known != nil {
		ps = known.PieceSize
	}
	ph := NewPieceHasher(ps)
	whole := sha256.New()
	buf := make([]byte, min(ps, 1<<20))
	var err error
	for off := int64(0); off < size; {
		if ctx.Err() != nil {
			return
		}
		n, rerr := e.r.ReadAt(buf[:min(int64(len(buf)), size-off)], off)
		ph.Write(buf[:n])
		whole.Write(buf[:n])
		off += int64(n)
		if rerr != nil && off < size {
			err = fmt.Errorf("read bundle %s at %d: %w", d, off, rerr)
			break
		}
	}
	p := ph.List(d)
	if err == nil && known != nil && !slices.Equal(known.Pieces, p.Pieces) {
		err = fmt.Errorf("%w: the bundle's bytes as served differ from those fetched (same digest): not serving it (a bug in regenerating the tar?)", ErrDigestMismatch)
	}
	if err == nil {
		if got := digest.FromSHA256(whole.Sum(nil)); got != d {
			err = fmt.Errorf("%w: the bundle's bytes as served hash to %s, not %s: not serving it (a bug in regenerating the tar, or the extracted tree changed)", ErrDigestMismatch, got, d)
		}
	}
	s.mu.Lock()
	if s.entries[d] == e {
		if err != nil {
			e.move(stateBroken)
		} else {
			e.hashed(p) // known: it has that list already
		}
	}
	s.mu.Unlock()
	if err != nil {
		s.opts.Log.Error("peer: cannot serve bundle", "digest", d, "err", err)
		return
	}
	if known != nil {
		s.saveCached(known)
		return
	}
	s.opts.Log.Info("peer: piece list ready", "digest", d, "pieces", p.N())
	s.saveCached(p)
}

func (s *Shelf) cachePath(digest digest.Digest) string {
	return filepath.Join(s.opts.CacheDir, hexOf(digest)+".pieces.json")
}

func (s *Shelf) loadCached(digest digest.Digest, size int64) *PieceList {
	if s.opts.CacheDir == "" {
		return nil
	}
	b, err := os.ReadFile(s.cachePath(digest))
	if err != nil {
		return nil
	}
	p, err := ParsePieceList(b, digest, size)
	if err != nil || p.PieceSize != s.opts.PieceSize {
		return nil
	}
	return p
}

func (s *Shelf) saveCached(p *PieceList) {
	if s.opts.CacheDir == "" {
		return
	}
	b, _ := json.Marshal(p)
	err := os.MkdirAll(s.opts.CacheDir, 0o700) // the first time, on a fresh state dir
	if err == nil {
		err = atomicfile.WriteFile(s.cachePath(p.Digest), b, 0o600)
	}
	if err != nil {
		s.opts.Log.Warn("peer: cannot cache piece list; it will be computed again after a restart", "digest", p.Digest, "err", err)
	}
}

// SetSignature offers sig (a .minisig) with the bundle's metadata.
func (s *Shelf) SetSignature(digest digest.Digest, sig []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entries[digest]; e != nil {
		e.offer.Signature = bytes.Clone(sig)
	}
}

// Offers lists every bundle served, sorted by digest.
func (s *Shelf) Offers() []Offer {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Offer, 0, len(s.entries))
	for _, e := range s.entries {
		if e.state != stateBroken {
			out = append(out, e.offer)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Digest < out[j].Digest })
	return out
}

func (s *Shelf) get(digest digest.Digest) (*entry, error) {
	e := s.entries[digest]
	if e == nil || e.state == stateBroken {
		return nil, fmt.Errorf("%w: %s", ErrUnknownBundle, digest)
	}
	return e, nil
}

// Open implements Store.
func (s *Shelf) Open(digest digest.Digest) (io.ReaderAt, int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.get(digest)
	if err != nil {
		return nil, 0, err
	}
	return e.r, e.offer.Size, nil
}

// Pieces implements Store.
func (s *Shelf) Pieces(digest digest.Digest) (*PieceList, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.get(digest)
	if err != nil {
		return nil, err
	}
	if e.pieces == nil {
		return nil, fmt.Errorf("%w: %s is still being hashed", ErrNotReady, digest)
	}
	return e.pieces, nil
}

// Have implements Store.
func (s *Shelf) Have(digest digest.Digest) (Have, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, err := s.get(digest)
	if err != nil {
		return Have{}, err
	}
	if e.pieces == nil {
		return Have{}, fmt.Errorf("%w: %s is still being hashed", ErrNotReady, digest)
	}
	if e.offer.Complete {
		return FullHave(e.pieces.N()), nil
	}
	h := e.have.Clone()
	h.Live = e.state == stateLive
	return h, nil
}
