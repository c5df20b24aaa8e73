package peer

import (
	"sync"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
)

// FirstCopyHeader on a piece request to a node holding the whole bundle
// asks for the piece only if the node is not already sending it, and did
// not just send it, to another fetcher: the fetcher would rather take it
// from that peer, so that the source's uplink, the fan-out's bottleneck,
// carries every piece about once. The answer is then 409 (ErrSentElsewhere).
const FirstCopyHeader = "Ferry-First-Copy"

// firstCopyWindow is how long after a piece was sent a first-copy request
// for it is still refused: long enough for the fetchers' next look at the
// receiver's bitmap.
const firstCopyWindow = time.Second

// firstCopies tracks the pieces a server is sending, or has just sent, as
// first copies.
type firstCopies struct {
	mu    sync.Mutex
	sends map[pieceKey]firstCopy
}

type pieceKey struct {
	digest digest.Digest
	piece  int
}

type firstCopy struct {
	active int       // requests sending it now
	sent   time.Time // when the last one completed
}

// begin claims piece for one first-copy request; false: it is on its way
// to, or just reached, another fetcher.
func (f *firstCopies) begin(digest digest.Digest, piece int, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sends == nil {
		f.sends = map[pieceKey]firstCopy{}
	}
	k := pieceKey{digest, piece}
	c := f.sends[k]
	if c.active > 0 || !c.sent.IsZero() && now.Sub(c.sent) < firstCopyWindow {
		return false
	}
	c.active++
	f.sends[k] = c
	return true
}

// end releases a claim. A piece whose body was not sent whole can be
// claimed again at once.
func (f *firstCopies) end(digest digest.Digest, piece int, whole bool, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := pieceKey{digest, piece}
	c := f.sends[k]
	c.active--
	if whole {
		c.sent = now
	}
	if c.active <= 0 && c.sent.IsZero() {
		delete(f.sends, k)
		return
	}
	f.sends[k] = c
	// Forget old sends now and then so the map stays as small as the
	// pieces in flight.
	if len(f.sends) > 1024 {
		for k, c := range f.sends {
			if c.active <= 0 && now.Sub(c.sent) >= firstCopyWindow {
				delete(f.sends, k)
			}
		}
	}
}
