package peer

import (
	"io"

	"github.com/ferry-edge/ferry/internal/digest"
)

// Node is one node's side of the peer network: the shelf it serves from
// and the fetcher it gets bundles with (the agent's Peers).
type Node struct {
	*Shelf
	*Fetcher
}

// Share serves a verified bundle's tar bytes, with its signature (nil for
// none); pieces, when not nil, is its piece list as hashed in the
// extraction pass (served at once, no second read of the bundle).
func (n Node) Share(digest digest.Digest, meta, sig []byte, r io.ReaderAt, size int64, pieces *PieceList) error {
	var err error
	if pieces != nil {
		err = n.Shelf.AddHashed(digest, meta, r, pieces)
	} else {
		err = n.Shelf.Add(digest, meta, r, size)
	}
	if err == nil {
		n.Shelf.SetSignature(digest, sig)
	}
	return err
}

// ShareLive offers a bundle while the node still reads it (AddLive).
func (n Node) ShareLive(digest digest.Digest, meta, sig []byte, r io.ReaderAt, size int64) (*LiveHasher, error) {
	return n.Shelf.AddLive(digest, meta, sig, r, size)
}

// Unshare stops serving a bundle.
func (n Node) Unshare(digest digest.Digest) { n.Shelf.Remove(digest) }
