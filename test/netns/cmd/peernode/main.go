// Command peernode is a test stand-in for a ferry agent's peer side: it
// serves a bundle file it holds, or fetches one from its peers and then
// serves it, or (-proxy) relays another node's peer port flipping bytes of
// every tar body. It reports what it does in a JSON status file the test
// polls, since tests cannot reach the network namespaces it runs in.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/peer"
)

// Report is the status file's content.
type Report struct {
	Node        string        `json:"node"`
	Phase       string        `json:"phase"` // starting, ready (holds whole), fetching, error
	Digest      digest.Digest `json:"digest,omitempty"`
	Done        int64         `json:"done"`
	Total       int64         `json:"total"`
	Pieces      int           `json:"pieces"`
	StartPieces int           `json:"startPieces"` // pieces held when fetching began (resume)
	Dropped     []string      `json:"dropped,omitempty"`
	Seconds     float64       `json:"seconds,omitempty"` // fetch time, once ready
	Error       string        `json:"error,omitempty"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "peernode:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		node      = flag.String("node", "", "node name")
		listen    = flag.String("listen", ":8090", "peer server address")
		peers     = flag.String("peers", "", "comma-separated peer addresses")
		token     = flag.String("token", "", "bearer token")
		hold      = flag.String("hold", "", "serve this bundle file (whole)")
		fetch     = flag.String("fetch", "", "fetch this digest from the peers")
		dest      = flag.String("dest", "", "file to fetch into")
		status    = flag.String("status", "", "JSON status file to keep up to date")
		pieceSize = flag.Int64("piece-size", peer.DefaultPieceSize, "piece size published for -hold")
		proxy     = flag.String("proxy", "", "relay to this peer address instead, flipping a byte of every tar body")
		perPeer   = flag.Int("per-peer", 0, "piece requests in flight per peer (0: default)")
		parallel  = flag.Int("parallel", 0, "piece requests in flight in all (0: default)")
		refresh   = flag.Duration("refresh", 0, "peer bitmap poll interval (0: default)")
		noReserve = flag.Bool("no-reserve", false, "do not serve pieces before the bundle is whole")
	)
	flag.Parse()
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("NODE", *node)

	var mu sync.Mutex
	rep := Report{Node: *node, Phase: "starting"}
	save := func(f func(*Report)) {
		mu.Lock()
		defer mu.Unlock()
		f(&rep)
		if *status == "" {
			return
		}
		b, _ := json.Marshal(rep)
		tmp := *status + ".tmp"
		if os.WriteFile(tmp, b, 0o644) == nil {
			os.Rename(tmp, *status)
		}
	}
	save(func(*Report) {})

	if *proxy != "" {
		return serveProxy(ctx, *listen, *proxy, log, save)
	}

	shelf := peer.NewShelf(peer.ShelfOptions{PieceSize: *pieceSize, Log: log})
	defer shelf.Close()
	srv := peer.NewServer(shelf, peer.ServerOptions{Token: *token, Log: log, Status: func() peer.Status {
		mu.Lock()
		defer mu.Unlock()
		return peer.Status{Node: *node, Phase: rep.Phase, Digest: rep.Digest}
	}})
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe(ctx, *listen) }()

	switch {
	case *hold != "":
		f, err := os.Open(*hold)
		if err != nil {
			return err
		}
		fi, _ := f.Stat()
		digest, err := fileDigest(f)
		if err != nil {
			return err
		}
		if err := shelf.Add(digest, []byte(`{"formatVersion":1,"version":"0.0.0","arch":"x86_64"}`), f, fi.Size()); err != nil {
			return err
		}
		if _, err := shelf.WaitPieces(ctx, digest); err != nil {
			return err
		}
		save(func(r *Report) { r.Phase, r.Digest, r.Done, r.Total = "ready", digest, fi.Size(), fi.Size() })
		log.Info("holding bundle", "DIGEST", digest)
	case *fetch != "":
		var list []string
		if *peers != "" {
			list = strings.Split(*peers, ",")
		}
		opts := peer.FetcherOptions{Peers: list, Token: *token, Log: log, Shelf: shelf, PerPeer: *perPeer, Parallel: *parallel, Refresh: *refresh}
		if *noReserve {
			opts.Shelf = nil
		}
		f := peer.NewFetcher(opts)
		start := time.Now()
		first := true
		save(func(r *Report) { r.Phase, r.Digest = "fetching", digest.Digest(*fetch) })
		err := f.Fetch(ctx, digest.Digest(*fetch), *dest, func(p peer.Progress) {
			save(func(r *Report) {
				if first {
					r.StartPieces, first = p.Pieces, false
				}
				r.Done, r.Total, r.Pieces, r.Dropped = p.Done, p.Total, p.Pieces, p.Dropped
			})
		})
		if err != nil {
			save(func(r *Report) { r.Phase, r.Error = "error", err.Error() })
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		save(func(r *Report) { r.Phase, r.Seconds = "ready", time.Since(start).Seconds() })
		log.Info("fetched bundle", "DIGEST", *fetch, "SECONDS", time.Since(start).Seconds())
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

func fileDigest(f *os.File) (digest.Digest, error) {
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, 1<<62)); err != nil {
		return "", err
	}
	return digest.FromSHA256(h.Sum(nil)), nil
}

// serveProxy relays to upstream, flipping one byte in every tar body.
func serveProxy(ctx context.Context, listen, upstream string, log *slog.Logger, save func(func(*Report))) error {
	u, err := url.Parse("http://" + upstream)
	if err != nil {
		return err
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(r *http.Response) error {
		if strings.HasSuffix(r.Request.URL.Path, "/tar") && r.StatusCode/100 == 2 {
			r.Body = &flipBody{ReadCloser: r.Body}
		}
		return nil
	}
	hs := &http.Server{Addr: listen, Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		hs.Close()
	}()
	save(func(r *Report) { r.Phase = "proxying" })
	log.Info("flipping proxy", "LISTEN", listen, "UPSTREAM", upstream)
	if err := hs.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

type flipBody struct {
	io.ReadCloser
	done bool
}

func (f *flipBody) Read(b []byte) (int, error) {
	n, err := f.ReadCloser.Read(b)
	if n > 0 && !f.done {
		b[n/2] ^= 0xff
		f.done = true
	}
	return n, err
}
