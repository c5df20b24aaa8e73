// Package peer distributes verified bundles between a cluster's nodes over
// HTTP: a read-only server for the bundles a node holds (whole or in part),
// a fetcher that gets a bundle in fixed-size pieces from several peers at
// once, verifying each piece and the whole digest, and the cluster view the
// gate decides on.
//
// The wire protocol, all under /v1, all GET, all read-only:
//
//	/v1/bundles                      []Offer (JSON)
//	/v1/bundles/<digest>/metadata    metadata.json bytes
//	/v1/bundles/<digest>/pieces      PieceList (JSON); 503 + Retry-After while the source still hashes
//	/v1/bundles/<digest>/have        Have (JSON): bitmaps of verified pieces and of pieces being fetched
//	/v1/bundles/<digest>/tar         the tar; one byte range per request (Range: bytes=a-b);
//	                                 409 for a piece asked as a first copy (FirstCopyHeader) that is already sent
//	/v1/status                       Status (JSON) of this node
//	/v2/…, /v1/pull/…                the registry pull under way, for the nodes following it
//	                                 (ServerOptions.Pull; pull/serve.go)
//	/metrics                         the agent's Prometheus metrics (ServerOptions.Metrics); with
//	                                 node identities also for the cluster's monitoring (MonitoringUser), which reads nothing else
//	/v1/ferry                        BuildOffer (JSON): the ferry build this node runs (ServerOptions.Build)
//	/v1/ferry/<sha256>               that build's bytes, for ferry-install --peers
//
// With a token configured every request needs "Authorization: Bearer <token>".
package peer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
	"github.com/ferry-edge/ferry/peer/wire"
)

// DefaultPieceSize is the piece size a source publishes unless told
// otherwise: small enough that a 1 GiB bundle has 256 pieces to spread
// between fetchers, large enough that a 16 GiB bundle's piece list stays
// near 270 KiB and a piece request costs little next to its transfer.
const DefaultPieceSize = 4 << 20

// Piece size bounds a piece list may declare.
const (
	MinPieceSize = 64 << 10
	MaxPieceSize = 256 << 20
	// maxPieces bounds a piece list (16 TiB at 8 MiB): a parser never
	// allocates more than this many entries.
	maxPieces = 1 << 21
)

// Sentinel errors, found with errors.Is.
var (
	// ErrUnknownBundle: no peer (or this store) holds that digest.
	ErrUnknownBundle = errors.New("bundle not held")
	// ErrNotReady: the source is still computing the piece list.
	ErrNotReady = errors.New("piece list not ready yet")
	// ErrBadPieceList: a piece list that does not parse or does not fit
	// the bundle.
	ErrBadPieceList = errors.New("bad piece list")
	// ErrBadPiece: a piece whose bytes do not match the piece list.
	ErrBadPiece = errors.New("piece does not match its digest")
	// ErrDigestMismatch: every piece matched the piece list but the whole
	// file does not match the bundle digest (the piece list lied).
	ErrDigestMismatch = errors.New("bundle digest mismatch")
	// ErrNoPeers: no usable peer is left for the bundle.
	ErrNoPeers = errors.New("no peer can serve the bundle")
	// ErrUnauthorized: the peer refused our token (or we sent none).
	ErrUnauthorized = wire.ErrUnauthorized
	// ErrBadRange: a Range header that cannot be served.
	ErrBadRange = errors.New("unsatisfiable range")
	// ErrSentElsewhere: a first-copy request for a piece the peer is
	// sending, or just sent, to another fetcher (FirstCopyHeader).
	ErrSentElsewhere = errors.New("piece already sent to another fetcher")
)

// The shapes on the wire that the agent's machine reads live in wire, a
// leaf without this package's client and server.
type (
	Offer      = wire.Offer
	Status     = wire.Status
	PeerStatus = wire.PeerStatus
	PeerOffer  = wire.PeerOffer
)

// ErrNodeMismatch is a peer whose status names another node than its
// certificate does.
var ErrNodeMismatch = wire.ErrNodeMismatch

func hexOf(d digest.Digest) string { return strings.TrimPrefix(string(d), "sha256:") }

// NumPieces is how many pieces of pieceSize a file of size bytes has.
func NumPieces(size, pieceSize int64) int {
	if size <= 0 || pieceSize <= 0 {
		return 0
	}
	return int((size + pieceSize - 1) / pieceSize)
}

// PieceList is the sha256 of each fixed-size piece of a bundle's tar, as
// published by the node that holds it whole. It is signed by nothing: the
// fetcher checks the whole digest at the end.
type PieceList struct {
	Digest    digest.Digest `json:"digest"`
	Size      int64         `json:"size"`
	PieceSize int64         `json:"pieceSize"`
	Pieces    []string      `json:"pieces"` // lowercase hex sha256 per piece
	// Partial: the source is still reading the bundle (cut-through); a
	// piece not hashed yet has "" and is neither held nor served by
	// anyone. The list grows as the source reads; the whole digest is
	// checked at the end as for a whole list.
	Partial bool `json:"partial,omitempty"`
}

// Known reports whether piece i's digest is known.
func (p *PieceList) Known(i int) bool { return i >= 0 && i < len(p.Pieces) && p.Pieces[i] != "" }

// clone is a copy whose pieces can be changed.
func (p *PieceList) clone() *PieceList {
	c := *p
	c.Pieces = slices.Clone(p.Pieces)
	return &c
}

// merge is p with the digests q knows that p does not (p itself when q
// adds nothing); an error when the two disagree on a piece both know, or
// are not lists of the same bundle in the same pieces.
func (p *PieceList) merge(q *PieceList) (*PieceList, error) {
	if q.Digest != p.Digest || q.Size != p.Size || q.PieceSize != p.PieceSize || len(q.Pieces) != len(p.Pieces) {
		return nil, fmt.Errorf("%w: a list for %s in %d bytes in pieces of %d does not fit %s in %d in pieces of %d",
			ErrBadPieceList, q.Digest, q.Size, q.PieceSize, p.Digest, p.Size, p.PieceSize)
	}
	out := p
	for i, h := range q.Pieces {
		switch {
		case h == "" || h == p.Pieces[i]:
		case p.Pieces[i] != "":
			return nil, fmt.Errorf("%w: piece %d is %s there, %s here", ErrBadPieceList, i, sha256digest.Short(h), sha256digest.Short(p.Pieces[i]))
		default:
			if out == p {
				out = p.clone()
			}
			out.Pieces[i] = h
		}
	}
	if out != p {
		out.Partial = slices.Contains(out.Pieces, "")
	}
	return out, nil
}

// N is the number of pieces.
func (p *PieceList) N() int { return len(p.Pieces) }

// Bounds is the byte range [off, off+n) of piece i.
func (p *PieceList) Bounds(i int) (off, n int64) {
	off = int64(i) * p.PieceSize
	n = p.PieceSize
	if off+n > p.Size {
		n = p.Size - off
	}
	return off, n
}

// Check reports whether b is piece i.
func (p *PieceList) Check(i int, b []byte) error {
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != p.Pieces[i] {
		return fmt.Errorf("%w: piece %d of %s: %s, want %s", ErrBadPiece, i, sha256digest.Short(p.Digest), sha256digest.Short(got), sha256digest.Short(p.Pieces[i]))
	}
	return nil
}

// Validate checks that the list fits its own digest, size and piece size.
func (p *PieceList) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrBadPieceList, fmt.Sprintf(format, a...))
	}
	switch {
	case !sha256digest.Valid(p.Digest):
		return bad("digest %q is not sha256:<64 hex>", p.Digest)
	case p.Size <= 0:
		return bad("size %d is not positive", p.Size)
	case p.PieceSize < MinPieceSize || p.PieceSize > MaxPieceSize:
		return bad("piece size %d is not between %d and %d", p.PieceSize, MinPieceSize, MaxPieceSize)
	case p.Size/p.PieceSize >= maxPieces:
		return bad("size %d needs more than %d pieces", p.Size, maxPieces)
	}
	if want := NumPieces(p.Size, p.PieceSize); len(p.Pieces) != want {
		return bad("%d piece digests for %d bytes in pieces of %d (want %d)", len(p.Pieces), p.Size, p.PieceSize, want)
	}
	for i, h := range p.Pieces {
		if h == "" && p.Partial {
			continue // not hashed by the source yet
		}
		if !sha256digest.Valid("sha256:" + h) {
			return bad("piece %d digest %q is not 64 lowercase hex digits", i, h)
		}
	}
	return nil
}

// ParsePieceList decodes and validates a piece list, and checks it is for
// the bundle digest and size the caller expects (size < 0: any).
func ParsePieceList(b []byte, digest digest.Digest, size int64) (*PieceList, error) {
	var p PieceList
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("%w: not JSON: %v", ErrBadPieceList, err)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if p.Digest != digest {
		return nil, fmt.Errorf("%w: it is for %s, not %s", ErrBadPieceList, p.Digest, digest)
	}
	if size >= 0 && p.Size != size {
		return nil, fmt.Errorf("%w: it is for %d bytes, the bundle has %d", ErrBadPieceList, p.Size, size)
	}
	return &p, nil
}

// Have is a node's bitmap of verified pieces of one bundle, and of the
// pieces it is fetching now: other fetchers leave those to it rather than
// take a second copy from the same source, whose uplink is the fan-out's
// bottleneck.
type Have struct {
	Pieces  int    `json:"pieces"`
	Bits    []byte `json:"bits"`              // bit i (byte i/8, mask 1<<(i%8)) set: piece i held
	Pending []byte `json:"pending,omitempty"` // same layout: piece i being fetched
	// Live: the node is reading the bundle from its stick and serves each
	// piece once read and hashed (cut-through). Fetchers treat it as the
	// source it is: its uplink carries each piece about once.
	Live bool `json:"live,omitempty"`
}

// NewHave is an empty bitmap for n pieces.
func NewHave(n int) Have { return Have{Pieces: n, Bits: make([]byte, (n+7)/8)} }

// FullHave is a bitmap with all n pieces set.
func FullHave(n int) Have {
	h := NewHave(n)
	for i := 0; i < n; i++ {
		h.Set(i)
	}
	return h
}

// Has reports whether piece i is held.
func (h Have) Has(i int) bool {
	return i >= 0 && i < h.Pieces && i/8 < len(h.Bits) && h.Bits[i/8]&(1<<(i%8)) != 0
}

// Set marks piece i held.
func (h Have) Set(i int) { h.Bits[i/8] |= 1 << (i % 8) }

// unset marks piece i no longer held.
func (h Have) unset(i int) { h.Bits[i/8] &^= 1 << (i % 8) }

// IsPending reports whether piece i is being fetched.
func (h Have) IsPending(i int) bool {
	return i >= 0 && i < h.Pieces && i/8 < len(h.Pending) && h.Pending[i/8]&(1<<(i%8)) != 0
}

// Count is the number of pieces held.
func (h Have) Count() int {
	n := 0
	for i := 0; i < h.Pieces; i++ {
		if h.Has(i) {
			n++
		}
	}
	return n
}

// Clone is a copy that does not share bits.
func (h Have) Clone() Have {
	c := Have{Pieces: h.Pieces, Bits: append([]byte(nil), h.Bits...), Live: h.Live}
	if len(h.Pending) > 0 {
		c.Pending = append([]byte(nil), h.Pending...)
	}
	return c
}

func (h Have) valid() bool {
	n := (h.Pieces + 7) / 8
	return h.Pieces >= 0 && len(h.Bits) == n && (len(h.Pending) == 0 || len(h.Pending) == n)
}
