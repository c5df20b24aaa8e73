package peer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
)

func fastFetcher(peers []string, opts FetcherOptions) *Fetcher {
	opts.Peers = peers
	if opts.Refresh == 0 {
		opts.Refresh = 20 * time.Millisecond
	}
	return NewFetcher(opts)
}

func checkFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s: %d bytes that differ from the bundle's %d", path, len(got), len(want))
	}
	if _, err := os.Stat(StatePath(path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("resume record left behind after success: %v", err)
	}
}

func TestFetch_FromOneSource(t *testing.T) {
	data, digest := randomBundle(t, 5*testPieceSize+123)
	src := newSource(t, data, digest, ServerOptions{})
	dest := filepath.Join(t.TempDir(), "b.tar")
	var last Progress
	if err := fastFetcher([]string{src.addr}, FetcherOptions{}).Fetch(t.Context(), digest, dest, func(p Progress) { last = p }); err != nil {
		t.Fatal(err)
	}
	checkFile(t, dest, data)
	if last.Done != int64(len(data)) || last.Pieces != 6 || last.PiecesTotal != 6 {
		t.Fatalf("last progress %+v, want all 6 pieces and %d bytes", last, len(data))
	}
}

func TestFetch_SpreadsOverEveryPeerThatHasPieces(t *testing.T) {
	data, digest := randomBundle(t, 40*testPieceSize)
	var peers []string
	var nodes []*node
	for i := 0; i < 3; i++ {
		n := newSource(t, data, digest, ServerOptions{})
		nodes = append(nodes, n)
		peers = append(peers, n.addr)
	}
	dest := filepath.Join(t.TempDir(), "b.tar")
	if err := fastFetcher(peers, FetcherOptions{}).Fetch(t.Context(), digest, dest, nil); err != nil {
		t.Fatal(err)
	}
	checkFile(t, dest, data)
	total := 0
	for i, n := range nodes {
		k := n.reqs.get("/v1/bundles/" + string(digest) + "/tar")
		if k == 0 {
			t.Errorf("peer %d served no piece: the fetcher did not spread its requests", i)
		}
		total += k
	}
	if total != 40 {
		t.Errorf("%d piece requests for 40 pieces: pieces were fetched twice", total)
	}
}

func TestFetch_ReservesVerifiedPiecesWhileFetching(t *testing.T) {
	data, digest := randomBundle(t, 8*testPieceSize)
	src := newSource(t, data, digest, ServerOptions{})
	b := newNode(t, ServerOptions{}, nil) // the fetching node's own server
	dest := filepath.Join(t.TempDir(), "b.tar")
	c := NewClient("", nil)
	checked := false
	var cerr error
	progress := func(p Progress) {
		if checked || p.Pieces < 3 {
			return
		}
		checked = true
		h, err := c.Have(context.Background(), b.addr, digest)
		if err != nil {
			cerr = err
			return
		}
		if h.Count() < 3 {
			cerr = errors.New("the fetching node's /have shows fewer pieces than it verified")
			return
		}
		for i := 0; i < h.Pieces; i++ {
			var buf bytes.Buffer
			err := c.CopyRange(context.Background(), b.addr, digest, int64(i)*testPieceSize, testPieceSize, &buf)
			switch {
			case h.Has(i) && (err != nil || !bytes.Equal(buf.Bytes(), data[i*testPieceSize:(i+1)*testPieceSize])):
				cerr = errors.Join(cerr, errors.New("a verified piece was not served right"), err)
			case !h.Has(i) && !errors.Is(err, ErrBadRange):
				cerr = errors.Join(cerr, errors.New("a piece not yet verified was served"), err)
			}
		}
	}
	f := fastFetcher([]string{src.addr}, FetcherOptions{Shelf: b.shelf, PerPeer: 1, Parallel: 1})
	if err := f.Fetch(t.Context(), digest, dest, progress); err != nil {
		t.Fatal(err)
	}
	if !checked || cerr != nil {
		t.Fatalf("checked=%v: %v", checked, cerr)
	}
	// Once fetched, the node serves the whole bundle; the source can go.
	src.srv.Close()
	dest2 := filepath.Join(t.TempDir(), "c.tar")
	if err := fastFetcher([]string{b.addr}, FetcherOptions{}).Fetch(t.Context(), digest, dest2, nil); err != nil {
		t.Fatalf("fetch from a node that fetched it: %v", err)
	}
	checkFile(t, dest2, data)
}

func TestFetch_DropsPeerThatServesBadPieces(t *testing.T) {
	data, digest := randomBundle(t, 30*testPieceSize)
	good := newSource(t, data, digest, ServerOptions{})
	bad := newNode(t, ServerOptions{}, flipper)
	bad.hold(t, data, digest)
	dest := filepath.Join(t.TempDir(), "b.tar")
	var last Progress
	if err := fastFetcher([]string{bad.addr, good.addr}, FetcherOptions{}).Fetch(t.Context(), digest, dest, func(p Progress) { last = p }); err != nil {
		t.Fatal(err)
	}
	checkFile(t, dest, data)
	if !slices.Equal(last.Dropped, []string{bad.addr}) {
		t.Fatalf("dropped %v, want only the flipping peer %s", last.Dropped, bad.addr)
	}
	if k := bad.reqs.get("/v1/bundles/" + string(digest) + "/tar"); k > 2 {
		t.Fatalf("the flipping peer got %d piece requests; it should be dropped after its first bad piece(s)", k)
	}
}

func TestFetch_EveryPeerBadIsAnError(t *testing.T) {
	data, digest := randomBundle(t, 4*testPieceSize)
	bad := newNode(t, ServerOptions{}, flipper)
	bad.hold(t, data, digest)
	err := fastFetcher([]string{bad.addr}, FetcherOptions{}).Fetch(t.Context(), digest, filepath.Join(t.TempDir(), "b.tar"), nil)
	if !errors.Is(err, ErrNoPeers) {
		t.Fatalf("fetch from a lying peer only: %v, want ErrNoPeers", err)
	}
}

// lyingStore claims a digest for bytes that are not that bundle, with a
// piece list that matches the bytes: only the final digest check sees it.
type lyingStore struct {
	digest digest.Digest
	data   []byte
}

func (s *lyingStore) Offers() []Offer {
	return []Offer{{Digest: s.digest, Metadata: []byte(testMeta), Size: int64(len(s.data)), PieceSize: testPieceSize, Complete: true}}
}

func (s *lyingStore) Open(digest.Digest) (io.ReaderAt, int64, error) {
	return bytes.NewReader(s.data), int64(len(s.data)), nil
}

func (s *lyingStore) Pieces(digest.Digest) (*PieceList, error) {
	p := listFor(s.data, testPieceSize)
	p.Digest = s.digest
	return p, nil
}

func (s *lyingStore) Have(digest.Digest) (Have, error) {
	return FullHave(NumPieces(int64(len(s.data)), testPieceSize)), nil
}

func TestFetch_LyingPieceListIsCaughtByTheWholeDigest(t *testing.T) {
	data, digest := randomBundle(t, 4*testPieceSize)
	other := append([]byte(nil), data...)
	other[5] ^= 1
	liar := newNodeWithStore(t, &lyingStore{digest: digest, data: other})
	dest := filepath.Join(t.TempDir(), "b.tar")
	shelf := NewShelf(ShelfOptions{})
	defer shelf.Close()
	err := fastFetcher([]string{liar}, FetcherOptions{Shelf: shelf}).Fetch(t.Context(), digest, dest, nil)
	if !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("fetch with a lying piece list: %v, want ErrDigestMismatch", err)
	}
	for _, p := range []string{dest, StatePath(dest)} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind after a digest mismatch: %v", p, err)
		}
	}
	if len(shelf.Offers()) != 0 {
		t.Errorf("the bad download is still offered to peers: %+v", shelf.Offers())
	}
}

func newNodeWithStore(t *testing.T, s Store) string {
	t.Helper()
	n := newNode(t, ServerOptions{}, func(http.Handler) http.Handler { return NewServer(s, ServerOptions{}) })
	return n.addr
}

func TestFetch_PieceListDisagreementDropsTheMinority(t *testing.T) {
	data, digest := randomBundle(t, 4*testPieceSize)
	other := append([]byte(nil), data...)
	other[5] ^= 1
	liar := newNodeWithStore(t, &lyingStore{digest: digest, data: other})
	a := newSource(t, data, digest, ServerOptions{})
	b := newSource(t, data, digest, ServerOptions{})
	dest := filepath.Join(t.TempDir(), "b.tar")
	var last Progress
	if err := fastFetcher([]string{liar, a.addr, b.addr}, FetcherOptions{}).Fetch(t.Context(), digest, dest, func(p Progress) { last = p }); err != nil {
		t.Fatal(err)
	}
	checkFile(t, dest, data)
	if !slices.Equal(last.Dropped, []string{liar}) {
		t.Fatalf("dropped %v, want the peer with the odd piece list %s", last.Dropped, liar)
	}
}

func TestFetch_ResumesAfterInterruption(t *testing.T) {
	data, digest := randomBundle(t, 20*testPieceSize)
	src := newSource(t, data, digest, ServerOptions{})
	dest := filepath.Join(t.TempDir(), "b.tar")
	ctx, cancel := context.WithCancel(t.Context())
	err := fastFetcher([]string{src.addr}, FetcherOptions{PerPeer: 1}).Fetch(ctx, digest, dest, func(p Progress) {
		if p.Pieces >= 7 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted fetch: %v, want context.Canceled", err)
	}
	j := &job{digest: digest, dest: dest}
	st, err := j.loadState()
	if err != nil {
		t.Fatalf("no resume record after interruption: %v", err)
	}
	held := st.Have.Count()
	if held < 7 || held >= 20 {
		t.Fatalf("resume record holds %d pieces, want 7..19", held)
	}
	src2 := newSource(t, data, digest, ServerOptions{}) // a fresh peer: count what the resumed fetch asks
	if err := fastFetcher([]string{src2.addr}, FetcherOptions{}).Fetch(t.Context(), digest, dest, nil); err != nil {
		t.Fatal(err)
	}
	checkFile(t, dest, data)
	if got := src2.reqs.get("/v1/bundles/" + string(digest) + "/tar"); got != 20-held {
		t.Fatalf("resumed fetch asked for %d pieces, want the %d missing ones", got, 20-held)
	}
	if src2.reqs.get("/v1/bundles/"+string(digest)+"/pieces") != 0 {
		t.Fatal("resumed fetch asked for the piece list again instead of using its record")
	}
}

// flaky refuses connections-worth of requests (500) for a while.
type flaky struct {
	mu   sync.Mutex
	fail int
}

func (f *flaky) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		bad := strings.HasSuffix(r.URL.Path, "/tar") && f.fail > 0
		if bad {
			f.fail--
		}
		f.mu.Unlock()
		if bad {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func TestFetch_RetriesAPeerThatFails(t *testing.T) {
	data, digest := randomBundle(t, 6*testPieceSize)
	fl := &flaky{fail: 3}
	src := newNode(t, ServerOptions{}, fl.wrap)
	src.hold(t, data, digest)
	dest := filepath.Join(t.TempDir(), "b.tar")
	var last Progress
	if err := fastFetcher([]string{src.addr}, FetcherOptions{}).Fetch(t.Context(), digest, dest, func(p Progress) { last = p }); err != nil {
		t.Fatal(err)
	}
	checkFile(t, dest, data)
	if len(last.Dropped) != 0 {
		t.Fatalf("a peer with passing failures was dropped: %v", last.Dropped)
	}
}

func TestFetch_WaitsForAPeerThatComesBack(t *testing.T) {
	data, digest := randomBundle(t, 6*testPieceSize)
	src := newSource(t, data, digest, ServerOptions{})
	later := newNode(t, ServerOptions{}, nil) // holds nothing yet
	dest := filepath.Join(t.TempDir(), "b.tar")
	havePath := "/v1/bundles/" + string(digest) + "/have"
	var wg sync.WaitGroup
	defer wg.Wait()
	var lost []string
	err := fastFetcher([]string{src.addr, later.addr}, FetcherOptions{PerPeer: 1, Parallel: 1}).Fetch(t.Context(), digest, dest, func(p Progress) {
		lost = append(lost, fmt.Sprint(p.Pieces))
		if p.Pieces != 2 {
			return
		}
		src.shelf.Remove(digest) // the source loses it...
		polls := later.reqs.get(havePath)
		wg.Go(func() {
			// ...and once the fetcher has looked elsewhere and found
			// nothing, another node gets it.
			for later.reqs.get(havePath) < polls+2 {
				<-afterPoll()
			}
			later.hold(t, data, digest)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	checkFile(t, dest, data)
	if k := later.reqs.get("/v1/bundles/" + string(digest) + "/tar"); k != 4 {
		t.Fatalf("the node that got the bundle later served %d pieces, want the 4 missing (%v)", k, lost)
	}
}

func TestFetch_TokenMismatchIsRefused(t *testing.T) {
	data, digest := randomBundle(t, 2*testPieceSize)
	src := newSource(t, data, digest, ServerOptions{Token: "right"})
	_, err := fastFetcher([]string{src.addr}, FetcherOptions{Token: "wrong"}).Discover(t.Context())
	if !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("discover with a wrong token: %v, want ErrUnauthorized", err)
	}
	err = fastFetcher([]string{src.addr}, FetcherOptions{Token: "wrong"}).Fetch(t.Context(), digest, filepath.Join(t.TempDir(), "b.tar"), nil)
	if !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("fetch with a wrong token: %v, want ErrUnauthorized", err)
	}
	if err := fastFetcher([]string{src.addr}, FetcherOptions{Token: "right"}).Fetch(t.Context(), digest, filepath.Join(t.TempDir(), "b.tar"), nil); err != nil {
		t.Fatalf("fetch with the right token: %v", err)
	}
}

func TestFetch_UnknownDigestIsNoPeers(t *testing.T) {
	data, digest := randomBundle(t, testPieceSize)
	src := newSource(t, data, digest, ServerOptions{})
	other := sha256Of(strings.Repeat("1", 64))
	err := fastFetcher([]string{src.addr}, FetcherOptions{}).Fetch(t.Context(), other, filepath.Join(t.TempDir(), "b.tar"), nil)
	if !errors.Is(err, ErrNoPeers) {
		t.Fatalf("fetch of a digest nobody has: %v, want ErrNoPeers", err)
	}
}

func TestPickPiece(t *testing.T) {
	h := func(n int, set ...int) Have {
		x := NewHave(n)
		for _, i := range set {
			x.Set(i)
		}
		return x
	}
	tests := []struct {
		name     string
		mine     Have
		inflight []int
		theirs   Have
		rarity   []int
		avoid    []bool
		want     int
	}{
		{name: "the rarest piece they have", mine: h(4), theirs: h(4, 0, 1, 2, 3), rarity: []int{3, 1, 2, 3}, want: 1},
		{name: "never one we hold", mine: h(4, 1), theirs: h(4, 0, 1, 2, 3), rarity: []int{3, 1, 2, 3}, want: 2},
		{name: "never one in flight", mine: h(4), inflight: []int{1, 2}, theirs: h(4, 0, 1, 2, 3), rarity: []int{3, 1, 2, 3}, want: 0},
		{name: "the first of equally rare ones", mine: h(4, 0), theirs: h(4, 0, 1, 2, 3), rarity: []int{2, 2, 2, 2}, want: 1},
		{name: "only one they have", mine: h(4), theirs: h(4, 3), rarity: []int{1, 1, 1, 9}, want: 3},
		{name: "none when they have nothing we lack", mine: h(4, 0, 1), theirs: h(4, 0, 1), rarity: []int{1, 1, 1, 1}, want: -1},
		{name: "never one to avoid", mine: h(4), theirs: h(4, 0, 1, 2, 3), rarity: []int{1, 1, 2, 1}, avoid: []bool{true, false, false, true}, want: 1},
		{name: "none when all they have is to avoid", mine: h(4), theirs: h(4, 0, 1, 2, 3), rarity: []int{1, 1, 1, 1}, avoid: []bool{true, true, true, true}, want: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inflight := make([]bool, tc.mine.Pieces)
			for _, i := range tc.inflight {
				inflight[i] = true
			}
			if got := pickPiece(tc.mine, inflight, tc.theirs, tc.rarity, tc.avoid); got != tc.want {
				t.Fatalf("pickPiece = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestShelf_AddAfterFetchKeepsTheFetchedListAndChecksTheNewReader(t *testing.T) {
	data, digest := randomBundle(t, 6*testPieceSize)
	src := newSource(t, data, digest, ServerOptions{})
	for _, tc := range []struct {
		name   string
		reader []byte
		served bool
	}{
		{name: "the same bytes stay served under the fetched list", reader: data, served: true},
		{name: "other bytes under the same digest stop being served", reader: append(append([]byte(nil), data[:100]...), append([]byte{data[100] ^ 1}, data[101:]...)...), served: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newNode(t, ServerOptions{}, nil)
			b.shelf.opts.PieceSize = 2 * testPieceSize // differs from the source's: the fetched list must win
			dest := filepath.Join(t.TempDir(), "b.tar")
			if err := fastFetcher([]string{src.addr}, FetcherOptions{Shelf: b.shelf}).Fetch(t.Context(), digest, dest, nil); err != nil {
				t.Fatal(err)
			}
			fetched, _ := b.shelf.Pieces(digest)
			if err := b.shelf.Add(digest, []byte(testMeta), bytes.NewReader(tc.reader), int64(len(tc.reader))); err != nil {
				t.Fatal(err)
			}
			if p, err := b.shelf.Pieces(digest); tc.served && (err != nil || p != fetched) {
				t.Fatalf("right after Add: %v, %v; want the fetched list served at once", p, err)
			}
			b.shelf.wg.Wait() // the background check
			_, err := b.shelf.Pieces(digest)
			if tc.served != (err == nil) {
				t.Fatalf("after the check: %v, want served=%v", err, tc.served)
			}
		})
	}
}

func TestAssign_SeedGetsOnlyFirstCopiesUnlessTheFetcherIsIdle(t *testing.T) {
	const n = 5
	rnd := rand.New(rand.NewPCG(1, 2))
	now := time.Now()
	h := func(set ...int) Have {
		x := NewHave(n)
		for _, i := range set {
			x.Set(i)
		}
		return x
	}
	newScheduler := func(fetcherHave Have, requests int, sentElsewhere map[int]time.Time) *scheduler {
		j := &job{
			f:     NewFetcher(FetcherOptions{PerPeer: 1, Parallel: 8}),
			pl:    &PieceList{Size: n * MinPieceSize, PieceSize: MinPieceSize, Pieces: make([]string, n)},
			mine:  h(4),
			peers: map[string]*peerState{},
		}
		j.peers["seed"] = &peerState{addr: "seed", have: FullHave(n), known: true, seed: true}
		j.peers["other"] = &peerState{addr: "other", have: fetcherHave, known: true}
		if sentElsewhere == nil {
			sentElsewhere = map[int]time.Time{}
		}
		return &scheduler{job: j, c: &wholeFile{j: j}, inflight: make([]bool, n), requests: requests, sentElsewhere: sentElsewhere, rnd: rnd}
	}

	// other holds 0 and is fetching 1; 2 was refused as sent elsewhere:
	// the seed is asked for 3 as a first copy, other for 0.
	fh := h(0)
	fh.Pending = make([]byte, len(fh.Bits))
	fh.Pending[0] |= 1 << 1
	s := newScheduler(fh, 0, map[int]time.Time{2: now.Add(time.Second)})
	got := s.assign(now)
	want := map[string]assignment{"seed": {peer: "seed", piece: 3, firstCopy: true}, "other": {peer: "other", piece: 0}}
	if len(got) != 2 || got[0] != want[got[0].peer] || got[1] != want[got[1].peer] {
		t.Fatalf("assign = %+v, want %+v", got, want)
	}

	// Everything we lack is held by the other fetcher, which is backing
	// off, and nothing is in flight: rather than sit idle, take a second
	// copy from the seed.
	s = newScheduler(h(0, 1, 2, 3), 0, nil)
	s.peers["other"].retryAt = now.Add(time.Minute)
	got = s.assign(now)
	if len(got) != 1 || got[0].peer != "seed" || got[0].firstCopy {
		t.Fatalf("idle fetcher: assign = %+v, want one plain request to the seed", got)
	}
	// Not idle (a request in flight): wait for the other fetcher instead.
	s = newScheduler(h(0, 1, 2, 3), 1, nil)
	s.peers["other"].retryAt = now.Add(time.Minute)
	if got = s.assign(now); len(got) != 0 {
		t.Fatalf("busy fetcher: assign = %+v, want nothing from the seed", got)
	}
}

// TestFetch_AsksABoundedSetOfSources (issue 43): of 20 peers, one holds
// the bundle whole and 19 hold nothing; the fetch polls and asks at most
// maxSources of them, the one that holds it among them, and still gets
// it whole.
func TestFetch_AsksABoundedSetOfSources(t *testing.T) {
	data, digest := randomBundle(t, 6*testPieceSize)
	var peers []string
	var nodes []*node
	for i := range 20 {
		var n *node
		if i == 13 {
			n = newSource(t, data, digest, ServerOptions{})
		} else {
			n = newNode(t, ServerOptions{}, nil)
		}
		nodes = append(nodes, n)
		peers = append(peers, n.addr)
	}
	dest := filepath.Join(t.TempDir(), "b.tar")
	if err := fastFetcher(peers, FetcherOptions{}).Fetch(t.Context(), digest, dest, nil); err != nil {
		t.Fatal(err)
	}
	checkFile(t, dest, data)
	asked := 0
	for _, n := range nodes {
		n.reqs.mu.Lock()
		for p, k := range n.reqs.m {
			if strings.Contains(p, "/bundles/") && k > 0 {
				asked++
				break
			}
		}
		n.reqs.mu.Unlock()
	}
	if asked > maxSources {
		t.Fatalf("%d of 20 peers asked about the bundle past the offers, want at most %d", asked, maxSources)
	}
	if nodes[13].reqs.get("/v1/bundles/"+string(digest)+"/tar") == 0 {
		t.Fatal("the one peer that holds the bundle was not among the sources")
	}
}
