package peer

import (
	"slices"
	"sort"
	"time"
)

// assignment is one piece request to start.
type assignment struct {
	peer      string
	piece     int
	firstCopy bool // ask for a first copy (FirstCopyHeader)
}

// assign hands out work, given the requests in flight: each peer with a
// free slot gets the rarest piece it has that nobody is fetching yet. A
// seed (a peer holding every piece) is asked only for pieces no other
// fetcher holds or is fetching (nor refused as sent elsewhere, until
// when), so its uplink carries each piece about once; the others come
// from the fetchers. Only a fetcher that would otherwise sit idle takes a
// second copy from a seed. Pieces past the consumer's window are not
// asked for yet. It marks what it assigns in inflight and in the peers'
// counts.
func (s *scheduler) assign(now time.Time) []assignment {
	opts := s.f.opts
	parallel := opts.Parallel
	if opts.Pacer != nil {
		parallel = opts.Pacer.Workers(parallel) // fewer in flight while the node stalls
	}
	rarity, nearby := s.supply()
	for i, until := range s.sentElsewhere {
		if now.Before(until) {
			nearby[i] = true
		} else {
			delete(s.sentElsewhere, i)
		}
	}
	order := make([]*peerState, 0, len(s.peers))
	for _, ps := range s.peers {
		order = append(order, ps)
	}
	s.rnd.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
	// Pieces nobody can give yet (digest unknown: the source has not read
	// them) or beyond a stream's window count as taken.
	taken := slices.Clone(s.inflight)
	limit := s.c.limit()
	for i := range taken {
		taken[i] = taken[i] || i >= limit || s.pl.Partial && !s.pl.Known(i)
	}
	var out []assignment
	for _, idle := range []bool{false, true} {
		if idle && s.requests+len(out) > 0 {
			break
		}
		for progressMade := true; progressMade && s.requests+len(out) < parallel; {
			progressMade = false
			sort.SliceStable(order, func(a, b int) bool { return order[a].inflight < order[b].inflight })
			for _, ps := range order {
				if s.requests+len(out) >= parallel {
					break
				}
				if ps.dropped || !ps.known || ps.inflight >= opts.PerPeer || now.Before(ps.retryAt) {
					continue
				}
				var avoid []bool
				if ps.seed && !idle {
					avoid = nearby
				}
				i := pickPiece(s.mine, taken, ps.have, rarity, avoid)
				if i < 0 {
					continue
				}
				s.inflight[i], taken[i] = true, true
				ps.inflight++
				progressMade = true
				out = append(out, assignment{peer: ps.addr, piece: i, firstCopy: avoid != nil})
			}
		}
	}
	return out
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
