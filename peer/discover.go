package peer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// Discover asks every peer at once what it serves. It returns every offer
// received, sorted by peer, and the peers that could not be asked (joined;
// nil when all answered). Apply approval and arch checks to an offer's
// Metadata before fetching it.
func (f *Fetcher) Discover(ctx context.Context) ([]PeerOffer, error) {
	return f.DiscoverFrom(ctx, f.Peers())
}

// DiscoverFrom is Discover of the peers named (a sample of them: the
// agent's poll asks a bounded number each round).
func (f *Fetcher) DiscoverFrom(ctx context.Context, peers []string) ([]PeerOffer, error) {
	var (
		mu   sync.Mutex
		out  []PeerOffer
		errs []error
		wg   sync.WaitGroup
	)
	for _, p := range peers {
		wg.Go(func() {
			o, err := f.c.Offers(ctx, p)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			for _, x := range o {
				if sha256digest.Valid(x.Digest) && x.Size > 0 {
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
	return f.StatusesOf(ctx, f.Peers())
}

// StatusesOf is Statuses of the peers named.
func (f *Fetcher) StatusesOf(ctx context.Context, peers []string) map[string]PeerStatus {
	var (
		mu  sync.Mutex
		out = map[string]PeerStatus{}
		wg  sync.WaitGroup
	)
	for _, p := range peers {
		wg.Go(func() {
			st := f.c.status(ctx, p)
			mu.Lock()
			out[p] = st
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
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
		complete := map[string]bool{}
		for _, o := range offers {
			if o.Digest != j.digest || j.peers[o.Peer] == nil || j.peers[o.Peer].dropped {
				continue
			}
			complete[o.Peer] = o.Complete
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
		j.boundSources(best.peers, complete)
		return nil
	}
}

// maxSources bounds the peers one fetch asks for pieces and polls for
// what they hold (every Refresh): with every peer a source, N fetching
// nodes would poll each other N×(N−1) times a Refresh. Pieces still
// spread through the whole cluster: every node serves what it fetched to
// those that chose it.
const maxSources = 8

// boundSources keeps at most maxSources of the fetch's peers: those that
// hold the bundle whole first (complete), then those that hold the piece
// list (holders), then others, at random within each, which will hold
// pieces as they fetch too.
func (j *job) boundSources(holders []string, complete map[string]bool) {
	if len(j.peers) <= maxSources {
		return
	}
	rank := func(p string) int {
		switch {
		case j.peers[p].dropped:
			return 3
		case complete[p]:
			return 0
		case slices.Contains(holders, p):
			return 1
		}
		return 2
	}
	all := slices.Collect(maps.Keys(j.peers))
	rand.Shuffle(len(all), func(a, b int) { all[a], all[b] = all[b], all[a] })
	slices.SortStableFunc(all, func(a, b string) int { return rank(a) - rank(b) })
	for _, p := range all[maxSources:] {
		delete(j.peers, p)
	}
}

// vote is the peers that gave one piece list (or lists that agree on
// every piece they both know: a live source's list grows).
type vote struct {
	pl       *PieceList
	meta     []byte
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
