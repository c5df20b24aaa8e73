package peer

import (
	"context"
	"io"
	"slices"
)

// entryState is what a shelf entry serves. An entry is created in one
// (Add, AddHashed, AddLive, addPartial), moves only as next allows, and
// is otherwise only replaced or removed.
type entryState int

const (
	// stateHashing: a whole bundle whose piece list is being computed:
	// offered, its pieces not ready yet.
	stateHashing entryState = iota
	// stateWhole: a whole bundle with its piece list: every piece served.
	stateWhole
	// stateBroken: a whole bundle whose bytes did not hash to its digest
	// (or to the list it was fetched with): not served.
	stateBroken
	// stateLive: read from a stick (cut-through, AddLive): each piece is
	// served once the extraction pass has hashed it.
	stateLive
	// stateFetching: being fetched (addPartial): each piece is served
	// once verified, until the stream frees it.
	stateFetching
	// stateListed: fetched and extracted (FetchStream): serves nothing,
	// keeps the piece list peers use for the Add that follows.
	stateListed
)

// next is every move out of a state.
var next = map[entryState][]entryState{
	stateHashing:  {stateWhole, stateBroken},
	stateWhole:    {stateBroken}, // read back, it differs from the list it was fetched with
	stateFetching: {stateWhole, stateListed},
}

// complete reports whether the entry's bytes are the whole bundle
// (Offer.Complete), served or not.
func (st entryState) complete() bool {
	return st == stateHashing || st == stateWhole || st == stateBroken
}

// entry is one bundle on the shelf. The shelf's lock guards it.
type entry struct {
	state  entryState
	offer  Offer // Complete follows state
	r      io.ReaderAt
	pieces *PieceList // nil while hashing
	have   Have       // live and fetching: pieces held; Pending: in flight
	cancel context.CancelFunc
}

func newEntry(st entryState, o Offer, r io.ReaderAt, pieces *PieceList, cancel context.CancelFunc) *entry {
	o.Complete = st.complete()
	e := &entry{state: st, offer: o, r: r, pieces: pieces, cancel: cancel}
	if !o.Complete {
		e.have = NewHave(pieces.N())
		e.offer.PieceSize = pieces.PieceSize
	}
	return e
}

// move makes to e's state if next allows it; false: refused.
func (e *entry) move(to entryState) bool {
	if !slices.Contains(next[e.state], to) {
		return false
	}
	e.state = to
	e.offer.Complete = to.complete()
	return true
}

// hashed gives a hashing entry the list computed from its bytes.
func (e *entry) hashed(p *PieceList) {
	if e.state == stateHashing && e.move(stateWhole) {
		e.pieces = p
	}
}

// learned serves piece i of a live entry, whose digest is sum. The list
// is replaced, never changed in place: the server encodes it unlocked.
func (e *entry) learned(i int, sum string) {
	if e.state != stateLive || i >= e.pieces.N() {
		return // bytes past the medium's end
	}
	pl := e.pieces.clone()
	pl.Pieces[i] = sum
	pl.Partial = slices.Contains(pl.Pieces, "")
	e.pieces = pl
	e.have.Set(i)
}

// pending marks piece i of a fetching entry as in flight, or not.
func (e *entry) pending(i int, on bool) {
	if e.state != stateFetching || i >= e.have.Pieces {
		return
	}
	if e.have.Pending == nil {
		e.have.Pending = make([]byte, len(e.have.Bits))
	}
	if on {
		e.have.Pending[i/8] |= 1 << (i % 8)
	} else {
		e.have.Pending[i/8] &^= 1 << (i % 8)
	}
}

// held marks piece i of a fetching entry verified, or (on false) no
// longer held: a stream extracted it and freed its bytes.
func (e *entry) held(i int, on bool) {
	if e.state != stateFetching || i >= e.have.Pieces {
		return
	}
	if on {
		e.have.Set(i)
	} else {
		e.have.unset(i)
	}
}

// grew gives a fetching entry the list its fetch has learned so far (from
// a live source), so that other fetchers learn it here too.
func (e *entry) grew(pl *PieceList) {
	if e.state == stateFetching && e.pieces.N() == pl.N() {
		e.pieces = pl
	}
}

// listed keeps pl, checked against the whole digest by a streaming
// fetch, in an entry whose bytes are gone: it serves nothing.
func (e *entry) listed(pl *PieceList) {
	if e.move(stateListed) {
		e.pieces, e.have = pl, NewHave(pl.N())
	}
}
