package peer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
)

// collect is a consume that keeps every byte it reads, calling each(n)
// with the bytes read so far after every read.
const window4 = 4 * testPieceSize

func collect(out *bytes.Buffer, each func(n int64)) StreamConsumer {
	return func(r io.Reader, _ *StreamResume, _ Checkpoint) error {
		buf := make([]byte, 16<<10)
		for {
			n, err := r.Read(buf)
			out.Write(buf[:n])
			if each != nil {
				each(int64(out.Len()))
			}
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
		}
	}
}

func TestFetchStream_FromALiveSourceFetchersStartBeforeItsReadEnds(t *testing.T) {
	data, digest := randomBundle(t, 24*testPieceSize+123)
	src := newNode(t, ServerOptions{}, nil)
	live, err := src.shelf.AddLive(digest, []byte(testMeta), nil, bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	b, c := newNode(t, ServerOptions{}, nil), newNode(t, ServerOptions{}, nil)
	var started atomic.Bool // a fetcher's extraction has bytes
	firstBytes := make(chan struct{})
	var once sync.Once
	mark := func(int64) {
		if started.CompareAndSwap(false, true) {
			once.Do(func() { close(firstBytes) })
		}
	}
	// The source reads half, then waits until a fetcher extracts, so a
	// fetch that waited for the whole read would never start.
	go func() {
		live.Write(data[:len(data)/2])
		select {
		case <-firstBytes:
		case <-time.After(10 * time.Second):
		}
		for off := len(data) / 2; off < len(data); off += 10000 {
			live.Write(data[off:min(off+10000, len(data))])
		}
	}()
	var wg sync.WaitGroup
	got := map[*node]*bytes.Buffer{b: {}, c: {}}
	lists := map[*node]*PieceList{}
	var mu sync.Mutex
	for n, other := range map[*node]*node{b: c, c: b} {
		wg.Go(func() {
			f := fastFetcher([]string{src.addr, other.addr}, FetcherOptions{Shelf: n.shelf})
			pl, err := f.FetchStream(t.Context(), digest, filepath.Join(t.TempDir(), "b.part"), 4*testPieceSize, nil, collect(got[n], mark))
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			lists[n] = pl
			mu.Unlock()
		})
	}
	wg.Wait()
	if !started.Load() {
		t.Fatal("no fetcher extracted anything")
	}
	want := live.List(digest)
	for n, buf := range got {
		if !bytes.Equal(buf.Bytes(), data) {
			t.Fatalf("a fetcher extracted %d bytes, not the bundle's %d", buf.Len(), len(data))
		}
		if pl := lists[n]; pl == nil || pl.Partial || pl.Validate() != nil || !equalLists(pl, want) {
			t.Fatalf("fetched list %+v, want the source's", pl)
		}
	}
}

func equalLists(a, b *PieceList) bool {
	return a.Digest == b.Digest && a.Size == b.Size && a.PieceSize == b.PieceSize && slices.Equal(a.Pieces, b.Pieces)
}

func TestFetchStream_HoldsNoMoreThanItsWindowOnDisk(t *testing.T) {
	data, digest := randomBundle(t, 40*testPieceSize)
	src := newSource(t, data, digest, ServerOptions{})
	dest := filepath.Join(t.TempDir(), "b.part")
	const window = 4 * testPieceSize
	var peak, peakAll int64
	sample := func(extracted int64) {
		var st syscall.Stat_t
		if syscall.Stat(dest, &st) == nil {
			peak = max(peak, st.Blocks*512)
			peakAll = max(peakAll, extracted+st.Blocks*512)
		}
		time.Sleep(time.Millisecond) // an extraction slower than the network
	}
	var out bytes.Buffer
	if _, err := fastFetcher([]string{src.addr}, FetcherOptions{}).FetchStream(t.Context(), digest, dest, window, nil, collect(&out, sample)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatal("extracted bytes differ from the bundle")
	}
	if peak == 0 || peak > window {
		t.Fatalf("download file peaked at %d bytes on disk, want (0, %d] (the window)", peak, window)
	}
	// The pieces ahead become the tree: beside what was extracted, the
	// file holds at most the part kept behind and the piece being read.
	if bound := int64(len(data)) + StreamKeptBehind(window) + testPieceSize; peakAll > bound {
		t.Fatalf("extracted bytes plus the download file peaked at %d, want at most the bundle (%d) + the part kept behind (%d) + a piece", peakAll, len(data), StreamKeptBehind(window))
	}
	if _, err := os.Stat(dest); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("download file left behind: %v", err)
	}
	t.Logf("peak %d bytes on disk for a %d-byte bundle, window %d; with the extracted bytes %d", peak, len(data), window, peakAll)
}

func TestFetchStream_ARefusingExtractionStopsTheFetch(t *testing.T) {
	data, digest := randomBundle(t, 16*testPieceSize)
	src := newSource(t, data, digest, ServerOptions{})
	refused := errors.New("refused: not an upgrade bundle")
	consume := func(r io.Reader, _ *StreamResume, _ Checkpoint) error {
		io.ReadFull(r, make([]byte, 100))
		return refused
	}
	_, err := fastFetcher([]string{src.addr}, FetcherOptions{}).FetchStream(t.Context(), digest, filepath.Join(t.TempDir(), "b.part"), window4, nil, consume)
	if !errors.Is(err, refused) {
		t.Fatalf("FetchStream = %v, want the extraction's refusal", err)
	}
}

func TestFetchStream_AWithdrawnLiveOfferIsGivenUp(t *testing.T) {
	old := withdrawnAfter
	withdrawnAfter = 200 * time.Millisecond
	t.Cleanup(func() { withdrawnAfter = old })
	data, digest := randomBundle(t, 16*testPieceSize)
	src := newNode(t, ServerOptions{}, nil)
	live, err := src.shelf.AddLive(digest, []byte(testMeta), nil, bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	live.Write(data[:3*testPieceSize])
	var out bytes.Buffer
	done := make(chan error, 1)
	// The fetch has begun consuming the live offer before it is withdrawn:
	// the first bytes reached the consumer (an event, not a sleep).
	began := make(chan struct{})
	var once sync.Once
	go func() {
		_, err := fastFetcher([]string{src.addr}, FetcherOptions{}).FetchStream(t.Context(), digest, filepath.Join(t.TempDir(), "b.part"), window4, nil,
			collect(&out, func(n int64) {
				if n > 0 {
					once.Do(func() { close(began) })
				}
			}))
		done <- err
	}()
	select {
	case <-began:
	case err := <-done:
		t.Fatalf("FetchStream ended before it consumed a byte of the live offer: %v", err)
	}
	live.Close() // the read ended in a mismatch: the offer goes
	select {
	case err := <-done:
		if !errors.Is(err, ErrWithdrawn) {
			t.Fatalf("FetchStream = %v, want ErrWithdrawn", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the fetch still waits for a withdrawn bundle")
	}
}

func TestPieceList_GrowingListsMergeOrDisagree(t *testing.T) {
	a := &PieceList{Digest: digest.Digest("sha256:" + sum(nil)), Size: 3 * MinPieceSize, PieceSize: MinPieceSize, Pieces: []string{sum([]byte("0")), "", ""}, Partial: true}
	b := a.clone()
	b.Pieces[1] = sum([]byte("1"))
	m, err := a.merge(b)
	if err != nil || m.Pieces[1] != b.Pieces[1] || !m.Partial || a.Pieces[1] != "" {
		t.Fatalf("merge = %+v, %v; want piece 1 learned, still partial, a unchanged", m, err)
	}
	if m2, _ := m.merge(a); m2 != m {
		t.Fatal("merging a list that adds nothing made a new list")
	}
	c := a.clone()
	c.Pieces[0] = sum([]byte("x"))
	if _, err := m.merge(c); !errors.Is(err, ErrBadPieceList) {
		t.Fatalf("disagreeing lists merged: %v", err)
	}
	if err := a.Validate(); err != nil {
		t.Fatalf("a partial list does not validate: %v", err)
	}
	a.Partial = false
	if err := a.Validate(); err == nil {
		t.Fatal("a whole list with unknown pieces validates")
	}
}

// A streaming fetch stopped after its extraction's checkpoint resumes
// from it: the extraction is given the bytes from the checkpoint on, and
// only the pieces from there are fetched again.
func TestFetchStream_ResumesFromTheExtractionsCheckpoint(t *testing.T) {
	data, digest := randomBundle(t, 32*testPieceSize)
	src := newSource(t, data, digest, ServerOptions{})
	dest := filepath.Join(t.TempDir(), "b.part")
	const at = 10*testPieceSize + 100 // the checkpoint: mid-piece
	ctx, cancel := context.WithCancel(t.Context())
	first := func(r io.Reader, from *StreamResume, checkpoint Checkpoint) error {
		if from != nil {
			t.Errorf("a first fetch resumes from %+v", from)
		}
		if _, err := io.ReadFull(r, make([]byte, at+3*testPieceSize)); err != nil {
			return err
		}
		checkpoint(at, func() []byte { return []byte("tree index") })
		waitForCheckpoint(t, StatePath(dest), at) // saved about once a second
		cancel()                                  // the agent stops
		_, err := io.Copy(io.Discard, r)
		return err
	}
	f := fastFetcher([]string{src.addr}, FetcherOptions{})
	if _, err := f.FetchStream(ctx, digest, dest, window4, nil, first); !errors.Is(err, context.Canceled) {
		t.Fatalf("first fetch: %v, want it cancelled", err)
	}
	if _, err := os.Stat(StatePath(dest)); err != nil {
		t.Fatalf("no resume record: %v", err)
	}
	// The second fetch asks a source of its own: the first one's last
	// asks, cancelled on the way, may still reach src.
	src2 := newSource(t, data, digest, ServerOptions{})
	f = fastFetcher([]string{src2.addr}, FetcherOptions{})
	var rest bytes.Buffer
	second := func(r io.Reader, from *StreamResume, _ Checkpoint) error {
		if from == nil || from.Offset != at || string(from.Data) != "tree index" {
			t.Errorf("resumed from %+v, want the checkpoint", from)
		}
		_, err := io.Copy(&rest, r)
		return err
	}
	if _, err := f.FetchStream(t.Context(), digest, dest, window4, nil, second); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rest.Bytes(), data[at:]) {
		t.Fatalf("resumed extraction got %d bytes, want the %d from the checkpoint on", rest.Len(), len(data)-at)
	}
	if got, most := src2.reqs.get("/v1/bundles/"+string(digest)+"/tar"), 32-at/testPieceSize; got > most {
		t.Fatalf("the resumed fetch asked for %d pieces, want at most the %d from the checkpoint's piece on", got, most)
	}
	if _, err := os.Stat(StatePath(dest)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("resume record left after the end: %v", err)
	}
}

// waitForCheckpoint waits until the resume record at path holds a stream
// checkpoint at offset: the record a restart would read.
func waitForCheckpoint(t *testing.T, path string, offset int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var st fetchState
		if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &st) == nil &&
			st.Stream != nil && st.Stream.Offset == offset {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("no resume record with the checkpoint at %d after 10 s", offset)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
