package peer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"time"
)

// scheduler runs a fetch once its piece list is chosen. One goroutine
// (run) owns all its state and handles one event at a time, each in a
// method of its own; piece requests and polls run in goroutines of their
// own and report back on channels. What the held prefix feeds is its
// consumer, the only part that differs between Fetch and FetchStream.
type scheduler struct {
	*job
	c      consumer
	ctx    context.Context // ended with the fetch: stops requests and polls
	cancel context.CancelFunc
	log    *slog.Logger

	results chan pieceResult
	haves   chan haveResult

	// Every request and poll started is counted until its answer is
	// taken, so that finish can wait for all of them.
	requests int // piece requests in flight
	polls    int // polls in flight

	inflight      []bool            // pieces requested and not answered yet
	sentElsewhere map[int]time.Time // pieces a seed refused as first copies, until when
	front         int               // pieces [0, front) are held
	dirty         bool              // pieces held since the last resume record
	lastSave      time.Time
	goneSince     time.Time // when every peer stopped offering it (withdrawn)
	rnd           *rand.Rand
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

func newScheduler(ctx context.Context, j *job, c consumer) *scheduler {
	ctx, cancel := context.WithCancel(ctx)
	return &scheduler{
		job: j, c: c, ctx: ctx, cancel: cancel, log: j.f.log.With("digest", j.digest),
		results:       make(chan pieceResult),
		haves:         make(chan haveResult),
		inflight:      make([]bool, j.pl.N()),
		sentElsewhere: map[int]time.Time{},
		lastSave:      time.Now(),
		rnd:           rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
	}
}

// run fetches until every piece is held and the consumer has taken them
// (then its last check is the result), or until the fetch fails.
func (s *scheduler) run() error {
	defer s.cancel()
	tick := time.NewTicker(s.f.opts.Refresh)
	defer tick.Stop()
	s.advance()
	s.poll()
	s.report()
	for {
		if ended, err := s.c.ended(); err != nil {
			return s.finish(err)
		} else if ended && s.mine.Count() == s.pl.N() {
			s.finish(nil)
			return s.c.complete()
		}
		s.request()
		if err := s.stranded(); err != nil {
			return s.finish(err)
		}
		var err error
		select {
		case <-s.ctx.Done():
			err = fmt.Errorf("peer fetch %s: %w", s.digest, context.Cause(s.ctx))
		case <-s.c.moved():
			// Its window moved on, or it ended: both are seen above.
		case r := <-s.results:
			err = s.pieceDone(r)
		case h := <-s.haves:
			s.polled(h)
		case <-tick.C:
			err = s.ticked(time.Now())
		}
		if err != nil {
			return s.finish(err)
		}
	}
}

// finish ends the fetch with err: it stops what is in flight and waits
// for it, so that nothing touches the file after the fetch returns, and
// keeps the resume record.
func (s *scheduler) finish(err error) error {
	s.cancel()
	for s.requests > 0 || s.polls > 0 {
		select {
		case r := <-s.results:
			s.requests--
			if r.err == nil {
				s.mine.Set(r.piece)
				s.dirty = true
			}
		case <-s.haves:
			s.polls--
		}
	}
	if s.dirty {
		if serr := s.saveState(); serr != nil {
			s.log.Warn("peer fetch: cannot save resume record", "err", serr)
		}
	}
	return err
}

// request starts the piece requests that assign hands out.
func (s *scheduler) request() {
	for _, a := range s.assign(time.Now()) {
		s.requests++
		s.shelf.pending(a.piece, true)
		// The list may grow (a new one) while the request runs: it
		// takes the piece's bounds and digest with it.
		off, n := s.pl.Bounds(a.piece)
		want := s.pl.Pieces[a.piece]
		go func() {
			s.results <- s.fetchPiece(s.ctx, a, off, n, want)
		}()
	}
}

// stranded is the fetch's end when nothing is in flight and every peer
// was dropped; nil otherwise.
func (s *scheduler) stranded() error {
	if s.requests > 0 || s.polls > 0 {
		return nil
	}
	var why []string
	for _, ps := range s.peers {
		if !ps.dropped {
			return nil
		}
		why = append(why, ps.addr+": "+ps.dropReason)
	}
	sort.Strings(why)
	return fmt.Errorf("%w: %s: every peer was dropped (%v); check those nodes' bundle files", ErrNoPeers, s.digest, why)
}

// pieceDone takes a piece request's answer; an error ends the fetch.
func (s *scheduler) pieceDone(r pieceResult) error {
	s.requests--
	s.inflight[r.piece] = false
	ps := s.peers[r.peer]
	ps.inflight--
	s.shelf.pending(r.piece, false)
	switch {
	case r.err == nil:
		s.mine.Set(r.piece)
		ps.fails = 0
		s.dirty = true
		s.advance()
		s.shelf.piece(r.piece)
		s.report()
	case r.local:
		return r.err
	case errors.Is(r.err, ErrSentElsewhere):
		s.sentElsewhere[r.piece] = time.Now().Add(firstCopyWindow)
	case errors.Is(r.err, ErrBadPiece):
		s.drop(r.peer, r.err.Error())
		s.report()
	case errors.Is(r.err, ErrUnauthorized):
		s.drop(r.peer, "it refused our token: set the same token_file on every node")
		s.report()
	case s.ctx.Err() != nil:
	case errors.Is(r.err, ErrBadRange) || errors.Is(r.err, ErrUnknownBundle):
		ps.known = false // it no longer has what we thought: poll again
	default:
		s.backoff(ps, r.err)
	}
	return nil
}

// poll asks every peer that is due which pieces it holds.
func (s *scheduler) poll() {
	now := time.Now()
	for _, ps := range s.peers {
		if ps.dropped || ps.polling || now.Before(ps.retryAt) {
			continue
		}
		ps.polling = true
		s.polls++
		go s.askHave(ps.addr, s.pl)
	}
}

// askHave is one poll: the peer's bitmap and, when it knows piece
// digests that pl lacks, its list.
func (s *scheduler) askHave(addr string, pl *PieceList) {
	h, err := s.f.c.Have(s.ctx, addr, s.digest)
	var theirs *PieceList
	if err == nil && learnsFrom(pl, h) {
		theirs, _ = s.f.c.Pieces(s.ctx, addr, s.digest, pl.Size)
	}
	s.haves <- haveResult{peer: addr, have: h, pl: theirs, err: err}
}

// polled takes a poll's answer: which pieces a peer holds.
func (s *scheduler) polled(h haveResult) {
	s.polls--
	ps := s.peers[h.peer]
	ps.polling = false
	switch {
	case h.err == nil && h.have.Pieces != s.pl.N():
		s.drop(h.peer, fmt.Sprintf("it has %d pieces of the bundle, the piece list has %d", h.have.Pieces, s.pl.N()))
	case h.err == nil:
		ps.gone = false
		s.learn(h)
		ps.have, ps.known = h.have, true
		ps.seed = h.have.Live || h.have.Count() == s.pl.N()
		ps.fails = 0
	case errors.Is(h.err, ErrUnknownBundle) || errors.Is(h.err, ErrNotReady):
		ps.have, ps.known, ps.seed = NewHave(s.pl.N()), true, false
		ps.gone = errors.Is(h.err, ErrUnknownBundle)
	case errors.Is(h.err, ErrUnauthorized):
		s.drop(h.peer, "it refused our token: set the same token_file on every node")
	case s.ctx.Err() != nil:
	default:
		ps.known = false
		s.backoff(ps, h.err)
	}
}

// ticked polls the peers again, gives up a withdrawn bundle and keeps
// the resume record about once a second; an error ends the fetch.
func (s *scheduler) ticked(now time.Time) error {
	s.poll()
	if s.withdrawn(now) {
		return fmt.Errorf("%w: %s: no peer offers it any more while its source was still reading it (the read failed or the digest did not match); nothing fetched is kept", ErrWithdrawn, s.digest)
	}
	if s.dirty && time.Since(s.lastSave) >= time.Second {
		if err := s.saveState(); err != nil {
			return fmt.Errorf("peer fetch %s: save resume record %s: %w", s.digest, StatePath(s.dest), err)
		}
		s.dirty, s.lastSave = false, time.Now()
	}
	return nil
}

// advance moves the held prefix on and tells the consumer.
func (s *scheduler) advance() {
	for s.front < s.pl.N() && s.mine.Has(s.front) {
		s.front++
	}
	s.c.advance(s.front)
}

// report tells progress what is held, and by whom.
func (s *scheduler) report() {
	if s.progress == nil {
		return
	}
	p := Progress{Digest: s.digest, Total: s.pl.Size, PiecesTotal: s.pl.N()}
	for i := 0; i < s.pl.N(); i++ {
		if s.mine.Has(i) {
			_, n := s.pl.Bounds(i)
			p.Done += n
			p.Pieces++
		}
	}
	for _, ps := range s.peers {
		if ps.inflight > 0 {
			p.Peers++
		}
		if ps.dropped {
			p.Dropped = append(p.Dropped, ps.addr)
		}
	}
	sort.Strings(p.Dropped)
	s.progress(p)
}

// withdrawnAfter is how long every peer must have stopped offering a
// bundle whose list still grows before the fetch gives it up: longer than
// a source agent's restart, which offers it again.
var withdrawnAfter = 5 * time.Second

// withdrawn reports whether every peer still used has said, for
// withdrawnAfter, that it does not hold a bundle whose piece list is
// still partial: its source withdrew it.
func (s *scheduler) withdrawn(now time.Time) bool {
	all := s.pl.Partial
	for _, ps := range s.peers {
		all = all && (ps.dropped || ps.gone)
	}
	if !all {
		s.goneSince = time.Time{}
		return false
	}
	if s.goneSince.IsZero() {
		s.goneSince = now
	}
	return now.Sub(s.goneSince) >= withdrawnAfter
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
	j.shelf.pieces(m)
}

func (j *job) backoff(ps *peerState, err error) {
	ps.fails++
	d := min(250*time.Millisecond<<min(ps.fails-1, 8), 15*time.Second)
	ps.retryAt = time.Now().Add(d)
	j.f.log.Info("peer fetch: peer failed; retrying later", "peer", ps.addr, "digest", j.digest, "retry_in", d, "err", err)
}
