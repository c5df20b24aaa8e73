package agent

import "github.com/ferry-edge/ferry/agent/machine"
import "sync"

// handles keeps what the machine names by id: open media and the channels
// callers wait on. Callers' goroutines add; the loop takes.
type handles struct {
	mu      sync.Mutex
	next    uint64
	media   map[machine.MediumID]Medium
	replies map[machine.ReplyID]chan error
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
