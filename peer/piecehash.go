package peer

import (
	"crypto/sha256"
	"encoding/hex"
	"hash"

	"github.com/ferry-edge/ferry/internal/digest"
)

// PieceHasher computes a bundle's piece list from its bytes, written to it
// in order: from a Shelf reading the bundle, or from an extraction pass
// that reads it anyway (bundle.Options.Tee).
type PieceHasher struct {
	size   int64 // piece size
	h      hash.Hash
	filled int64 // bytes of the current piece hashed
	total  int64
	sums   []string
}

// NewPieceHasher hashes in pieces of pieceSize bytes.
func NewPieceHasher(pieceSize int64) *PieceHasher {
	return &PieceHasher{size: pieceSize, h: sha256.New()}
}

// Write hashes b; it never fails.
func (p *PieceHasher) Write(b []byte) (int, error) {
	n := len(b)
	p.total += int64(n)
	for len(b) > 0 {
		k := min(int64(len(b)), p.size-p.filled)
		p.h.Write(b[:k])
		p.filled += k
		b = b[k:]
		if p.filled == p.size {
			p.next()
		}
	}
	return n, nil
}

func (p *PieceHasher) next() {
	p.sums = append(p.sums, hex.EncodeToString(p.h.Sum(nil)))
	p.h.Reset()
	p.filled = 0
}

// List is the piece list of everything written, for the bundle digest
// (the last piece may be short). Write no more after it.
func (p *PieceHasher) List(digest digest.Digest) *PieceList {
	if p.filled > 0 {
		p.next()
	}
	return &PieceList{Digest: digest, Size: p.total, PieceSize: p.size, Pieces: p.sums}
}
