//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/freeport"
)

// source starts the node that holds the bundle (given with `ferry load`)
// and serves it to its peers on 127.0.0.1.
func source(t *testing.T, tarPath string, digest digest.Digest, blobs int) (*node, string) {
	t.Helper()
	cfg := ferryenv.Config(t.TempDir())
	cfg.NodeName = "source"
	addr := "127.0.0.1:" + strconv.Itoa(freeport.Port(t, "127.0.0.1"))
	cfg.Peer.Open = true // loopback only: no token file
	cfg.Peer.Listen = addr
	a := ferryenv.Start(t, cfg)
	n := &node{a: a, cfg: cfg, digest: digest, wantBlobs: blobs}
	if _, err := waitFor(a, bound, "idle", phaseIs("idle")); err != nil {
		t.Fatal(err)
	}
	if err := ferry(a, "load", tarPath); err != nil {
		t.Fatal(err)
	}
	if err := n.converged(t.Context(), agent.PhaseExtracted); err != nil {
		t.Fatal(err)
	}
	return n, addr
}

// fetcher starts a fresh node on another loopback address whose peers are
// peers: it has no bundle, so it fetches one from them.
func fetcher(t *testing.T, i int, peers []string, digest digest.Digest, blobs int) *node {
	t.Helper()
	cfg := ferryenv.Config(t.TempDir())
	cfg.NodeName = "fetcher-" + strconv.Itoa(i)
	cfg.Peer.Open = true // loopback only: no token file
	cfg.Peer.Listen = "127.0.0.2:" + strconv.Itoa(freeport.Port(t, "127.0.0.2"))
	cfg.Peer.Peers = peers
	a := ferryenv.Start(t, cfg)
	return &node{a: a, cfg: cfg, digest: digest, wantBlobs: blobs}
}

// TestFaults_KillDuringFetch: a node fetches the bundle from a peer (two
// agents on loopback) and is killed -9 at a random point of the fetch or
// of the extraction that follows; after a restart it ends extracted with
// the right digest and a complete tree.
func TestFaults_KillDuringFetch(t *testing.T) {
	needRoot(t)
	c := newCampaign(t, "kill-fetch")
	tarPath, digest, blobs := bigBundle(t, 512, 8)
	_, src := source(t, tarPath, digest, blobs)

	// One clean run gives the span to draw kill points from: from the
	// start of the fetch to the end of the extraction that follows.
	first := fetcher(t, 0, []string{src}, digest, blobs)
	if err := first.converged(t.Context(), agent.PhaseExtracted); err != nil {
		t.Fatal(err)
	}
	s, err := first.a.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	span := s.Times[agent.PhaseExtracted].Sub(s.Times[agent.PhaseFetching])
	first.a.Stop()
	t.Logf("fetching 512 MiB from a peer and extracting it took %s", span)
	if span <= 0 {
		t.Fatalf("no fetch span in the status times %v", s.Times)
	}

	r := rng(t)
	for i := 1; i <= trials("kill-fetch", 15); i++ {
		c.trial(i, func() error {
			n := fetcher(t, i, []string{src}, digest, blobs)
			defer func() { n.a.Stop(); os.RemoveAll(n.cfg.Paths.ExtractDir); os.RemoveAll(n.cfg.Paths.StateDir) }()
			if _, err := waitFor(n.a, bound, "the fetch to start", phaseIs(agent.PhaseFetching)); err != nil {
				return err
			}
			at := randomPoint(r, span)
			time.Sleep(at)
			s, _ := n.a.Status(t.Context())
			n.a.Kill()
			if err := n.invariants(t.Context()); err != nil {
				return fmt.Errorf("killed %s in (%s): %w", at, s.Phase, err)
			}
			n.a.Restart()
			if err := n.converged(t.Context(), agent.PhaseExtracted); err != nil {
				return fmt.Errorf("killed %s in (%s), after restart: %w", at, s.Phase, err)
			}
			t.Logf("trial %d: killed %s in, while %s", i, at.Round(time.Millisecond), s.Phase)
			return nil
		})
	}
}

// TestFaults_PeerServesWrongBytes: a proxy in front of the source flips a
// byte in every tar body it relays. A node whose only peer is the liar
// never extracts anything and says why; a node that also has the honest
// source drops the liar and ends extracted with the right digest. The
// honest source answers no tar request until the liar has served one, so
// that the liar is always asked: a trial in which it was not fails.
func TestFaults_PeerServesWrongBytes(t *testing.T) {
	needRoot(t)
	c := newCampaign(t, "peer-wrong-bytes")
	tarPath, digest, blobs := bigBundle(t, 128, 4)
	_, src := source(t, tarPath, digest, blobs)
	liar, lied := flippingProxy(t, src)

	for i := range trials("peer-wrong-bytes", 2) {
		c.trial(2*i, func() error {
			n := fetcher(t, 2*i, []string{liar}, digest, blobs)
			defer n.a.Stop()
			before := lied.Load()
			s, err := waitFor(n.a, bound, "the fetch to fail", func(s agent.Status) bool {
				return lied.Load() > before && s.Reason == agent.ReasonFetchFailed || s.Phase == string(agent.PhaseExtracted)
			})
			if err != nil {
				return err
			}
			if s.Phase == string(agent.PhaseExtracted) {
				return errors.New("extracted a bundle whose only peer lies")
			}
			t.Logf("only the liar: %s: %s", s.Phase, s.Reason)
			if ents, _ := os.ReadDir(n.cfg.Paths.ExtractDir); len(ents) != 0 {
				return fmt.Errorf("the extract dir holds %s", ents[0].Name())
			}
			return n.invariants(t.Context())
		})
		c.trial(2*i+1, func() error {
			before := lied.Load()
			honest := heldUntil(t, src, func() bool { return lied.Load() > before })
			n := fetcher(t, 2*i+1, []string{liar, honest}, digest, blobs)
			defer n.a.Stop()
			if err := n.converged(t.Context(), agent.PhaseExtracted); err != nil {
				return err
			}
			if lied.Load() == before {
				return fmt.Errorf("trial %d: the liar was never asked for a piece: nothing was proven", 2*i+1)
			}
			return nil
		})
	}
}

// flippingProxy relays addr's peer API, flipping one byte of every tar
// body; it returns its address and a count of bodies it corrupted.
func flippingProxy(t *testing.T, addr string) (string, *atomic.Int64) {
	t.Helper()
	target, _ := url.Parse("http://" + addr)
	var lied atomic.Int64
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = func(resp *http.Response) error {
		if strings.HasSuffix(resp.Request.URL.Path, "/tar") && resp.StatusCode/100 == 2 {
			lied.Add(1)
			resp.Body = &flipper{ReadCloser: resp.Body}
		}
		return nil
	}
	ln, err := net.Listen("tcp", "127.0.0.3:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rp}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return ln.Addr().String(), &lied
}

// heldUntil relays addr's peer API, holding each tar request until open
// reports true (or its client goes); it returns its address.
func heldUntil(t *testing.T, addr string, open func() bool) string {
	t.Helper()
	target, _ := url.Parse("http://" + addr)
	rp := httputil.NewSingleHostReverseProxy(target)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for strings.HasSuffix(r.URL.Path, "/tar") && !open() {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		rp.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.4:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return ln.Addr().String()
}

// flipper flips the 100th byte of a body.
type flipper struct {
	io.ReadCloser
	off int64
}

func (f *flipper) Read(p []byte) (int, error) {
	n, err := f.ReadCloser.Read(p)
	if f.off <= 100 && f.off+int64(n) > 100 {
		p[100-f.off] ^= 0xff
	}
	f.off += int64(n)
	return n, err
}
