package bundle

import (
	"context"
	"crypto/sha256"
	"encoding"
	"errors"
	"hash"
	"io"
	"sync"

	"aead.dev/minisign"

	"github.com/ferry-edge/ferry/internal/digest"
)

const (
	chunkSize    = 1 << 20
	chunkBuffers = 6
)

// hashingReader feeds a tar parser from src in large chunks and hashes, in
// its own goroutine, exactly the bytes the parser consumed: hashing runs on
// one core while parsing and writing run on another, and a raw device's
// bytes after the end-of-archive marker never reach the digest.
type hashingReader struct {
	ctx context.Context
	src io.Reader

	cur      []byte // current chunk
	pos      int    // consumed part of cur
	srcErr   error  // sticky error of src, returned once cur is drained
	consumed int64

	full chan []byte // consumed chunks to hash
	free chan []byte // buffers to read into
	done chan struct{}
	sum  hash.Hash
	// tee, when set, also receives the consumed bytes in order, beside
	// the digest and so on another core (Options.Tee).
	tee  io.Writer
	sig  *minisign.Reader // also fed when a signature is checked
	feed *sliceReader

	// rec, when non-nil, receives a copy of every consumed byte (headers
	// and padding, for the tar index).
	rec *[]byte

	progress func(int64)
	once     sync.Once
}

func newHashingReader(ctx context.Context, src io.Reader, withSig bool, progress func(int64)) *hashingReader {
	r := &hashingReader{
		ctx:      ctx,
		src:      src,
		full:     make(chan []byte, chunkBuffers),
		free:     make(chan []byte, chunkBuffers),
		done:     make(chan struct{}),
		sum:      sha256.New(),
		progress: progress,
	}
	for range chunkBuffers {
		r.free <- make([]byte, chunkSize)
	}
	if withSig {
		r.feed = &sliceReader{}
		r.sig = minisign.NewReader(r.feed)
	}
	go r.hashLoop()
	return r
}

func (r *hashingReader) hashLoop() {
	defer close(r.done)
	var scratch []byte
	if r.sig != nil {
		scratch = make([]byte, chunkSize)
	}
	for b := range r.full {
		var wg sync.WaitGroup
		if r.tee != nil {
			wg.Go(func() { r.tee.Write(b) })
		}
		r.sum.Write(b)
		if r.sig != nil {
			r.feed.b = b
			for {
				if _, err := r.sig.Read(scratch); err != nil {
					break
				}
			}
		}
		wg.Wait()
		r.free <- b[:cap(b)]
	}
}

func (r *hashingReader) Read(p []byte) (int, error) {
	if r.pos == len(r.cur) {
		if err := r.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(p, r.cur[r.pos:])
	if r.rec != nil {
		*r.rec = append(*r.rec, r.cur[r.pos:r.pos+n]...)
	}
	r.pos += n
	r.consumed += int64(n)
	return n, nil
}

// fill hands the drained chunk to the hasher and reads the next one.
func (r *hashingReader) fill() error {
	if r.srcErr != nil {
		return r.srcErr
	}
	if err := r.ctx.Err(); err != nil {
		return err
	}
	if r.cur != nil {
		r.full <- r.cur
		r.cur = nil
	}
	var buf []byte
	select {
	case buf = <-r.free:
	case <-r.ctx.Done():
		return r.ctx.Err()
	}
	n, err := io.ReadFull(r.src, buf)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = io.EOF // a short last chunk: serve it, then EOF
	}
	r.cur, r.pos = buf[:n], 0
	if err != nil {
		r.srcErr = err
		if n == 0 {
			return err
		}
	}
	if r.progress != nil {
		r.progress(r.consumed + int64(n))
	}
	return nil
}

// maxPadding bounds the zeros accepted after the end-of-archive marker
// (GNU tar pads to its record size, 10 KiB by default).
const maxPadding = 1 << 20

// consumeZeroPadding consumes (so hashes, tees and records) what follows
// the end-of-archive marker, which may only be zeros, at most maxPadding
// of them. ok is false when anything else follows.
func (r *hashingReader) consumeZeroPadding() (n int64, ok bool, err error) {
	buf := make([]byte, 32<<10)
	for {
		k, err := r.Read(buf)
		for _, b := range buf[:k] {
			if b != 0 {
				return n, false, nil
			}
		}
		n += int64(k)
		if n > maxPadding {
			return n, false, nil
		}
		if err == io.EOF {
			return n, true, nil
		}
		if err != nil {
			return n, false, err
		}
	}
}

// trailing reports whether src holds any byte after what was consumed.
func (r *hashingReader) trailing() (bool, error) {
	if r.pos < len(r.cur) {
		return true, nil
	}
	if r.srcErr != nil {
		if r.srcErr == io.EOF {
			return false, nil
		}
		return false, r.srcErr
	}
	var one [1]byte
	n, err := r.src.Read(one[:])
	if n > 0 {
		return true, nil
	}
	if err == io.EOF || err == nil {
		return false, nil
	}
	return false, err
}

// finish hashes the consumed part of the last chunk and returns the digest
// ("sha256:<hex>") and whether sig verifies against one of keys.
func (r *hashingReader) finish() digest.Digest {
	r.close(true)
	return digest.FromSHA256(r.sum.Sum(nil))
}

// finishPeek is finish for a raw device, and also returns up to n bytes
// that follow what was consumed, read but not hashed: a seed-shaped
// bundle's GNU record padding, which is the file's but cannot be told
// from a zeroed device until the digest says which it is.
func (r *hashingReader) finishPeek(n int) (digest.Digest, []byte, error) {
	tail := append([]byte(nil), r.cur[r.pos:min(len(r.cur), r.pos+n)]...)
	srcErr := r.srcErr
	d := r.finish()
	if len(tail) < n && srcErr == nil {
		more := make([]byte, n-len(tail))
		k, err := io.ReadFull(r.src, more)
		tail = append(tail, more[:k]...)
		if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
			return d, tail, err
		}
	}
	return d, tail, nil
}

// digestWith is the digest of what was hashed followed by more.
func (r *hashingReader) digestWith(more []byte) digest.Digest {
	state, err := r.sum.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return ""
	}
	h := sha256.New()
	if h.(encoding.BinaryUnmarshaler).UnmarshalBinary(state) != nil {
		return ""
	}
	h.Write(more)
	return digest.FromSHA256(h.Sum(nil))
}

// close stops the hasher; with flush, the consumed tail is hashed first.
func (r *hashingReader) close(flush bool) {
	r.once.Do(func() {
		if flush && r.cur != nil {
			r.full <- r.cur[:r.pos]
		}
		r.cur = nil
		close(r.full)
		<-r.done
	})
}

func (r *hashingReader) verifySig(keys []minisign.PublicKey, sig []byte) bool {
	for _, k := range keys {
		if r.sig.Verify(k, sig) {
			return true
		}
	}
	return false
}

// sliceReader serves one slice, then io.EOF until given another.
type sliceReader struct{ b []byte }

func (s *sliceReader) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}
