package agent

import (
	"context"
	"github.com/ferry-edge/ferry/agent/machine"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/pull/pullspec"
)

// Peers is the agent's view of the other nodes (peer.Shelf + peer.Fetcher).
type Peers interface {
	// Share serves a verified bundle's tar bytes to the peers, with its
	// signature (nil for none); pieces, when not nil, is its piece list as
	// hashed in the extraction pass.
	Share(digest digest.Digest, meta, sig []byte, r io.ReaderAt, size int64, pieces *peer.PieceList) error
	Unshare(digest digest.Digest)
	Discover(ctx context.Context) ([]peer.PeerOffer, error)
	Fetch(ctx context.Context, digest digest.Digest, dest string, progress func(peer.Progress)) error
	// ShareLive offers a bundle while this node reads it from its stick
	// (cut-through): pieces are served as the returned hasher, the
	// extraction pass's Tee, hashes them; Close withdraws the offer.
	ShareLive(digest digest.Digest, meta, sig []byte, r io.ReaderAt, size int64) (*peer.LiveHasher, error)
	// FetchStream fetches a bundle into consume, an extraction, as its
	// bytes arrive, holding at most window bytes of it in dest.
	FetchStream(ctx context.Context, digest digest.Digest, dest string, window int64, progress func(peer.Progress), consume peer.StreamConsumer) (*peer.PieceList, error)
	Statuses(ctx context.Context) map[string]peer.PeerStatus
	// SetPeers replaces the peer list (found through the cluster's API).
	SetPeers(peers []string)
}

// pollPeers sends a view of the peers to the main loop every interval.
// With a peer set that can be asked in part (peer.Node), each round asks
// at most peerSample peers (peerPoller): a node's requests to its peers
// do not grow with the cluster's size.
func (a *Agent) pollPeers(ctx context.Context, interval time.Duration, out chan<- machine.View) {
	sampler, _ := a.deps.Peers.(peerSampler)
	var pp *peerPoller
	if sampler != nil {
		pp = newPeerPoller(peerSample)
	}
	for {
		pctx, cancel := context.WithTimeout(ctx, interval+5*time.Second)
		var v machine.View
		full := false
		if pp != nil {
			snap := a.snap.Load()
			v, full = pp.round(pctx, sampler, gateGoal(snap.peer, snap.excluded))
		} else {
			v.Offers, _ = a.deps.Peers.Discover(pctx)
			v.Statuses = a.deps.Peers.Statuses(pctx)
		}
		cancel()
		v.At = time.Now()
		a.notePeerNodes(v.Statuses)
		select {
		case out <- v:
		case <-ctx.Done():
			return
		}
		wait := interval
		if a.moving(v.Statuses) {
			wait = min(wait, movingPoll)
		}
		if full {
			// Every peer asked again while the answers say the gate may
			// open and it stays shut (it waits for something else):
			// less and less often.
			wait = max(wait, pp.fullWait())
		}
		// A node waiting for a peer to pull a release asks again as soon
		// as the cluster's API changes: the puller's UpgradeBundle entry
		// says when it holds the bundle (and, coarsely, how far it is).
		var apiChanged <-chan struct{}
		if a.deps.API != nil && a.awaitingSource.Load() {
			apiChanged = a.deps.API.Changes()
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-apiChanged:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// movingPoll is how often the peers are asked while a bundle moves
// between them: a node that waits for the others to hold it (the gate)
// or to offer it (a fetch) learns of it within this, not the idle poll's
// 2 s, which is most of the time a release takes past its copy over the
// site's link (make bench, P7). A few small requests a second to each
// peer, on the cluster's own network, for as long as it moves.
const movingPoll = 400 * time.Millisecond

// moving reports whether a bundle is on the move: this node or a peer is
// copying, fetching, extracting or loading one, or waits for the others
// to hold it, or this node pulls one from the registry.
func (a *Agent) moving(peers map[string]peer.PeerStatus) bool {
	inFlight := func(p string) bool {
		switch machine.Phase(p) {
		case machine.PhaseDetected, machine.PhaseFetching, machine.PhaseExtracted, machine.PhaseLoading:
			return true
		}
		return false
	}
	s := a.snap.Load().status
	if inFlight(s.Phase) || s.Pull != nil && s.Pull.State != pullspec.StateDone && s.Pull.State != pullspec.StateFailed {
		return true
	}
	for _, p := range peers {
		if p.Err == nil && inFlight(p.Phase) {
			return true
		}
	}
	return false
}

// PeerStatus is what this node tells its peers.
func (a *Agent) PeerStatus() peer.Status { return a.snap.Load().peer }

// Cluster reports every node's phase as last polled.
func (a *Agent) Cluster() machine.ClusterStatus { return a.snap.Load().cluster }

// logWriter sends a child's output to the log line by line.
type logWriter struct {
	log *slog.Logger
	buf []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			break
		}
		w.log.Info(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

func (w *logWriter) flush() {
	if len(w.buf) > 0 {
		w.log.Info(string(w.buf))
		w.buf = nil
	}
}
