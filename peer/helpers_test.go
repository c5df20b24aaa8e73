package peer

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/ferry-edge/ferry/internal/digest"
)

// testPieceSize keeps unit-test bundles small but many-pieced.
const testPieceSize = MinPieceSize

func randomBundle(t *testing.T, size int) ([]byte, digest.Digest) {
	t.Helper()
	b := make([]byte, size)
	r := rand.New(rand.NewPCG(uint64(size), 42))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b, digest.Digest("sha256:" + sum(b))
}

const testMeta = `{"formatVersion":1,"version":"4.13.7","arch":"x86_64"}`

// node is one in-process peer: a shelf behind a real HTTP server.
type node struct {
	shelf *Shelf
	srv   *httptest.Server
	addr  string
	reqs  *counter
}

type counter struct {
	mu sync.Mutex
	m  map[string]int // path → requests
}

func (c *counter) add(p string) {
	c.mu.Lock()
	c.m[p]++
	c.mu.Unlock()
}

func (c *counter) get(p string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[p]
}

// newNode serves shelf (a new one if nil) with opts; wrap, if set, sits in
// front of the server's handler.
func newNode(t *testing.T, opts ServerOptions, wrap func(http.Handler) http.Handler) *node {
	t.Helper()
	n := &node{shelf: NewShelf(ShelfOptions{PieceSize: testPieceSize}), reqs: &counter{m: map[string]int{}}}
	var h http.Handler = NewServer(n.shelf, opts)
	if wrap != nil {
		h = wrap(h)
	}
	inner := h
	h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.reqs.add(r.URL.Path)
		inner.ServeHTTP(w, r)
	})
	n.srv = httptest.NewServer(h)
	n.addr = strings.TrimPrefix(n.srv.URL, "http://")
	t.Cleanup(func() {
		n.srv.Close()
		n.shelf.Close()
	})
	return n
}

// newSource is a node holding data whole, its piece list computed.
func newSource(t *testing.T, data []byte, digest digest.Digest, opts ServerOptions) *node {
	t.Helper()
	n := newNode(t, opts, nil)
	n.hold(t, data, digest)
	return n
}

func (n *node) hold(t *testing.T, data []byte, digest digest.Digest) {
	t.Helper()
	if err := n.shelf.Add(digest, []byte(testMeta), bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if _, err := n.shelf.WaitPieces(t.Context(), digest); err != nil {
		t.Fatal(err)
	}
}

// flipper corrupts one byte of every tar body it passes on.
func flipper(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/tar") {
			h.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(&flipWriter{ResponseWriter: w}, r)
	})
}

type flipWriter struct {
	http.ResponseWriter
	done bool
}

func (f *flipWriter) Write(b []byte) (int, error) {
	if !f.done && len(b) > 0 {
		c := append([]byte(nil), b...)
		c[len(c)/2] ^= 0x55
		f.done = true
		return f.ResponseWriter.Write(c)
	}
	return f.ResponseWriter.Write(b)
}

func get(t *testing.T, url string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// sha256Of is the digest "sha256:"+hexd, for tests whose digest variable
// hides the package.
func sha256Of(hexd string) digest.Digest { return digest.Digest("sha256:" + hexd) }
