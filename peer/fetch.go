package peer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/ferry-edge/ferry/internal/atomicfile"
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

// PeerOffer is an offer and the peer that made it.
type PeerOffer struct {
	Peer string `json:"peer"`
	Offer
}

// Discover asks every peer at once what it serves. It returns every offer
// received, sorted by peer, and the peers that could not be asked (joined;
// nil when all answered). Apply approval and arch checks to an offer's
// Metadata before fetching it.
func (f *Fetcher) Discover(ctx context.Context) ([]PeerOffer, error) {
	var (
		mu   sync.Mutex
		out  []PeerOffer
		errs []error
		wg   sync.WaitGroup
	)
	for _, p := range f.Peers() {
		wg.Go(func() {
			o, err := f.c.Offers(ctx, p)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			for _, x := range o {
				if ValidDigest(x.Digest) && x.Size > 0 {
					out = append(out, PeerOffer{Peer: p, Offer: x})
				}
			}
		})
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool {
		return out[i].Peer < out[j].Peer || out[i].Peer == out[j].Peer && out[i].Digest < out[j].Digest
	})
	return out, errors.Join(errs...)
}

// Statuses asks every peer for its status at once. A peer that did not
// answer has Err set.
func (f *Fetcher) Statuses(ctx context.Context) map[string]PeerStatus {
	var (
		mu  sync.Mutex
		out = map[string]PeerStatus{}
		wg  sync.WaitGroup
	)
	for _, p := range f.Peers() {
		wg.Go(func() {
			s, err := f.c.Status(ctx, p)
			mu.Lock()
			out[p] = PeerStatus{Status: s, Err: err}
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// Progress is reported after every verified piece.
type Progress struct {
	Digest      string
	Done, Total int64 // bytes verified, bytes in all
	Pieces      int   // pieces verified
	PiecesTotal int
	Peers       int      // peers with a request in flight
	Dropped     []string // peers dropped for this bundle
}

// fetchState is the resume record next to the destination file.
type fetchState struct {
	Pieces *PieceList      `json:"pieceList"`
	Meta   json.RawMessage `json:"metadata"`
	Have   Have            `json:"have"`
	// Stream: where a streaming fetch's extraction had got to.
	Stream *StreamResume `json:"stream,omitempty"`
}

// StatePath is where Fetch keeps its resume record for dest.
func StatePath(dest string) string { return dest + ".state" }

// Fetch gets bundle digest from the peers into the file dest, in pieces,
// from several peers at once; it verifies each piece, re-serves it through
// the Shelf, and records progress in StatePath(dest) so that a later call
// resumes. Unreachable peers are retried with backoff for as long as ctx
// lasts; a peer that serves a bad piece (or a piece list that disagrees
// with the others') is dropped for this bundle. Fetch returns nil once
// every piece is held and dest's sha256 is digest; if every piece matched
// but the whole does not (a lying piece list), dest and its state are
// removed and the error wraps ErrDigestMismatch. progress may be nil.
func (f *Fetcher) Fetch(ctx context.Context, digest, dest string, progress func(Progress)) error {
	if !ValidDigest(digest) {
		return fmt.Errorf("peer fetch: %q is not a sha256 digest", digest)
	}
	j := &job{f: f, digest: digest, dest: dest, progress: progress, peers: map[string]*peerState{}}
	for _, p := range f.Peers() {
		j.peers[p] = &peerState{addr: p}
	}
	if err := j.prepare(ctx); err != nil {
		return err
	}
	err := j.run(ctx)
	if err != nil && f.opts.Shelf != nil {
		f.opts.Shelf.Remove(digest) // closes j.file
	} else if err != nil || f.opts.Shelf == nil {
		j.file.Close()
	}
	return err
}

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

type job struct {
	f        *Fetcher
	digest   string
	dest     string
	progress func(Progress)

	pl   *PieceList
	meta json.RawMessage
	sig  []byte // the bundle's .minisig, passed on
	file *os.File
	mine Have
	// stream, when set, is the extraction the bytes feed as they arrive
	// (FetchStream); nil: the whole file is kept (Fetch).
	stream *stream
	// goneSince: when every peer stopped offering it (withdrawn).
	goneSince time.Time
	peers     map[string]*peerState
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
		s.addPartial(Offer{Digest: j.digest, Metadata: j.meta, Size: j.pl.Size, Signature: j.sig}, served, j.pl, j.mine)
	}
	return nil
}

func (j *job) loadState() (*fetchState, error) {
	b, err := os.ReadFile(StatePath(j.dest))
	if err != nil {
		return nil, err
	}
	var st fetchState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, err
	}
	if st.Pieces == nil {
		return nil, errors.New("no piece list")
	}
	if err := st.Pieces.Validate(); err != nil {
		return nil, err
	}
	if st.Pieces.Digest != j.digest {
		return nil, fmt.Errorf("record is for %s", st.Pieces.Digest)
	}
	if !st.Have.valid() || st.Have.Pieces != st.Pieces.N() {
		return nil, errors.New("bitmap does not fit the piece list")
	}
	return &st, nil
}

func (j *job) saveState() error {
	if err := j.file.Sync(); err != nil {
		return err
	}
	st := fetchState{Pieces: j.pl, Meta: j.meta, Have: j.mine}
	if j.stream != nil {
		st.Have, st.Stream = j.stream.record(j.mine)
	}
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(StatePath(j.dest), b, 0o600)
}

// choosePieceList asks every peer that offers the bundle for its piece
// list and takes the one most of them agree on (ties: one from a peer that
// holds the whole bundle). Peers that disagree are dropped. It waits while
// the source is still hashing and while no peer answers.
func (j *job) choosePieceList(ctx context.Context) error {
	log := j.f.log.With("digest", j.digest)
	first := true
	for wait := time.Duration(0); ; wait = min(max(2*wait, 500*time.Millisecond), 10*time.Second) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("peer fetch %s: waiting for a piece list: %w", j.digest, context.Cause(ctx))
		case <-time.After(wait):
		}
		offers, derr := j.f.Discover(ctx)
		var votes []*vote
		var mu sync.Mutex
		var wg sync.WaitGroup
		n := 0
		for _, o := range offers {
			if o.Digest != j.digest || j.peers[o.Peer] == nil || j.peers[o.Peer].dropped {
				continue
			}
			n++
			wg.Go(func() {
				pl, err := j.f.c.Pieces(ctx, o.Peer, j.digest, o.Size)
				if err != nil {
					if !errors.Is(err, ErrNotReady) {
						log.Warn("peer fetch: no piece list from peer", "peer", o.Peer, "err", err)
					}
					return
				}
				mu.Lock()
				defer mu.Unlock()
				v := agreeing(votes, pl)
				if v == nil {
					v = &vote{pl: pl, meta: o.Metadata, sig: o.Signature}
					votes = append(votes, v)
				}
				v.peers = append(v.peers, o.Peer)
				v.complete = v.complete || o.Complete
			})
		}
		wg.Wait()
		if n == 0 && errors.Is(derr, ErrUnauthorized) {
			return fmt.Errorf("peer fetch %s: %w", j.digest, derr)
		}
		if n == 0 && first && derr == nil {
			return fmt.Errorf("%w: %s: none of %d peers offers it", ErrNoPeers, j.digest, len(j.f.Peers()))
		}
		first = false
		var best *vote
		for _, v := range votes {
			if best == nil || len(v.peers) > len(best.peers) || len(v.peers) == len(best.peers) && v.complete && !best.complete {
				best = v
			}
		}
		if best == nil {
			log.Info("peer fetch: waiting for a piece list", "offers", n, "err", derr)
			continue
		}
		for _, v := range votes {
			// A list in another piece size is not a lie; one in the same
			// size that differs is.
			if v != best && v.pl.PieceSize == best.pl.PieceSize {
				for _, p := range v.peers {
					j.drop(p, "its piece list disagrees with that of "+fmt.Sprint(best.peers))
				}
			}
		}
		j.pl, j.meta, j.sig = best.pl, best.meta, best.sig
		return nil
	}
}

// vote is the peers that gave one piece list (or lists that agree on
// every piece they both know: a live source's list grows).
type vote struct {
	pl       *PieceList
	meta     json.RawMessage
	sig      []byte
	peers    []string
	complete bool
}

// agreeing is the vote whose list agrees with pl, which it takes in.
func agreeing(votes []*vote, pl *PieceList) *vote {
	for _, v := range votes {
		if m, err := v.pl.merge(pl); err == nil {
			v.pl = m
			return v
		}
	}
	return nil
}

func (j *job) drop(peer, why string) {
	ps := j.peers[peer]
	if ps == nil || ps.dropped {
		return
	}
	ps.dropped, ps.dropReason = true, why
	j.f.log.Warn("peer dropped for this bundle", "peer", peer, "digest", j.digest, "reason", why)
}

type pieceResult struct {
	peer  string
	piece int
	err   error
	local bool // a local write failed: fatal
}

type haveResult struct {
	peer string
	have Have
	pl   *PieceList // the peer's piece list, when it knows digests ours lacks
	err  error
}

// run is the scheduler: one goroutine owns all state; requests and polls
// run in their own goroutines and report back on channels.
func (j *job) run(ctx context.Context) error {
	// Not under the cancel below: finish cancels the requests, and the
	// hashing must go on to the last piece. A stream hashes what it
	// extracts instead (its pieces are freed once extracted).
	var whole *prefixHash
	var consumed, freed <-chan struct{}
	if j.stream == nil {
		whole = startPrefixHash(ctx, j.file, j.pl)
		defer whole.stop()
	} else {
		consumed, freed = j.stream.exited, j.stream.wake
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	opts := j.f.opts
	log := j.f.log.With("digest", j.digest)
	results := make(chan pieceResult)
	haves := make(chan haveResult)
	inflight := make([]bool, j.pl.N())
	sentElsewhere := map[int]time.Time{} // pieces a seed refused as first copies, until when
	total := 0
	polls := 0
	rnd := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	dirty := false
	lastSave := time.Now()
	tick := time.NewTicker(opts.Refresh)
	defer tick.Stop()
	front := 0 // pieces [0, front) are held
	advance := func() {
		for front < j.pl.N() && j.mine.Has(front) {
			front++
		}
		if whole != nil {
			whole.advance(front)
		} else {
			j.stream.advance(min(int64(front)*j.pl.PieceSize, j.pl.Size))
		}
	}
	advance()

	// finish waits for every goroutine so that none touches the file
	// after Fetch returns.
	finish := func(err error) error {
		cancel()
		for total > 0 || polls > 0 {
			select {
			case r := <-results:
				total--
				if r.err == nil {
					j.mine.Set(r.piece)
					dirty = true
				}
			case <-haves:
				polls--
			}
		}
		if dirty {
			if serr := j.saveState(); serr != nil {
				log.Warn("peer fetch: cannot save resume record", "err", serr)
			}
		}
		return err
	}

	poll := func() {
		now := time.Now()
		for _, ps := range j.peers {
			if ps.dropped || ps.polling || now.Before(ps.retryAt) {
				continue
			}
			ps.polling = true
			polls++
			go func(addr string, pl *PieceList) {
				h, err := j.f.c.Have(ctx, addr, j.digest)
				var theirs *PieceList
				if err == nil && learnsFrom(pl, h) {
					theirs, _ = j.f.c.Pieces(ctx, addr, j.digest, pl.Size)
				}
				haves <- haveResult{peer: addr, have: h, pl: theirs, err: err}
			}(ps.addr, j.pl)
		}
	}
	poll()

	report := func() {
		if j.progress == nil {
			return
		}
		p := Progress{Digest: j.digest, Total: j.pl.Size, PiecesTotal: j.pl.N()}
		for i := 0; i < j.pl.N(); i++ {
			if j.mine.Has(i) {
				_, n := j.pl.Bounds(i)
				p.Done += n
				p.Pieces++
			}
		}
		for _, ps := range j.peers {
			if ps.inflight > 0 {
				p.Peers++
			}
			if ps.dropped {
				p.Dropped = append(p.Dropped, ps.addr)
			}
		}
		sort.Strings(p.Dropped)
		j.progress(p)
	}
	report()

	for {
		if j.mine.Count() == j.pl.N() && whole != nil {
			if err := finish(nil); err != nil {
				return err
			}
			return j.verifyWhole(whole)
		}
		if j.mine.Count() == j.pl.N() && consumed == nil {
			return finish(nil) // the extraction checked the whole digest
		}
		for _, a := range j.assign(time.Now(), inflight, total, sentElsewhere, rnd) {
			total++
			if s := opts.Shelf; s != nil {
				s.setPending(j.digest, a.piece, true)
			}
			// The list may grow (a new one) while the request runs: it
			// takes the piece's bounds and digest with it.
			off, n := j.pl.Bounds(a.piece)
			want := j.pl.Pieces[a.piece]
			go func() {
				results <- j.fetchPiece(ctx, a, off, n, want)
			}()
		}
		if total == 0 && polls == 0 {
			live := 0
			for _, ps := range j.peers {
				if !ps.dropped {
					live++
				}
			}
			if live == 0 {
				var why []string
				for _, ps := range j.peers {
					why = append(why, ps.addr+": "+ps.dropReason)
				}
				sort.Strings(why)
				return finish(fmt.Errorf("%w: %s: every peer was dropped (%v); check those nodes' bundle files", ErrNoPeers, j.digest, why))
			}
		}

		select {
		case <-ctx.Done():
			return finish(fmt.Errorf("peer fetch %s: %w", j.digest, context.Cause(ctx)))
		case <-consumed:
			// The extraction ended: refused (finish stops the fetch), or
			// it read the last byte, so every piece is held.
			if err := j.stream.consumeErr(); err != nil {
				j.stream.failed = true
				return finish(err)
			}
			consumed = nil
		case <-freed:
			// Pieces extracted and freed: the window moved on.
		case r := <-results:
			total--
			inflight[r.piece] = false
			ps := j.peers[r.peer]
			ps.inflight--
			if s := opts.Shelf; s != nil {
				s.setPending(j.digest, r.piece, false)
			}
			switch {
			case r.err == nil:
				j.mine.Set(r.piece)
				ps.fails = 0
				dirty = true
				advance()
				if s := opts.Shelf; s != nil {
					s.setPiece(j.digest, r.piece)
				}
				report()
			case r.local:
				return finish(r.err)
			case errors.Is(r.err, ErrSentElsewhere):
				sentElsewhere[r.piece] = time.Now().Add(firstCopyWindow)
			case errors.Is(r.err, ErrBadPiece):
				j.drop(r.peer, r.err.Error())
				report()
			case errors.Is(r.err, ErrUnauthorized):
				j.drop(r.peer, "it refused our token: set the same token_file on every node")
				report()
			case ctx.Err() != nil:
			default:
				if errors.Is(r.err, ErrBadRange) || errors.Is(r.err, ErrUnknownBundle) {
					ps.known = false // it no longer has what we thought: poll again
				} else {
					j.backoff(ps, r.err)
				}
			}
		case h := <-haves:
			polls--
			ps := j.peers[h.peer]
			ps.polling = false
			switch {
			case h.err == nil && h.have.Pieces != j.pl.N():
				j.drop(h.peer, fmt.Sprintf("it has %d pieces of the bundle, the piece list has %d", h.have.Pieces, j.pl.N()))
			case h.err == nil:
				ps.gone = false
				j.learn(h)
				ps.have, ps.known = h.have, true
				ps.seed = h.have.Live || h.have.Count() == j.pl.N()
				ps.fails = 0
			case errors.Is(h.err, ErrUnknownBundle) || errors.Is(h.err, ErrNotReady):
				ps.have, ps.known, ps.seed = NewHave(j.pl.N()), true, false
				ps.gone = errors.Is(h.err, ErrUnknownBundle)
			case errors.Is(h.err, ErrUnauthorized):
				j.drop(h.peer, "it refused our token: set the same token_file on every node")
			case ctx.Err() != nil:
			default:
				ps.known = false
				j.backoff(ps, h.err)
			}
		case <-tick.C:
			poll()
			if j.withdrawn(time.Now()) {
				return finish(fmt.Errorf("%w: %s: no peer offers it any more while its source was still reading it (the read failed or the digest did not match); nothing fetched is kept", ErrWithdrawn, j.digest))
			}
			if dirty && time.Since(lastSave) >= time.Second {
				if err := j.saveState(); err != nil {
					return finish(fmt.Errorf("peer fetch %s: save resume record %s: %w", j.digest, StatePath(j.dest), err))
				}
				dirty, lastSave = false, time.Now()
			}
		}
	}
}

// assignment is one piece request to start.
type assignment struct {
	peer      string
	piece     int
	firstCopy bool // ask for a first copy (FirstCopyHeader)
}

// assign hands out work, given total requests in flight: each peer with a
// free slot gets the rarest piece it has that nobody is fetching yet. A
// seed (a peer holding every piece) is asked only for pieces no other
// fetcher holds or is fetching (nor refused as sent elsewhere, until
// when), so its uplink carries each piece about once; the others come
// from the fetchers. Only a fetcher that would otherwise sit idle takes a
// second copy from a seed. It marks what it assigns in inflight and in
// the peers' counts.
func (j *job) assign(now time.Time, inflight []bool, total int, sentElsewhere map[int]time.Time, rnd *rand.Rand) []assignment {
	opts := j.f.opts
	parallel := opts.Parallel
	if opts.Pacer != nil {
		parallel = opts.Pacer.Workers(parallel) // fewer in flight while the node stalls
	}
	rarity, nearby := j.supply()
	for i, until := range sentElsewhere {
		if now.Before(until) {
			nearby[i] = true
		} else {
			delete(sentElsewhere, i)
		}
	}
	order := make([]*peerState, 0, len(j.peers))
	for _, ps := range j.peers {
		order = append(order, ps)
	}
	rnd.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
	// Pieces nobody can give yet (digest unknown: the source has not read
	// them) or beyond a stream's window count as taken.
	taken := slices.Clone(inflight)
	limit := j.pl.N()
	if j.stream != nil {
		limit = j.stream.limit()
	}
	for i := range taken {
		taken[i] = taken[i] || i >= limit || j.pl.Partial && !j.pl.Known(i)
	}
	var out []assignment
	for _, idle := range []bool{false, true} {
		if idle && total+len(out) > 0 {
			break
		}
		for progressMade := true; progressMade && total+len(out) < parallel; {
			progressMade = false
			sort.SliceStable(order, func(a, b int) bool { return order[a].inflight < order[b].inflight })
			for _, ps := range order {
				if total+len(out) >= parallel {
					break
				}
				if ps.dropped || !ps.known || ps.inflight >= opts.PerPeer || now.Before(ps.retryAt) {
					continue
				}
				var avoid []bool
				if ps.seed && !idle {
					avoid = nearby
				}
				i := pickPiece(j.mine, taken, ps.have, rarity, avoid)
				if i < 0 {
					continue
				}
				inflight[i], taken[i] = true, true
				ps.inflight++
				progressMade = true
				out = append(out, assignment{peer: ps.addr, piece: i, firstCopy: avoid != nil})
			}
		}
	}
	return out
}

// withdrawnAfter is how long every peer must have stopped offering a
// bundle whose list still grows before the fetch gives it up: longer than
// a source agent's restart, which offers it again.
var withdrawnAfter = 5 * time.Second

// withdrawn reports whether every peer still used has said, for
// withdrawnAfter, that it does not hold a bundle whose piece list is
// still partial: its source withdrew it.
func (j *job) withdrawn(now time.Time) bool {
	all := j.pl.Partial
	for _, ps := range j.peers {
		all = all && (ps.dropped || ps.gone)
	}
	if !all {
		j.goneSince = time.Time{}
		return false
	}
	if j.goneSince.IsZero() {
		j.goneSince = now
	}
	return now.Sub(j.goneSince) >= withdrawnAfter
}

// learnsFrom reports whether a peer holding h knows piece digests that
// pl, a list still growing (cut-through), lacks.
func learnsFrom(pl *PieceList, h Have) bool {
	if !pl.Partial || h.Pieces != pl.N() {
		return false
	}
	for i := range pl.N() {
		if h.Has(i) && !pl.Known(i) {
			return true
		}
	}
	return false
}

// learn takes in the piece digests a peer's list adds to ours (a live
// source's list grows as it reads), and offers them through the shelf.
// A list that disagrees with ours on a piece drops its peer.
func (j *job) learn(h haveResult) {
	if h.pl == nil {
		return
	}
	m, err := j.pl.merge(h.pl)
	if err != nil {
		j.drop(h.peer, "its piece list disagrees with the one this fetch uses: "+err.Error())
		return
	}
	if m == j.pl {
		return
	}
	j.pl = m
	if s := j.f.opts.Shelf; s != nil {
		s.setPieces(j.digest, m)
	}
}

func (j *job) backoff(ps *peerState, err error) {
	ps.fails++
	d := min(250*time.Millisecond<<min(ps.fails-1, 8), 15*time.Second)
	ps.retryAt = time.Now().Add(d)
	j.f.log.Info("peer fetch: peer failed; retrying later", "peer", ps.addr, "digest", j.digest, "retry_in", d, "err", err)
}

// supply counts, per piece, the peers known to hold it or to be fetching
// it (rarity), and marks the pieces that a peer other than a seed holds or
// is fetching (nearby).
func (j *job) supply() (rarity []int, nearby []bool) {
	rarity, nearby = make([]int, j.pl.N()), make([]bool, j.pl.N())
	for _, ps := range j.peers {
		if ps.dropped || !ps.known {
			continue
		}
		for i := range rarity {
			if ps.have.Has(i) || ps.have.IsPending(i) {
				rarity[i]++
				nearby[i] = nearby[i] || !ps.seed
			}
		}
	}
	return rarity, nearby
}

// pickPiece returns the piece to ask a peer holding theirs for: one we
// lack, not in flight, that they have, not marked in avoid (nil: none),
// with the lowest rarity and, among those, the lowest index, so the file
// fills from its start and its whole digest is computed as it arrives.
// -1: none.
func pickPiece(mine Have, inflight []bool, theirs Have, rarity []int, avoid []bool) int {
	best := -1
	for i := range inflight {
		if mine.Has(i) || inflight[i] || !theirs.Has(i) || avoid != nil && avoid[i] {
			continue
		}
		if best < 0 || rarity[i] < rarity[best] {
			best = i
		}
	}
	return best
}

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
		return pieceResult{peer: peer, piece: i, err: fmt.Errorf("%w: piece %d from peer %s: sha256 %.12s…, want %.12s…", ErrBadPiece, i, peer, got, want)}
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
		if s := j.f.opts.Shelf; s != nil {
			s.Remove(j.digest)
		}
		os.Remove(j.dest)
		os.Remove(StatePath(j.dest))
		return fmt.Errorf("%w: %s: every piece matched the piece list but the whole file hashes to %s; the piece list was wrong (a peer's bundle file is damaged?); the download was discarded and will start over", ErrDigestMismatch, j.digest, got)
	}
	if err := os.Remove(StatePath(j.dest)); err != nil && !errors.Is(err, os.ErrNotExist) {
		j.f.log.Warn("peer fetch: cannot remove resume record", "err", err)
	}
	if s := j.f.opts.Shelf; s != nil {
		s.complete(j.digest)
	}
	j.f.log.Info("peer fetch: bundle complete", "digest", j.digest, "file", j.dest)
	return nil
}
