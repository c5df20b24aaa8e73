package agent

import "sync"

// handles keeps what the machine names by id: open media and the channels
// callers wait on. Callers' goroutines add; the loop takes.
type handles struct {
	mu      sync.Mutex
	next    uint64
	media   map[MediumID]Medium
	replies map[ReplyID]chan error
}

func (h *handles) newID() uint64 {
	h.next++
	return h.next
}

// addMedium keeps m and names it; nil is 0.
func (h *handles) addMedium(m Medium) MediumID {
	if m == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.media == nil {
		h.media = map[MediumID]Medium{}
	}
	id := MediumID(h.newID())
	h.media[id] = m
	return id
}

// medium is the medium named id, still kept.
func (h *handles) medium(id MediumID) Medium {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.media[id]
}

// takeMedium forgets the medium named id and returns it (nil if none).
func (h *handles) takeMedium(id MediumID) Medium {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.media[id]
	delete(h.media, id)
	return m
}

// addReply makes the channel a caller waits on for its answer.
func (h *handles) addReply() (ReplyID, chan error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.replies == nil {
		h.replies = map[ReplyID]chan error{}
	}
	id, ch := ReplyID(h.newID()), make(chan error, 1)
	h.replies[id] = ch
	return id, ch
}

// takeReply forgets the channel named id and returns it (nil if none).
func (h *handles) takeReply(id ReplyID) chan error {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := h.replies[id]
	delete(h.replies, id)
	return ch
}
