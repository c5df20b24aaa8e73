package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// FetcherOptions configure NewFetcher.
type FetcherOptions struct {
	// Peers are the other nodes' peer addresses (host:port).
	Peers []string
	// Token is sent as a bearer token when set.
	Token string
	// Shelf, when set, re-serves every piece as soon as it is verified,
	// and the whole bundle (from the fetched file) once Fetch returns nil.
	Shelf *Shelf
	// Log: nil discards.
	Log *slog.Logger
	// PerPeer bounds piece requests in flight to one peer; 0: 1. One at
	// a time, a peer's uplink finishes each piece at full rate before the
	// next, so pieces reach the next hop sooner (8 nodes fetching in
	// step: 34.3 s with 1, 38.7 s with 2, 66.6 s with 4).
	PerPeer int
	// Parallel bounds piece requests in flight in all; 0: 16.
	Parallel int
	// Refresh is how often peers' piece bitmaps are polled; 0: 250ms.
	Refresh time.Duration
	// Client overrides the HTTP client (tests); nil: NewClient(Token, nil).
	Client *Client
	// Pacer, when set, pauses the writes of fetched pieces and lowers the
	// requests in flight while the node's other work stalls
	// (internal/pacing).
	Pacer Pacer
}

// Pacer slows bulk work while the node is under pressure.
type Pacer interface {
	// Pace pauses for n bytes of bulk work, or until ctx ends.
	Pace(ctx context.Context, n int) error
	// Workers is how many of n workers may run now (at least 1).
	Workers(n int) int
}

// Fetcher gets bundles from peers.
type Fetcher struct {
	opts FetcherOptions
	c    *Client
	log  *slog.Logger

	mu    sync.Mutex
	peers []string // opts.Peers, or the list SetPeers gave
}

// NewFetcher makes a fetcher for opts.Peers.
func NewFetcher(opts FetcherOptions) *Fetcher {
	if opts.PerPeer <= 0 {
		opts.PerPeer = 1
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 16
	}
	if opts.Refresh <= 0 {
		opts.Refresh = 250 * time.Millisecond
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	c := opts.Client
	if c == nil {
		c = NewClient(opts.Token, nil)
	}
	return &Fetcher{opts: opts, c: c, log: opts.Log, peers: slices.Clone(opts.Peers)}
}

// SetPeers replaces the peer list (peers found through the cluster's API,
// so that nodes added later are included).
func (f *Fetcher) SetPeers(peers []string) {
	f.mu.Lock()
	f.peers = slices.Clone(peers)
	f.mu.Unlock()
}

// Peers is the current peer list.
func (f *Fetcher) Peers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.peers)
}

// Progress is reported after every verified piece.
type Progress struct {
	Digest      digest.Digest
	Done, Total int64 // bytes verified, bytes in all
	Pieces      int   // pieces verified
	PiecesTotal int
	Peers       int      // peers with a request in flight
	Dropped     []string // peers dropped for this bundle
}

// Fetch gets bundle digest from the peers into the file dest, in pieces,
// from several peers at once; it verifies each piece, re-serves it through
// the Shelf, and records progress in StatePath(dest) so that a later call
// resumes. Unreachable peers are retried with backoff for as long as ctx
// lasts; a peer that serves a bad piece (or a piece list that disagrees
// with the others') is dropped for this bundle. Fetch returns nil once
// every piece is held and dest's sha256 is digest; if every piece matched
// but the whole does not (a lying piece list), dest and its state are
// removed and the error wraps ErrDigestMismatch. progress may be nil.
func (f *Fetcher) Fetch(ctx context.Context, digest digest.Digest, dest string, progress func(Progress)) error {
	if !sha256digest.Valid(digest) {
		return fmt.Errorf("peer fetch: %q is not a sha256 digest", digest)
	}
	j := &job{f: f, digest: digest, dest: dest, progress: progress, peers: map[string]*peerState{}}
	for _, p := range f.Peers() {
		j.peers[p] = &peerState{addr: p}
	}
	if err := j.prepare(ctx); err != nil {
		return err
	}
	// Not under the scheduler's context: that ends the requests when the
	// fetch ends, and the hashing must go on to the last piece.
	whole := startWholeFile(ctx, j)
	err := newScheduler(ctx, j, whole).run()
	whole.stop()
	switch {
	case j.shelf == nil:
		j.file.Close()
	case err != nil:
		j.shelf.cancel() // closes j.file
	}
	return err
}

// peerState is what one fetch knows of one peer.
type peerState struct {
	addr       string
	have       Have
	known      bool // have is current
	seed       bool // have is complete
	inflight   int
	dropped    bool
	dropReason string
	fails      int
	retryAt    time.Time
	polling    bool
	gone       bool // it said it does not hold the bundle (any more)
}

// job is one fetch of one bundle: what it holds, of which peers.
type job struct {
	f        *Fetcher
	digest   digest.Digest
	dest     string
	progress func(Progress)

	pl   *PieceList
	meta []byte
	sig  []byte // the bundle's .minisig, passed on
	file *os.File
	mine Have
	// stream, when set, is the extraction the bytes feed as they arrive
	// (FetchStream); nil: the whole file is kept (Fetch).
	stream *stream
	// shelf re-serves what it holds (nil: the fetcher has no Shelf).
	shelf *receiving
	peers map[string]*peerState
}

// prepare loads the resume record or discovers the bundle and chooses its
// piece list, then opens dest.
func (j *job) prepare(ctx context.Context) error {
	log := j.f.log.With("digest", j.digest)
	if st, err := j.loadState(); err == nil {
		j.pl, j.meta, j.mine = st.Pieces, st.Meta, st.Have
		if j.stream != nil {
			j.stream.from = st.Stream
		}
		log.Info("peer fetch: resuming", "pieces", j.mine.Count(), "of", j.pl.N())
	} else if !errors.Is(err, os.ErrNotExist) {
		log.Warn("peer fetch: resume record unusable; starting over", "err", err)
	}
	if j.pl == nil {
		if err := j.choosePieceList(ctx); err != nil {
			return err
		}
		j.mine = NewHave(j.pl.N())
	}
	fl, err := os.OpenFile(j.dest, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("peer fetch %s: %w (check the state directory)", j.digest, err)
	}
	if fi, err := fl.Stat(); err != nil || fi.Size() != j.pl.Size {
		if j.mine.Count() > 0 {
			log.Warn("peer fetch: file size changed since the resume record; starting over", "file", j.dest)
			j.mine = NewHave(j.pl.N())
			if j.stream != nil {
				j.stream.from = nil
			}
		}
		if err := fl.Truncate(j.pl.Size); err != nil {
			fl.Close()
			return fmt.Errorf("peer fetch %s: size %s to %d bytes: %w (is there room?)", j.digest, j.dest, j.pl.Size, err)
		}
	}
	j.file = fl
	var served io.ReaderAt = fl
	if j.stream != nil {
		j.stream.f, j.stream.pl = fl, j.pl
		served = j.stream.reader()
	}
	if s := j.f.opts.Shelf; s != nil {
		j.shelf = s.addPartial(Offer{Digest: j.digest, Metadata: j.meta, Size: j.pl.Size, Signature: j.sig}, served, j.pl, j.mine)
	}
	return nil
}

// drop stops asking peer for this bundle, for why.
func (j *job) drop(peer, why string) {
	ps := j.peers[peer]
	if ps == nil || ps.dropped {
		return
	}
	ps.dropped, ps.dropReason = true, why
	j.f.log.Warn("peer dropped for this bundle", "peer", peer, "digest", j.digest, "reason", why)
}
