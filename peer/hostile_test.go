package peer

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
)

// serveReal runs the real Serve (its listener, limits and deadlines, not
// httptest's) for data on 127.0.0.1.
func serveReal(t *testing.T, data []byte, digest digest.Digest, opts ServerOptions) string {
	t.Helper()
	shelf := NewShelf(ShelfOptions{PieceSize: testPieceSize})
	if err := shelf.Add(digest, []byte(testMeta), strings.NewReader(string(data)), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if _, err := shelf.WaitPieces(t.Context(), digest); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- NewServer(shelf, opts).Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-done
		shelf.Close()
	})
	return ln.Addr().String()
}

// clientFrom is a peer client whose connections come from the loopback
// address local (a node other than the hog's).
func clientFrom(local string) *Client {
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return NewClient("", &http.Client{Transport: &http.Transport{DialContext: d.DialContext, ResponseHeaderTimeout: 15 * time.Second}})
}

// hog holds as many connections to addr as it can from 127.0.0.1, sending
// nothing, and opens a new one whenever one is closed, until ctx ends.
func hog(ctx context.Context, t *testing.T, addr string, conns int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					time.Sleep(10 * time.Millisecond)
					continue
				}
				go func() { <-ctx.Done(); c.Close() }()
				io.Copy(io.Discard, c) // until the server closes it
				c.Close()
			}
		}()
	}
	return &wg
}

// refusals counts the server's log lines saying it closed a connection
// from client because that client already held its share
// (MaxConnsPerClient): each one shows the client holding the whole share
// at that moment.
type refusals struct {
	client string
	n      atomic.Int64
}

func (r *refusals) Enabled(context.Context, slog.Level) bool { return true }
func (r *refusals) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *refusals) WithGroup(string) slog.Handler            { return r }
func (r *refusals) Handle(_ context.Context, rec slog.Record) error {
	if !strings.Contains(rec.Message, "too many connections from one client") {
		return nil
	}
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "client" && a.Value.String() == r.client {
			r.n.Add(1)
		}
		return true
	})
	return nil
}

// A client that opens connection after connection and sends nothing (no
// token needed for that) keeps only its own share: a node fetching from
// another address is served at once, while the hog holds its share (the
// server turns its further connections away before and after the fetch).
func TestServer_AConnectionHoggingClientDoesNotStarveAFetch(t *testing.T) {
	data, digest := randomBundle(t, 3*testPieceSize+7)
	hogged := &refusals{client: "127.0.0.1"}
	// A header deadline past the test's end: the hog's share is never
	// freed by it while the fetch runs.
	addr := serveReal(t, data, digest, ServerOptions{MaxConns: 16, MaxConnsPerClient: 4, HeaderTimeout: time.Minute, Log: slog.New(hogged)})
	ctx, cancel := context.WithCancel(t.Context())
	wg := hog(ctx, t, addr, 64)
	defer func() { cancel(); wg.Wait() }()
	waitHogged := func(than int64) int64 {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for hogged.n.Load() <= than {
			if time.Now().After(deadline) {
				t.Fatalf("the hog never held its share of the server's connections (%d refusals); nothing was proven", hogged.n.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
		return hogged.n.Load()
	}
	before := waitHogged(0)

	dest := filepath.Join(t.TempDir(), "b.tar")
	fctx, fcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer fcancel()
	f := fastFetcher([]string{addr}, FetcherOptions{Client: clientFrom("127.0.0.2")})
	if err := f.Fetch(fctx, digest, dest, nil); err != nil {
		t.Fatalf("a legitimate fetch while one client hogs connections: %v", err)
	}
	checkFile(t, dest, data)
	waitHogged(before) // still holding its share after the fetch
}

// A client that drips its request's headers is cut off by the header
// deadline: it holds a connection for HeaderTimeout, not forever.
func TestServer_ASlowDripClientIsCutOffByTheHeaderDeadline(t *testing.T) {
	data, digest := randomBundle(t, testPieceSize)
	addr := serveReal(t, data, digest, ServerOptions{HeaderTimeout: 300 * time.Millisecond})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	closed := make(chan struct{})
	go func() {
		io.Copy(io.Discard, c)
		close(closed)
	}()
	req := "GET /v1/bundles HTTP/1.1\r\nHost: x\r\n"
	for i := 0; ; i++ {
		select {
		case <-closed:
			if d := time.Since(start); d > 3*time.Second {
				t.Fatalf("dripping client held its connection %s", d)
			}
			return
		case <-time.After(100 * time.Millisecond):
		}
		if _, err := c.Write([]byte{req[i%len(req)]}); err != nil {
			return // closed by the server
		}
		if time.Since(start) > 5*time.Second {
			t.Fatal("a client dripping its headers still holds its connection after 5s")
		}
	}
}

// dripper sends a tar body a few bytes at a time: alive (never idle for
// the idle timeout), never done.
func dripper(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/tar") {
			h.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(&dripWriter{ResponseWriter: w, ctx: r.Context()}, r)
	})
}

type dripWriter struct {
	http.ResponseWriter
	ctx context.Context
}

func (d *dripWriter) Write(b []byte) (int, error) {
	for i := range b {
		if _, err := d.ResponseWriter.Write(b[i : i+1]); err != nil {
			return i, err
		}
		d.ResponseWriter.(http.Flusher).Flush()
		select {
		case <-time.After(20 * time.Millisecond):
		case <-d.ctx.Done():
			return i + 1, d.ctx.Err()
		}
	}
	return len(b), nil
}

func (d *dripWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{d}, r)
}

// A peer that drips a piece's bytes (the real server, its body slowed)
// does not hold that piece forever: under the minimum rate the range is
// dropped and the piece fetched from another peer.
func TestFetch_APeerThatDripsAPieceLosesItToAnother(t *testing.T) {
	data, digest := randomBundle(t, 4*testPieceSize+11)
	slow := newNode(t, ServerOptions{}, dripper)
	slow.hold(t, data, digest)
	good := newSource(t, data, digest, ServerOptions{})
	c := NewClient("", nil)
	c.SetMinRate(64<<10, 300*time.Millisecond)
	dest := filepath.Join(t.TempDir(), "b.tar")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	start := time.Now()
	if err := fastFetcher([]string{slow.addr, good.addr}, FetcherOptions{Client: c}).Fetch(ctx, digest, dest, nil); err != nil {
		t.Fatal(err)
	}
	checkFile(t, dest, data)
	if slow.reqs.get("/v1/bundles/"+string(digest)+"/tar") == 0 {
		t.Fatal("the dripping peer was never asked: the test proves nothing")
	}
	t.Logf("fetched in %s despite a dripping peer", time.Since(start))
}

// The minimum rate, alone: a range dripped under it ends with ErrTooSlow.
func TestClient_ARangeUnderTheMinimumRateIsDropped(t *testing.T) {
	data, digest := randomBundle(t, testPieceSize)
	slow := newNode(t, ServerOptions{}, dripper)
	slow.hold(t, data, digest)
	c := NewClient("", nil)
	c.SetMinRate(64<<10, 200*time.Millisecond)
	start := time.Now()
	err := c.CopyRange(t.Context(), slow.addr, digest, 0, testPieceSize, io.Discard)
	if err == nil || !strings.Contains(err.Error(), ErrTooSlow.Error()) {
		t.Fatalf("err %v, want %v", err, ErrTooSlow)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("dropped after %s", d)
	}
}
