package peer_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/ferry-edge/ferry/peer"
)

// How a node agent wires the package: one shelf, served on the peer port;
// bundles it verified from a stick go on the shelf; a bundle it does not
// hold is discovered, checked, fetched (re-served while it arrives) and
// then extracted as from a stick.
func Example() {
	ctx := context.Background()
	log := slog.Default()
	stateDir := "/var/lib/ferry"
	var (
		token  = ""                                          // from token_file
		peers  = []string{"10.0.0.2:8090"}                   // config peer.peers
		status = func() peer.Status { return peer.Status{} } // the agent's phase, digest, node name
	)

	shelf := peer.NewShelf(peer.ShelfOptions{CacheDir: filepath.Join(stateDir, "pieces"), Log: log})
	defer shelf.Close()
	srv := peer.NewServer(shelf, peer.ServerOptions{Token: token, Status: status, Log: log})
	go srv.ListenAndServe(ctx, ":8090") // in the agent's errgroup

	// A bundle verified and extracted from a stick: serve it.
	var tarBytes io.ReaderAt // from the bundle package (regenerated tar or file)
	var size int64
	_ = shelf.Add("sha256:…", []byte(`{"version":"4.13.7"}`), tarBytes, size)

	// A node without the bundle.
	f := peer.NewFetcher(peer.FetcherOptions{Peers: peers, Token: token, Shelf: shelf, Log: log})
	offers, err := f.Discover(ctx) // err: peers that did not answer, for the log
	_ = err
	for _, o := range offers {
		// Same approval and arch checks as for a stick, on o.Metadata and
		// o.Digest; also compare digests between offers (two bundles is a
		// conflict: the agent decides).
		dest := filepath.Join(stateDir, "incoming", o.Digest.Encoded()+".tar")
		err := f.Fetch(ctx, o.Digest, dest, func(p peer.Progress) {
			log.Info("fetching", "DONE", p.Done, "TOTAL", p.Total, "PEERS", p.Peers)
		})
		switch {
		case err == nil:
			// bundle.Extract(dest) as from a stick; then shelf.Add the
			// extracted bundle's reader (replacing the file) and remove dest.
		case errors.Is(err, peer.ErrDigestMismatch), errors.Is(err, peer.ErrNoPeers):
			// report, retry later (dest was reset on a mismatch)
		}
		break
	}

	// Every node's status, polled every few seconds: the agent's cluster
	// gate (agent.Decide) reads them.
	for range time.Tick(5 * time.Second) {
		for addr, st := range f.Statuses(ctx) {
			log.Info("peer", "addr", addr, "phase", st.Phase, "digest", st.Digest, "err", st.Err)
		}
	}
}
