package peer

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

func TestFirstCopies(t *testing.T) {
	var f firstCopies
	t0 := time.Now()
	const d = "sha256:" + "ab"
	if !f.begin(d, 3, t0) {
		t.Fatal("the first claim of a piece was refused")
	}
	if f.begin(d, 3, t0) {
		t.Fatal("a second first copy of a piece being sent was allowed")
	}
	if !f.begin(d, 4, t0) || !f.begin("sha256:cd", 3, t0) {
		t.Fatal("another piece, or the same piece of another bundle, was refused")
	}
	f.end(d, 4, false, t0) // not sent whole: free again at once
	if !f.begin(d, 4, t0) {
		t.Fatal("a piece whose send failed cannot be claimed again")
	}
	f.end(d, 3, true, t0)
	if f.begin(d, 3, t0.Add(firstCopyWindow/2)) {
		t.Fatal("a piece just sent was sent again as a first copy")
	}
	if !f.begin(d, 3, t0.Add(firstCopyWindow)) {
		t.Fatal("a piece sent a window ago is still refused")
	}
}

// gatedReader blocks the first read of piece 0 after arm, until release.
type gatedReader struct {
	io.ReaderAt
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (g *gatedReader) ReadAt(b []byte, off int64) (int, error) {
	if off < testPieceSize && g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		<-g.release
	}
	return g.ReaderAt.ReadAt(b, off)
}

func TestServer_FirstCopyIsRefusedWhileThePieceIsOnItsWay(t *testing.T) {
	data, digest := randomBundle(t, 4*testPieceSize)
	n := newNode(t, ServerOptions{}, nil)
	g := &gatedReader{ReaderAt: bytes.NewReader(data), entered: make(chan struct{}), release: make(chan struct{})}
	if err := n.shelf.Add(digest, []byte(testMeta), g, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if _, err := n.shelf.WaitPieces(t.Context(), digest); err != nil {
		t.Fatal(err)
	}
	c := NewClient("", nil)
	copyPiece := func(i int, first bool) error {
		var buf bytes.Buffer
		err := c.copyRange(t.Context(), n.addr, digest, int64(i)*testPieceSize, testPieceSize, &buf, first)
		if err == nil && !bytes.Equal(buf.Bytes(), data[i*testPieceSize:(i+1)*testPieceSize]) {
			return errors.New("wrong bytes")
		}
		return err
	}
	g.armed.Store(true)
	sent := make(chan error, 1)
	go func() { sent <- copyPiece(0, true) }()
	<-g.entered // piece 0 is on its way to the first fetcher

	if err := copyPiece(0, true); !errors.Is(err, ErrSentElsewhere) {
		t.Fatalf("first copy of a piece being sent: %v, want ErrSentElsewhere", err)
	}
	if err := copyPiece(0, false); err != nil {
		t.Fatalf("plain request for a piece being sent: %v, want it served", err)
	}
	if err := copyPiece(1, true); err != nil {
		t.Fatalf("first copy of another piece: %v, want it served", err)
	}
	close(g.release)
	if err := <-sent; err != nil {
		t.Fatalf("the first fetcher's copy: %v", err)
	}
	if err := copyPiece(0, true); !errors.Is(err, ErrSentElsewhere) {
		t.Fatalf("first copy of a piece just sent: %v, want ErrSentElsewhere", err)
	}
}

func TestPrefixHash(t *testing.T) {
	data, digest := randomBundle(t, 5*testPieceSize+77)
	pl := listFor(data, testPieceSize)
	p := startPrefixHash(t.Context(), bytes.NewReader(data), pl)
	p.advance(2)
	p.advance(1) // never goes back
	p.advance(pl.N())
	got, err := p.sum()
	if err != nil || got != digest {
		t.Fatalf("sum = %s, %v; want %s", got, err, digest)
	}
	p.stop()

	q := startPrefixHash(t.Context(), bytes.NewReader(data), pl)
	q.advance(3)
	q.stop()
	if _, err := q.sum(); err == nil {
		t.Fatal("sum of a hash stopped before the last piece did not fail")
	}
}

// TestFetch_SeedSendsEachPieceAboutOnce: three fetchers, fetching from a
// slow seed and from each other, take their pieces from each other rather
// than a second copy from the seed.
func TestFetch_SeedSendsEachPieceAboutOnce(t *testing.T) {
	const pieces = 48
	data, digest := randomBundle(t, pieces*testPieceSize)
	var served atomic.Int64
	slow := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Range") != "" {
				time.Sleep(15 * time.Millisecond) // the seed's uplink is the bottleneck
			}
			sw := &statusWriter{ResponseWriter: w}
			h.ServeHTTP(sw, r)
			if sw.code == http.StatusPartialContent {
				served.Add(1)
			}
		})
	}
	seed := newNode(t, ServerOptions{}, slow)
	seed.hold(t, data, digest)
	fetchers := []*node{newNode(t, ServerOptions{}, nil), newNode(t, ServerOptions{}, nil), newNode(t, ServerOptions{}, nil)}
	errs := make(chan error, len(fetchers))
	dests := make([]string, len(fetchers))
	for i, f := range fetchers {
		peers := []string{seed.addr}
		for _, o := range fetchers {
			if o != f {
				peers = append(peers, o.addr)
			}
		}
		dests[i] = filepath.Join(t.TempDir(), "b.tar")
		go func() {
			errs <- fastFetcher(peers, FetcherOptions{Shelf: f.shelf}).Fetch(t.Context(), digest, dests[i], nil)
		}()
	}
	for range fetchers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range dests {
		checkFile(t, d, data)
	}
	// a star would be 3 copies; allow a few second copies at the end
	if got := served.Load(); got > pieces*3/2 {
		t.Fatalf("the seed served %d pieces for a %d-piece bundle and 3 fetchers (%.2f copies), want about one copy",
			got, pieces, float64(got)/pieces)
	} else {
		t.Logf("the seed served %.2f copies", float64(got)/pieces)
	}
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}
