package peer

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
)

func TestServer_Routes(t *testing.T) {
	data, digest := randomBundle(t, 3*testPieceSize+100)
	n := newSource(t, data, digest, ServerOptions{Status: func() Status { return Status{Node: "a", Phase: "loaded", Digest: digest} }})
	base := n.srv.URL
	tests := []struct {
		name   string
		path   string
		hdr    map[string]string
		code   int
		body   []byte // checked when set
		crange string // Content-Range, checked when set
	}{
		{name: "metadata is served as held", path: "/v1/bundles/" + string(digest) + "/metadata", code: 200, body: []byte(testMeta)},
		{name: "whole tar without a range", path: "/v1/bundles/" + string(digest) + "/tar", code: 200, body: data},
		{name: "one range", path: "/v1/bundles/" + string(digest) + "/tar", hdr: map[string]string{"Range": "bytes=10-19"}, code: 206, body: data[10:20], crange: fmt.Sprintf("bytes 10-19/%d", len(data))},
		{name: "range across a read buffer", path: "/v1/bundles/" + string(digest) + "/tar", hdr: map[string]string{"Range": "bytes=1-"}, code: 206, body: data[1:]},
		{name: "suffix range", path: "/v1/bundles/" + string(digest) + "/tar", hdr: map[string]string{"Range": "bytes=-5"}, code: 206, body: data[len(data)-5:]},
		{name: "several ranges are refused with 416", path: "/v1/bundles/" + string(digest) + "/tar", hdr: map[string]string{"Range": "bytes=0-1,4-5"}, code: 416, crange: fmt.Sprintf("bytes */%d", len(data))},
		{name: "a range past the end is refused with 416", path: "/v1/bundles/" + string(digest) + "/tar", hdr: map[string]string{"Range": fmt.Sprintf("bytes=%d-", len(data))}, code: 416},
		{name: "an unknown digest is 404", path: "/v1/bundles/sha256:" + strings.Repeat("0", 64) + "/tar", code: 404},
		{name: "a non-digest is 400", path: "/v1/bundles/sha256:..%2f..%2fetc%2fpasswd/tar", code: 400},
		{name: "a path outside the API is 404", path: "/etc/passwd", code: 404},
		{name: "status comes from the agent", path: "/v1/status", code: 200, body: []byte(`{"node":"a","phase":"loaded","digest":"` + digest + `"}`)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := get(t, base+tc.path, tc.hdr)
			if resp.StatusCode != tc.code {
				t.Fatalf("GET %s: %d %s, want %d", tc.path, resp.StatusCode, b, tc.code)
			}
			if tc.body != nil && !bytes.Equal(b, tc.body) {
				t.Fatalf("GET %s: body of %d bytes differs from the %d expected", tc.path, len(b), len(tc.body))
			}
			if tc.crange != "" && resp.Header.Get("Content-Range") != tc.crange {
				t.Fatalf("Content-Range %q, want %q", resp.Header.Get("Content-Range"), tc.crange)
			}
		})
	}
}

func TestServer_ListPiecesAndHave(t *testing.T) {
	data, digest := randomBundle(t, 3*testPieceSize+100)
	n := newSource(t, data, digest, ServerOptions{})
	c := NewClient("", nil)
	offers, err := c.Offers(t.Context(), n.addr)
	if err != nil {
		t.Fatal(err)
	}
	want := Offer{Digest: digest, Metadata: []byte(testMeta), Size: int64(len(data)), PieceSize: testPieceSize, Complete: true}
	if len(offers) != 1 || fmt.Sprint(offers[0]) != fmt.Sprint(want) {
		t.Fatalf("offers %+v, want [%+v]", offers, want)
	}
	p, err := c.Pieces(t.Context(), n.addr, digest, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(p) != fmt.Sprint(listFor(data, testPieceSize)) {
		t.Fatalf("piece list %+v differs from one computed here", p)
	}
	h, err := c.Have(t.Context(), n.addr, digest)
	if err != nil || h.Count() != 4 || h.Pieces != 4 {
		t.Fatalf("have %+v, %v: want all 4 pieces", h, err)
	}
}

// slowReader blocks reads until released, so the piece list stays "being
// hashed".
type slowReader struct {
	io.ReaderAt
	release chan struct{}
}

func (s *slowReader) ReadAt(b []byte, off int64) (int, error) {
	<-s.release
	return s.ReaderAt.ReadAt(b, off)
}

func TestServer_PiecesNotReadyWhileHashing(t *testing.T) {
	data, digest := randomBundle(t, 2*testPieceSize)
	n := newNode(t, ServerOptions{}, nil)
	sr := &slowReader{ReaderAt: bytes.NewReader(data), release: make(chan struct{})}
	if err := n.shelf.Add(digest, []byte(testMeta), sr, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"pieces", "have"} {
		resp, b := get(t, n.srv.URL+"/v1/bundles/"+string(digest)+"/"+p, nil)
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("%s while hashing: %d %s, want 503 with Retry-After", p, resp.StatusCode, b)
		}
	}
	close(sr.release)
	if _, err := n.shelf.WaitPieces(t.Context(), digest); err != nil {
		t.Fatal(err)
	}
	if resp, b := get(t, n.srv.URL+"/v1/bundles/"+string(digest)+"/pieces", nil); resp.StatusCode != 200 {
		t.Fatalf("pieces after hashing: %d %s", resp.StatusCode, b)
	}
}

func TestShelf_RefusesReaderThatIsNotTheBundle(t *testing.T) {
	data, digest := randomBundle(t, 2*testPieceSize)
	n := newNode(t, ServerOptions{}, nil)
	wrong := append([]byte(nil), data...)
	wrong[7] ^= 1
	if err := n.shelf.Add(digest, []byte(testMeta), bytes.NewReader(wrong), int64(len(wrong))); err != nil {
		t.Fatal(err)
	}
	if _, err := n.shelf.WaitPieces(t.Context(), digest); !errors.Is(err, ErrUnknownBundle) {
		t.Fatalf("WaitPieces: %v, want ErrUnknownBundle (not served)", err)
	}
	if resp, _ := get(t, n.srv.URL+"/v1/bundles/"+string(digest)+"/tar", nil); resp.StatusCode != 404 {
		t.Fatalf("tar of a bundle whose bytes do not match: %d, want 404", resp.StatusCode)
	}
}

// countingReader counts reads.
type countingReader struct {
	io.ReaderAt
	n int
}

func (c *countingReader) ReadAt(b []byte, off int64) (int, error) {
	c.n++
	return c.ReaderAt.ReadAt(b, off)
}

func TestShelf_CachedPieceListSkipsHashing(t *testing.T) {
	for _, tc := range []struct{ name, sub string }{
		{"cache dir exists", ""},
		{"cache dir not made yet", "state/pieces"}, // as the agent passes it on a first start
	} {
		t.Run(tc.name, func(t *testing.T) { testCachedPieceList(t, filepath.Join(t.TempDir(), tc.sub)) })
	}
}

func testCachedPieceList(t *testing.T, dir string) {
	data, digest := randomBundle(t, 3*testPieceSize)
	s1 := NewShelf(ShelfOptions{PieceSize: testPieceSize, CacheDir: dir})
	defer s1.Close()
	if err := s1.Add(digest, []byte(testMeta), bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	p1, err := s1.WaitPieces(t.Context(), digest)
	if err != nil {
		t.Fatal(err)
	}
	s1.Close() // waits for the cache write
	s2 := NewShelf(ShelfOptions{PieceSize: testPieceSize, CacheDir: dir})
	defer s2.Close()
	cr := &countingReader{ReaderAt: bytes.NewReader(data)}
	if err := s2.Add(digest, []byte(testMeta), cr, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	p2, err := s2.Pieces(digest)
	if err != nil || fmt.Sprint(p1) != fmt.Sprint(p2) || cr.n != 0 {
		t.Fatalf("after restart: %v, %v, %d reads; want the cached list and no reads", p2, err, cr.n)
	}
}

func TestServer_Token(t *testing.T) {
	data, digest := randomBundle(t, testPieceSize)
	n := newSource(t, data, digest, ServerOptions{Token: "s3cret"})
	for _, tc := range []struct {
		name string
		auth string
		code int
	}{
		{"right token", "Bearer s3cret", 200},
		{"no token", "", 401},
		{"wrong token", "Bearer s3cre", 401},
		{"token without scheme", "s3cret", 401},
		{"longer token", "Bearer s3cretx", 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{}
			if tc.auth != "" {
				hdr["Authorization"] = tc.auth
			}
			for _, p := range []string{"/v1/bundles", "/v1/bundles/" + string(digest) + "/tar"} {
				if resp, b := get(t, n.srv.URL+p, hdr); resp.StatusCode != tc.code {
					t.Fatalf("GET %s: %d %s, want %d", p, resp.StatusCode, b, tc.code)
				}
			}
		})
	}
	if _, err := NewClient("wrong", nil).Offers(t.Context(), n.addr); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("client with a wrong token: %v, want ErrUnauthorized", err)
	}
	if _, err := NewClient("s3cret", nil).Offers(t.Context(), n.addr); err != nil {
		t.Fatalf("client with the token: %v", err)
	}
}

func TestServer_StatusWithoutCallbackIs404(t *testing.T) {
	n := newNode(t, ServerOptions{}, nil)
	if resp, _ := get(t, n.srv.URL+"/v1/status", nil); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("status: %d, want 404", resp.StatusCode)
	}
	if resp, b := get(t, n.srv.URL+"/v1/bundles", nil); resp.StatusCode != 200 || string(b) != "[]" {
		t.Fatalf("empty list: %d %s, want 200 []", resp.StatusCode, b)
	}
}

// failingReader fails every read: what AddHashed must not do is read.
type failingReader struct{ reads atomic.Int64 }

func (f *failingReader) ReadAt([]byte, int64) (int, error) {
	f.reads.Add(1)
	return 0, errors.New("read")
}

func TestShelf_AddHashedServesItsListAtOnceWithoutReading(t *testing.T) {
	data, digest := randomBundle(t, 3*testPieceSize+5)
	pl := listFor(data, testPieceSize)
	s := NewShelf(ShelfOptions{PieceSize: testPieceSize})
	defer s.Close()
	r := &failingReader{}
	if err := s.AddHashed(digest, []byte(testMeta), r, pl); err != nil {
		t.Fatal(err)
	}
	got, err := s.Pieces(digest)
	if err != nil || !slices.Equal(got.Pieces, pl.Pieces) {
		t.Fatalf("Pieces right after AddHashed: %v, %v", got, err)
	}
	if h, err := s.Have(digest); err != nil || h.Count() != pl.N() {
		t.Fatalf("Have: %+v, %v; want all %d pieces", h, err, pl.N())
	}
	time.Sleep(50 * time.Millisecond)
	if n := r.reads.Load(); n != 0 {
		t.Fatalf("AddHashed read the bundle %d times to hash it again", n)
	}
	other := *pl
	other.Digest = sha256Of(strings.Repeat("0", 64))
	if err := s.AddHashed(digest, []byte(testMeta), r, &other); err == nil {
		t.Fatal("a piece list for another digest was accepted")
	}
}

func TestServer_ClosedWithoutATokenServesNothing(t *testing.T) {
	data := []byte("bundle bytes")
	sum := sha256.Sum256(data)
	digest := digest.Digest("sha256:" + hex.EncodeToString(sum[:]))
	n := newNode(t, ServerOptions{Closed: true, Status: func() Status { return Status{Node: "a"} }}, nil)
	n.hold(t, data, digest)
	for _, p := range []string{"/v1/bundles", "/v1/bundles/" + string(digest) + "/tar", "/v1/status"} {
		resp, body := get(t, n.srv.URL+p, nil)
		if resp.StatusCode != 401 || !strings.Contains(string(body), "token_file") {
			t.Errorf("%s: %d %q, want 401 naming token_file", p, resp.StatusCode, body)
		}
	}
	open := newNode(t, ServerOptions{Status: func() Status { return Status{Node: "b"} }}, nil)
	if resp, _ := get(t, open.srv.URL+"/v1/status", nil); resp.StatusCode != 200 {
		t.Errorf("an open server (peer.open = true) answers %d", resp.StatusCode)
	}
}
