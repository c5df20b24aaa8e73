package peer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// fetchPiece streams piece i from peer into the file while hashing it,
// asking for a first copy (FirstCopyHeader) if firstCopy. A
// bad piece leaves garbage in its slot, which is neither marked held nor
// served, and is overwritten by the next attempt.
func (j *job) fetchPiece(ctx context.Context, a assignment, off, n int64, want string) pieceResult {
	peer, i := a.peer, a.piece
	h := sha256.New()
	w := &hashWriter{w: io.NewOffsetWriter(j.file, off), h: h, ctx: ctx, pacer: j.f.opts.Pacer}
	err := j.f.c.copyRange(ctx, peer, j.digest, off, n, w, a.firstCopy)
	if w.err != nil {
		return pieceResult{peer: peer, piece: i, local: true, err: fmt.Errorf("peer fetch %s: write %s: %w (is the disk full?)", j.digest, j.dest, w.err)}
	}
	if err != nil {
		return pieceResult{peer: peer, piece: i, err: err}
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return pieceResult{peer: peer, piece: i, err: fmt.Errorf("%w: piece %d from peer %s: %s, want %s", ErrBadPiece, i, peer, sha256digest.Short(got), sha256digest.Short(want))}
	}
	return pieceResult{peer: peer, piece: i}
}

type hashWriter struct {
	w     io.Writer
	h     io.Writer
	err   error
	ctx   context.Context
	pacer Pacer
}

func (hw *hashWriter) Write(b []byte) (int, error) {
	hw.h.Write(b)
	n, err := hw.w.Write(b)
	if err != nil {
		hw.err = err
		return n, err
	}
	if hw.pacer != nil {
		err = hw.pacer.Pace(hw.ctx, n) // not hw.err: a pause ended by ctx is no disk error
	}
	return n, err
}

// verifyWhole checks dest against the digest, as hashed while it arrived.
// On a mismatch it removes dest and the resume record: some piece list
// lied.
func (j *job) verifyWhole(whole *prefixHash) error {
	got, err := whole.sum()
	if err != nil {
		return fmt.Errorf("peer fetch %s: %s: %w", j.digest, j.dest, err)
	}
	if got != j.digest {
		j.shelf.cancel()
		os.Remove(j.dest)
		os.Remove(StatePath(j.dest))
		return fmt.Errorf("%w: %s: every piece matched the piece list but the whole file hashes to %s; the piece list was wrong (a peer's bundle file is damaged?); the download was discarded and will start over", ErrDigestMismatch, j.digest, got)
	}
	if err := os.Remove(StatePath(j.dest)); err != nil && !errors.Is(err, os.ErrNotExist) {
		j.f.log.Warn("peer fetch: cannot remove resume record", "err", err)
	}
	j.shelf.complete()
	j.f.log.Info("peer fetch: bundle complete", "digest", j.digest, "file", j.dest)
	return nil
}
