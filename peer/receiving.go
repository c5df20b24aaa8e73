package peer

import "io"

// receiving is a fetch's handle on the shelf entry of the bundle it
// receives, as a LiveHasher is a stick pass's: the only way to change
// that entry. Once the entry is replaced or removed, it changes nothing.
// A nil handle (a fetcher without a shelf) does nothing.
type receiving struct {
	s *Shelf
	e *entry
}

// addPartial serves a bundle being fetched into r: only the pieces in
// have, and those the handle marks held later.
func (s *Shelf) addPartial(o Offer, r io.ReaderAt, p *PieceList, have Have) *receiving {
	e := newEntry(stateFetching, o, r, p, func() {})
	e.have = have.Clone()
	s.put(o.Digest, e)
	return &receiving{s: s, e: e}
}

// update runs f on the entry while it is still its bundle's.
func (h *receiving) update(f func(e *entry)) {
	if h == nil {
		return
	}
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	if h.s.entries[h.e.offer.Digest] == h.e {
		f(h.e)
	}
}

// pending marks piece i as being fetched, or not.
func (h *receiving) pending(i int, on bool) { h.update(func(e *entry) { e.pending(i, on) }) }

// piece marks piece i verified: it is served from now on.
func (h *receiving) piece(i int) { h.update(func(e *entry) { e.held(i, true) }) }

// drop marks piece i no longer held: a stream extracted it and freed
// its bytes.
func (h *receiving) drop(i int) { h.update(func(e *entry) { e.held(i, false) }) }

// pieces gives the entry the piece list the fetch has learned so far (a
// fetch from a live source), so that other fetchers learn it here too.
func (h *receiving) pieces(pl *PieceList) { h.update(func(e *entry) { e.grew(pl) }) }

// complete makes the entry whole: every piece and the digest checked.
func (h *receiving) complete() { h.update(func(e *entry) { e.move(stateWhole) }) }

// fetched keeps pl, checked against the whole digest by a streaming
// fetch, for the Add of the extracted bundle that follows (the list peers
// already use); the entry serves nothing until then: its bytes are gone.
func (h *receiving) fetched(pl *PieceList) { h.update(func(e *entry) { e.listed(pl) }) }

// cancel withdraws the entry and closes its reader: the fetch failed.
func (h *receiving) cancel() {
	if h != nil {
		h.s.removeEntry(h.e)
	}
}
