package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/bundletest"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/freeport"
)

// A hostile peer (issue 34, finding 1): a real peer server offers a bundle
// whose metadata claims 1 MiB, and serves a tar of 48 MiB. A real agent
// fetching it writes no more than the offer admitted, refuses it at the
// first entry or at the first file past that bound, and keeps nothing.
func TestHost_APeerThatLiesAboutItsBundleFillsNothing(t *testing.T) {
	const claimed = 1 << 20
	bigTar, _ := bundletest.Write(t, t.TempDir(), bundletest.Options{LayerSize: 48 << 20})
	real, err := bundle.InspectFile(bigTar)
	if err != nil {
		t.Fatal(err)
	}
	small := *real
	small.SizeBytes = claimed

	for _, tc := range []struct {
		name   string
		tar    func() []byte // what the peer serves
		saying string        // what the refusal says
	}{
		// The tar's own metadata.json says 48 MiB: once the bound of the
		// writes (then 48 MiB), now refused before anything is written.
		{"metadata unlike the offer's", func() []byte { return readAll(t, bigTar) }, "is not what the offer it was fetched on said"},
		// The tar's metadata.json says 1 MiB as the offer does; its files
		// do not.
		{"files past the size both claim", func() []byte { return withMetadata(t, bigTar, &small) }, "add up to more than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			served := tc.tar()
			digest := fmt.Sprintf("sha256:%x", sha256.Sum256(served))
			addr, sent := lyingPeer(t, digest, &small, served)

			cfg := ferryenv.Config(t.TempDir())
			cfg.NodeName = "victim"
			cfg.Peer.Listen, cfg.Peer.Peers, cfg.Peer.Open = freeport.Addr(t), []string{addr}, true
			stop := make(chan struct{})
			var peak atomic.Int64
			go func() {
				for {
					select {
					case <-stop:
						return
					case <-time.After(2 * time.Millisecond):
					}
					if n := du(cfg.Paths.ExtractDir); n > peak.Load() {
						peak.Store(n)
					}
				}
			}()
			a := ferryenv.Start(t, cfg)
			s := a.Wait(bound, "the lying peer's bundle refused", func(s agent.Status) bool {
				return s.Phase == string(agent.PhaseRejected)
			})
			close(stop)
			if !strings.Contains(s.Message, tc.saying) {
				t.Errorf("the refusal does not say %q: %s", tc.saying, s.Message)
			}
			t.Logf("refused: %s: %s; the peer sent %d bytes; the tree peaked at %d bytes", s.Reason, s.Message, sent.Load(), peak.Load())
			if p := peak.Load(); p > claimed+64<<10 {
				t.Errorf("%d bytes written to the extracted tree, past the %d the offer admitted", p, claimed)
			}
			if n := du(cfg.Paths.ExtractDir); n != 0 {
				t.Errorf("%d bytes left under %s after the refusal", n, cfg.Paths.ExtractDir)
			}
			if n := du(filepath.Join(cfg.Paths.StateDir, "incoming")); n != 0 {
				t.Errorf("%d bytes of the fetch left after the refusal", n)
			}
		})
	}
}

// lyingPeer serves served as the bundle digest, offered with meta.
func lyingPeer(t *testing.T, d string, meta *bundle.Metadata, served []byte) (string, *atomic.Int64) {
	t.Helper()
	mb, err := json.Marshal(meta)
	if err != nil {
		t.Fatal(err)
	}
	shelf := peer.NewShelf(peer.ShelfOptions{})
	t.Cleanup(func() { shelf.Close() })
	if err := shelf.Add(digest.Digest(d), mb, bytes.NewReader(served), int64(len(served))); err != nil {
		t.Fatal(err)
	}
	srv := peer.NewServer(shelf, peer.ServerOptions{Status: func() peer.Status {
		return peer.Status{Node: "liar", Phase: string(agent.PhaseExtracted), Digest: digest.Digest(d), Version: meta.Version}
	}})
	var sent atomic.Int64
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		srv.ServeHTTP(countingWriter{w, &sent}, r)
	})}
	go hs.Serve(l)
	t.Cleanup(func() { hs.Close() })
	return l.Addr().String(), &sent
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// withMetadata is the tar at path with its metadata.json replaced by meta.
func withMetadata(t *testing.T, path string, meta *bundle.Metadata) []byte {
	t.Helper()
	mb, err := json.Marshal(meta)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body := io.Reader(tr)
		if hdr.Name == bundle.MetadataName {
			hdr.Size, body = int64(len(mb)), bytes.NewReader(mb)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func readAll(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// du is the bytes of the regular files under dir (0 when absent).
func du(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
