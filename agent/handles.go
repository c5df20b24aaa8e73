package agent

import (
	"sync"

	"github.com/ferry-edge/ferry/agent/machine"
	"github.com/ferry-edge/ferry/peer"
)

// handles keeps what the machine names by id, or does not see at all:
// open media, the channels callers wait on, the piece lists jobs hashed.
// Callers' goroutines and jobs add; the loop takes.
type handles struct {
	mu      sync.Mutex
	next    uint64
	media   map[machine.MediumID]Medium
	replies map[machine.ReplyID]chan error
	// pieces are the piece lists a job hashed, by record, until shared.
	pieces map[string]*peer.PieceList
}

func (h *handles) newID() uint64 {
	h.next++
	return h.next
}

// addMedium keeps m and names it; nil is 0.
func (h *handles) addMedium(m Medium) machine.MediumID {
	if m == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.media == nil {
		h.media = map[machine.MediumID]Medium{}
	}
	id := machine.MediumID(h.newID())
	h.media[id] = m
	return id
}

// medium is the medium named id, still kept.
func (h *handles) medium(id machine.MediumID) Medium {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.media[id]
}

// takeMedium forgets the medium named id and returns it (nil if none).
func (h *handles) takeMedium(id machine.MediumID) Medium {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.media[id]
	delete(h.media, id)
	return m
}

// addReply makes the channel a caller waits on for its answer.
func (h *handles) addReply() (machine.ReplyID, chan error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.replies == nil {
		h.replies = map[machine.ReplyID]chan error{}
	}
	id, ch := machine.ReplyID(h.newID()), make(chan error, 1)
	h.replies[id] = ch
	return id, ch
}

// takeReply forgets the channel named id and returns it (nil if none).
func (h *handles) takeReply(id machine.ReplyID) chan error {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := h.replies[id]
	delete(h.replies, id)
	return ch
}

// setPieces keeps the piece list the job on record id hashed (nil: none).
func (h *handles) setPieces(id string, pl *peer.PieceList) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if pl == nil {
		delete(h.pieces, id)
		return
	}
	if h.pieces == nil {
		h.pieces = map[string]*peer.PieceList{}
	}
	h.pieces[id] = pl
}

// takePieces forgets and returns the piece list kept for record id.
func (h *handles) takePieces(id string) *peer.PieceList {
	h.mu.Lock()
	defer h.mu.Unlock()
	pl := h.pieces[id]
	delete(h.pieces, id)
	return pl
}
