package bundle

import (
	"crypto/sha256"
	"hash"
)

// blobHasher hashes a blob's chunks on its own goroutine: hashing every
// blob for the tree check then runs beside the parse and the writes (and
// the whole tar's hash, on yet another), not after them on one core.
type blobHasher struct {
	work chan []byte // a blob's chunks, in order; nil ends the blob
	free chan []byte // buffers to read into
	sums chan []byte
	h    hash.Hash
}

// blobBuffers bounds the chunks in flight (their memory: 4 MiB).
const blobBuffers = 4

func newBlobHasher() *blobHasher {
	b := &blobHasher{work: make(chan []byte, blobBuffers), free: make(chan []byte, blobBuffers), sums: make(chan []byte), h: sha256.New()}
	for range blobBuffers {
		b.free <- make([]byte, chunkSize)
	}
	go b.loop()
	return b
}

func (b *blobHasher) loop() {
	for c := range b.work {
		if c == nil {
			b.sums <- b.h.Sum(nil)
			b.h.Reset()
			continue
		}
		b.h.Write(c)
		b.free <- c[:cap(c)]
	}
}

// buffer is a free buffer to read the next chunk into.
func (b *blobHasher) buffer() []byte { return <-b.free }

// add hands a chunk over: the caller must not touch it again.
func (b *blobHasher) add(c []byte) { b.work <- c }

// sum ends the blob and returns its sha256.
func (b *blobHasher) sum() []byte {
	b.work <- nil
	return <-b.sums
}

// close stops the goroutine; chunks in flight are still hashed.
func (b *blobHasher) close() { close(b.work) }
