package peer

import "context"

// consumer is what a fetch's held prefix feeds: the whole file's hash
// (Fetch) or an extraction (FetchStream). The scheduler knows the two
// only through these methods.
type consumer interface {
	// limit is the first piece not to ask for yet: the end of its window.
	limit() int
	// advance tells it pieces [0, front) are held.
	advance(front int)
	// moved fires when its window moved on or it ended (nil: never).
	moved() <-chan struct{}
	// ended reports whether it has taken every piece, or its refusal,
	// which ends the fetch.
	ended() (bool, error)
	// complete is its last check, once every piece is held and nothing
	// is in flight any more.
	complete() error
}

var (
	_ consumer = (*wholeFile)(nil)
	_ consumer = (*stream)(nil)
)

// wholeFile keeps the whole tar in the fetched file (Fetch) and hashes
// its prefix as it arrives, so that the check at the end reads only the
// pieces that came last.
type wholeFile struct {
	j     *job
	hash  *prefixHash
	front int
}

// startWholeFile starts hashing the file j fills, until stop or ctx ends.
func startWholeFile(ctx context.Context, j *job) *wholeFile {
	return &wholeFile{j: j, hash: startPrefixHash(ctx, j.file, j.pl)}
}

func (w *wholeFile) limit() int { return w.j.pl.N() }

func (w *wholeFile) advance(front int) {
	w.front = front
	w.hash.advance(front)
}

func (w *wholeFile) moved() <-chan struct{} { return nil }

func (w *wholeFile) ended() (bool, error) { return w.front == w.j.pl.N(), nil }

func (w *wholeFile) complete() error { return w.j.verifyWhole(w.hash) }

// stop ends the hashing and waits until the file is no longer read.
func (w *wholeFile) stop() { w.hash.stop() }
