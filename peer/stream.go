package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// StreamWindow is how far ahead of the extraction a streaming fetch asks
// for pieces: max(128 MiB, 5% of the bundle), in bytes. The pieces ahead
// become the tree as they are extracted, so on one filesystem the disk
// holds the tree plus at most the quarter kept behind (StreamKeptBehind):
// 1 GiB → 1.03×, 16 GiB → 1.013×; the state dir alone needs the window.
// Wide because the fetchers move in step: every piece in it must leave
// the source once and then hop between them, and a narrow window (64 MiB,
// half kept behind) left them waiting on those hops: 8 nodes, 1 GiB,
// 50 MB/s links took 49.6 s, with this one 34.3 s.
func StreamWindow(size int64) int64 { return max(128<<20, size/20) }

// StreamKeptBehind is how much of the window a fetcher keeps of what it
// has extracted, for the other fetchers a little behind it: a quarter.
func StreamKeptBehind(window int64) int64 { return window / 4 }

// ErrWithdrawn: the bundle stopped being offered by every peer while its
// piece list was still growing: its source's read failed or its digest
// did not match. Nothing fetched is kept.
var ErrWithdrawn = errors.New("the source withdrew the bundle before it was whole")

// StreamResume is where a streaming fetch's extraction had got to: the
// tar's bytes [0, Offset) are in its staging tree, and Data (the
// consumer's own) says how to read them back.
type StreamResume struct {
	Offset int64  `json:"offset"`
	Data   []byte `json:"data"`
}

// StreamConsumer is the extraction a streaming fetch feeds. r gives the
// tar's bytes in order from from.Offset (from nil: from the start; else
// the consumer reads [0, from.Offset) back from what it kept), up to
// io.EOF; it calls checkpoint whenever it has kept the bytes up to an
// offset, so that a fetch interrupted later resumes from there. It must
// check the bundle's whole digest: FetchStream checks every piece only.
type StreamConsumer func(r io.Reader, from *StreamResume, checkpoint Checkpoint) error

// Checkpoint tells a streaming fetch that its consumer has kept the
// bytes up to offset; data, called later from another goroutine when the
// resume record is written (about once a second, so a checkpoint can be
// cheap and frequent), gives StreamResume.Data for it: it must read
// nothing that changes after the call.
type Checkpoint func(offset int64, data func() []byte)

// FetchStream gets bundle digest from the peers as Fetch does, but feeds
// its bytes, in order, to consume (the extraction) as they arrive instead
// of keeping the whole tar: pieces are written to the sparse file dest at
// their offsets, and the bytes consume has read are freed (hole-punched),
// so dest never holds more than window bytes (StreamWindow); pieces past
// the window are not asked for. consume runs on its own goroutine and has
// returned when FetchStream does, which returns the piece list once
// consume returned nil and every piece matched. A refusal by consume is
// returned as is, and the next call starts over; any other failure keeps
// the resume record (StatePath(dest)): the held pieces and consume's last
// checkpoint, from which the next call resumes. Pieces in the window are
// re-served through the Shelf; at the end its entry serves nothing but
// keeps the list, for the caller's Add of the extracted bundle.
func (f *Fetcher) FetchStream(ctx context.Context, digest digest.Digest, dest string, window int64, progress func(Progress), consume StreamConsumer) (*PieceList, error) {
	if !sha256digest.Valid(digest) {
		return nil, fmt.Errorf("peer fetch: %q is not a sha256 digest", digest)
	}
	st := &stream{window: window, consume: consume, log: f.log}
	j := &job{f: f, digest: digest, dest: dest, progress: progress, peers: map[string]*peerState{}, stream: st}
	for _, p := range f.Peers() {
		j.peers[p] = &peerState{addr: p}
	}
	if rec, err := j.loadState(); err != nil || rec.Stream == nil {
		// Nothing extracted to resume from: the pieces alone are of no
		// use, their bytes before the window are gone.
		if err := removeAll(dest, StatePath(dest)); err != nil {
			return nil, fmt.Errorf("peer fetch %s: %w", digest, err)
		}
	}
	if err := j.prepare(ctx); err != nil {
		return nil, err
	}
	st.shelf = j.shelf
	st.start()
	err := newScheduler(ctx, j, st).run()
	st.stop()
	switch {
	case j.shelf == nil:
		j.file.Close()
	case err != nil:
		j.shelf.cancel() // closes j.file
	default:
		j.shelf.fetched(j.pl)
	}
	if err == nil || st.failed || errors.Is(err, ErrWithdrawn) {
		removeAll(dest, StatePath(dest)) // done, refused, or not to be kept
	}
	if err != nil {
		return nil, err
	}
	return j.pl, nil
}

func removeAll(paths ...string) error {
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// stream feeds a fetch's in-order prefix to an extraction and frees what
// the extraction has read.
type stream struct {
	window  int64
	consume StreamConsumer
	shelf   *receiving // the fetch's shelf entry; nil: none
	log     interface{ Warn(string, ...any) }
	from    *StreamResume // the resume record's, or nil

	f      *os.File
	pl     *PieceList    // its size and piece size only
	wake   chan struct{} // 1-buffered: pieces freed, or consume returned
	exited chan struct{}
	err    error // consume's, once exited is closed
	failed bool  // the fetch ended because consume failed (seen by ended)

	mu      sync.Mutex
	cond    *sync.Cond
	avail   int64 // bytes [0, avail) are held
	stopped bool
	off     int64         // bytes [0, off) were read by consume
	cp      *StreamResume // consume's last checkpoint
	cpData  func() []byte // its data, not encoded yet
	freed   atomic.Int64  // pieces [0, freed) are freed
	noPunch bool
}

// start runs consume over the prefix of the file prepare opened, from
// where the resume record says its extraction had got to.
func (s *stream) start() {
	s.cond = sync.NewCond(&s.mu)
	s.wake, s.exited = make(chan struct{}, 1), make(chan struct{})
	if s.from != nil {
		s.off, s.cp = s.from.Offset, s.from
		s.freed.Store(s.from.Offset / s.pl.PieceSize)
		for i := range int(s.freed.Load()) {
			s.shelf.drop(i) // held as extracted, not as bytes
		}
	}
	go func() {
		err := s.consume(s, s.from, s.checkpoint)
		if err == nil {
			_, err = io.Copy(io.Discard, s) // to the end, whatever consume left
		}
		s.err = err
		close(s.exited)
		s.signal()
	}()
}

func (s *stream) checkpoint(offset int64, data func() []byte) {
	s.mu.Lock()
	s.cp = &StreamResume{Offset: offset}
	s.cpData = data
	s.mu.Unlock()
}

// record is what the resume record keeps of a fetch: the checkpoint and
// the pieces before it (extracted: read back from the tree). Not the
// pieces in the file: the extraction may free them before the next
// record, and a restart would take the holes for them.
func (s *stream) record(mine Have) (Have, *StreamResume) {
	s.mu.Lock()
	cp, data := s.cp, s.cpData
	s.cpData = nil // encoded once
	s.mu.Unlock()
	if data != nil {
		cp.Data = data()
	}
	h := NewHave(mine.Pieces)
	if cp != nil {
		for i := range int(cp.Offset / s.pl.PieceSize) {
			h.Set(i)
		}
	}
	return h, cp
}

// limit (a consumer's, as are advance, moved, ended and complete) is the
// first piece past the window: pieces from there on are
// not asked for yet.
func (s *stream) limit() int {
	return min(int(s.freed.Load())+s.pieces(), s.pl.N())
}

// pieces is the window in pieces: at most this many are in the file.
func (s *stream) pieces() int {
	return max(int(s.window/s.pl.PieceSize), 2)
}

// advance tells it pieces [0, front) are held: consume may read them.
func (s *stream) advance(front int) {
	avail := min(int64(front)*s.pl.PieceSize, s.pl.Size)
	s.mu.Lock()
	s.avail = max(s.avail, avail)
	s.mu.Unlock()
	s.cond.Broadcast()
}

func (s *stream) moved() <-chan struct{} { return s.wake }

// ended reports whether consume has returned, having read every byte
// (nil) or refused the bundle (its error, which ends the fetch: failed).
func (s *stream) ended() (bool, error) {
	select {
	case <-s.exited:
		s.failed = s.err != nil
		return true, s.err
	default:
		return false, nil
	}
}

// complete has nothing left to check: the extraction checked the whole
// digest.
func (s *stream) complete() error { return nil }

// signal wakes the scheduler (moved) without waiting.
func (s *stream) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// stop makes consume's reads fail and waits for it to return.
func (s *stream) stop() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	s.cond.Broadcast()
	<-s.exited
}

var errStreamStopped = errors.New("the fetch stopped")

// Read gives consume the held prefix, waiting for the next piece.
func (s *stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	for s.off >= s.avail && s.off < s.pl.Size && !s.stopped {
		s.cond.Wait()
	}
	off, n := s.off, min(int64(len(p)), s.avail-s.off)
	stopped := s.stopped
	s.mu.Unlock()
	switch {
	case off >= s.pl.Size:
		return 0, io.EOF
	case stopped:
		return 0, errStreamStopped
	}
	m, err := s.f.ReadAt(p[:n], off)
	s.mu.Lock()
	s.off += int64(m)
	s.mu.Unlock()
	s.free(off + int64(m))
	if err == io.EOF && int64(m) == n {
		err = nil
	}
	return m, err
}

// free punches out the pieces consume has read past (upto: bytes read),
// after marking them freed so that no one serves them any more, except
// the last StreamKeptBehind of the window: the other fetchers, about as
// far along, still take those from here rather than from the source.
func (s *stream) free(upto int64) {
	k := (upto - StreamKeptBehind(s.window)) / s.pl.PieceSize
	from := s.freed.Load()
	if k <= from {
		return
	}
	s.freed.Store(k)
	for i := int(from); i < int(k); i++ {
		s.shelf.drop(i)
	}
	off, _ := s.pl.Bounds(int(from))
	end := min(k*s.pl.PieceSize, s.pl.Size)
	if !s.noPunch {
		if err := unix.Fallocate(int(s.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, end-off); err != nil {
			s.noPunch = true
			s.log.Warn("peer fetch: cannot free the extracted part of the download; it will take the bundle's size on disk", "file", s.f.Name(), "err", err)
		}
	}
	s.signal()
}

// reader is what the shelf serves from: the file, but no piece freed
// before or during the read (a read that raced a punch would give
// zeros for a verified piece).
func (s *stream) reader() io.ReaderAt { return freedGuard{s} }

type freedGuard struct{ s *stream }

var errFreed = errors.New("piece already extracted and freed here")

func (g freedGuard) ReadAt(p []byte, off int64) (int, error) {
	s := g.s
	first := func() int64 { return s.freed.Load() * s.pl.PieceSize }
	if off < first() {
		return 0, errFreed
	}
	n, err := s.f.ReadAt(p, off)
	if off < first() {
		return 0, errFreed
	}
	return n, err
}

func (g freedGuard) Close() error { return g.s.f.Close() }
