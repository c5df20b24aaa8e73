package peer

import (
	"bytes"
	"fmt"
	"io"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// LiveHasher is the Tee of a stick's extraction pass while the shelf
// offers the bundle cut-through: each piece is served from the stick as
// soon as this pass has read and hashed it, so the peers need not wait for
// the whole read. It computes the piece list as PieceHasher does.
type LiveHasher struct {
	*PieceHasher
	s      *Shelf
	e      *entry
	end    int64 // the bundle's size on the medium
	shared int   // pieces [0, shared) told to the shelf
}

// AddLive offers a bundle the node is still reading (cut-through): r is
// the source medium (the stick's file) and size its length; the offer is
// under digest, the one the node expects (its .sha256), and every piece is
// served only once the returned hasher, written the bundle's bytes in
// order by the pass that verifies them, has hashed it. The fetchers check
// each piece against those hashes and the whole digest at the end, as for
// any bundle. Withdraw it (Remove, or Close on the hasher) when the pass
// fails; replace it (AddHashed) once the bundle is verified and extracted.
// The shelf owns r.
func (s *Shelf) AddLive(digest digest.Digest, meta, sig []byte, r io.ReaderAt, size int64) (*LiveHasher, error) {
	if !sha256digest.Valid(digest) {
		return nil, fmt.Errorf("peer shelf: %q is not a sha256 digest", digest)
	}
	if size <= 0 {
		return nil, fmt.Errorf("peer shelf: bundle %s has size %d", digest, size)
	}
	ps := s.opts.PieceSize
	o := Offer{Digest: digest, Metadata: append([]byte(nil), meta...), Size: size, Signature: bytes.Clone(sig)}
	pl := &PieceList{Digest: digest, Size: size, PieceSize: ps, Pieces: make([]string, NumPieces(size, ps)), Partial: true}
	e := newEntry(stateLive, o, r, pl, func() {})
	s.put(digest, e)
	return &LiveHasher{PieceHasher: NewPieceHasher(ps), s: s, e: e, end: size}, nil
}

// Write hashes b and offers the pieces it completes.
func (l *LiveHasher) Write(b []byte) (int, error) {
	n, _ := l.PieceHasher.Write(b)
	if l.total == l.end && l.filled > 0 {
		l.next() // the short last piece: complete at the medium's end
	}
	for ; l.shared < len(l.sums); l.shared++ {
		l.s.learn(l.e, l.shared, l.sums[l.shared])
	}
	return n, nil
}

// List is the piece list of everything written (see PieceHasher.List).
func (l *LiveHasher) List(digest digest.Digest) *PieceList {
	if l.filled == 0 {
		return &PieceList{Digest: digest, Size: l.total, PieceSize: l.PieceHasher.size, Pieces: l.sums}
	}
	return l.PieceHasher.List(digest)
}

// Close withdraws the live offer if it is still the shelf's entry (not
// replaced by the extracted bundle): the read failed or ended, and the
// stick must not stay open.
func (l *LiveHasher) Close() {
	l.s.removeEntry(l.e)
}

// learn serves piece i of live entry e, whose digest is sum, unless e
// was replaced or withdrawn.
func (s *Shelf) learn(e *entry, i int, sum string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.entries[e.offer.Digest] == e {
		e.learned(i, sum)
	}
}

// removeEntry removes e if it is still digest's entry.
func (s *Shelf) removeEntry(e *entry) {
	s.mu.Lock()
	cur := s.entries[e.offer.Digest] == e
	if cur {
		delete(s.entries, e.offer.Digest)
	}
	s.mu.Unlock()
	if cur {
		e.cancel()
		closeReader(e.r)
	}
}
