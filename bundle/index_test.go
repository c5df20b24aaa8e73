package bundle

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestPackZeros_RoundTrips(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	cases := [][]byte{nil, {0}, {1}, {0, 1, 0}, make([]byte, 1000), bytes.Repeat([]byte{7}, 300)}
	for range 200 {
		b := make([]byte, r.IntN(1200))
		for i := range b {
			if r.IntN(3) == 0 {
				b[i] = byte(r.Uint32())
			}
		}
		cases = append(cases, b)
	}
	for _, b := range cases {
		p := packZeros(nil, b)
		if got := unpackZeros(p, len(b)); !bytes.Equal(got, b) {
			t.Fatalf("%d bytes: round trip differs", len(b))
		}
	}
}

// manySmallEntries is a valid bundle plus n one-byte files (in a listed
// repository: the tree check refuses others): the shape that made the
// index cost ~2.8× the tar.
func manySmallEntries(t testing.TB, n int) []byte {
	es := validEntries()
	for i := range n {
		es = append(es, file(fmt.Sprintf("%srepositories/openshift-release-dev/ocp-release/_uploads/some-longer-name-%06d", RegistryRoot, i), "x"))
	}
	return writeBundle(t, testMetadata(1<<30), es)
}

// The tar index of a bundle of many small entries is held in a fraction
// of the tar's size, and still serves the tar byte for byte. The size is
// what the index's own slices reserve (capacities, not lengths), so the
// test measures the index alone, whatever its neighbours in the test
// binary allocate; BenchmarkIndex_HeapOfManySmallEntries reads the heap.
func TestIndex_ManySmallEntriesCostAFractionOfTheTar(t *testing.T) {
	tb := manySmallEntries(t, 20000)
	src := stage(t, tb, "")
	dest := filepath.Join(t.TempDir(), "out")
	ix := new(Index)
	if _, err := Extract(t.Context(), src, dest, Options{Policy: Policy{SpaceFactor: -1}, Index: ix}); err != nil {
		t.Fatal(err)
	}
	held := ix.reserved()
	ratio := float64(held) / float64(len(tb))
	t.Logf("tar %d bytes, %d segments; the index reserves %d bytes (%.2f× the tar; packed raw blocks %d bytes)",
		len(tb), len(ix.Segments), held, ratio, len(ix.Packed))
	if ratio > 0.5 {
		t.Errorf("the index holds %.2f× the tar, want at most 0.5×", ratio)
	}
	got, err := io.ReadAll(io.NewSectionReader(ix.ReaderAt(dest), 0, ix.Size))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, tb) {
		t.Fatal("the index does not serve the tar byte for byte")
	}
	var back Index
	b, err := ix.Encode()
	must(t, err)
	must(t, back.Decode(b))
	if got, _ := io.ReadAll(io.NewSectionReader(back.ReaderAt(dest), 0, back.Size)); !bytes.Equal(got, tb) {
		t.Fatal("the encoded index does not serve the tar byte for byte")
	}
}

// reserved is what ix's slices and paths hold in memory.
func (ix *Index) reserved() int64 {
	n := int64(cap(ix.Packed)) + int64(cap(ix.Segments))*segmentCost
	for _, s := range ix.Segments {
		n += int64(len(s.Path))
	}
	return n
}

// BenchmarkIndex_HeapOfManySmallEntries reports the heap an index of
// 20,000 one-byte entries keeps after its extraction, as a fraction of
// the tar (heap/tar; TestIndex_ManySmallEntriesCostAFractionOfTheTar
// holds what the index reserves to at most 0.5). Run alone: it reads the
// process's heap.
func BenchmarkIndex_HeapOfManySmallEntries(b *testing.B) {
	tb := manySmallEntries(b, 20000)
	src := stage(b, tb, "")
	for i := 0; b.Loop(); i++ {
		dest := filepath.Join(b.TempDir(), fmt.Sprint("out", i))
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		ix := new(Index)
		if _, err := Extract(b.Context(), src, dest, Options{Policy: Policy{SpaceFactor: -1}, Index: ix}); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(len(tb)), "heap/tar")
		runtime.KeepAlive(ix)
	}
}

// An index written before the packed form (every segment's Raw its own)
// still serves.
func TestIndex_AnUnpackedIndexStillServes(t *testing.T) {
	tb := manySmallEntries(t, 10)
	dest := filepath.Join(t.TempDir(), "out")
	ix := new(Index)
	if _, err := Extract(t.Context(), stage(t, tb, ""), dest, Options{Policy: Policy{SpaceFactor: -1}, Index: ix}); err != nil {
		t.Fatal(err)
	}
	old := &Index{Digest: ix.Digest, Size: ix.Size}
	for i := range ix.Segments {
		s := ix.Segments[i]
		old.Segments = append(old.Segments, Segment{Raw: ix.raw(&s), Path: s.Path, Size: s.Size})
	}
	if got, _ := io.ReadAll(io.NewSectionReader(old.ReaderAt(dest), 0, old.Size)); !bytes.Equal(got, tb) {
		t.Fatal("an unpacked index does not serve the tar byte for byte")
	}
}

// A tar of more entries than a bundle may hold, or whose names and
// headers outgrow what its index may hold, is refused as it is read
// (Verify and Extract alike), saying what it is and what to do, with the
// index still within its bound.
func TestIndex_BoundedWhateverTheTarHolds(t *testing.T) {
	lower := func(entries int, bytes int64) {
		oldE, oldB := maxEntries, maxIndexBytes
		maxEntries, maxIndexBytes = entries, bytes
		t.Cleanup(func() { maxEntries, maxIndexBytes = oldE, oldB })
	}
	within := func(t *testing.T, ix *Index) {
		t.Helper()
		held := int64(len(ix.Packed)) + int64(len(ix.Segments))*segmentCost
		for _, s := range ix.Segments {
			held += int64(len(s.Path))
		}
		if len(ix.Segments) > maxEntries+2 || held > maxIndexBytes || held != ix.held {
			t.Fatalf("index holds %d segments and %d bytes (counted %d), bound %d entries and %d bytes",
				len(ix.Segments), held, ix.held, maxEntries, maxIndexBytes)
		}
	}
	refused := func(t *testing.T, tb []byte, says string) {
		t.Helper()
		if _, err := Verify(t.Context(), stage(t, tb, ""), Options{Policy: Policy{SpaceFactor: -1}}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), says) {
			t.Fatalf("Verify: err = %v, want ErrInvalid saying %q", err, says)
		}
		dest := filepath.Join(t.TempDir(), "out")
		ix := new(Index)
		_, err := Extract(t.Context(), stage(t, tb, ""), dest, Options{Policy: Policy{SpaceFactor: -1}, Index: ix})
		if !errors.Is(err, ErrInvalid) || !IsRefusal(err) || !strings.Contains(err.Error(), says) {
			t.Fatalf("Extract: err = %v, want a refusal (ErrInvalid) saying %q", err, says)
		}
		if !strings.Contains(err.Error(), "not a bundle ferry makes") || !strings.Contains(err.Error(), "ferry bundle create") {
			t.Fatalf("Extract: %v: does not say what to do", err)
		}
		within(t, ix)
		if _, err := os.Lstat(dest); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s exists after the refusal", dest)
		}
		if _, err := os.Lstat(StagingDir(dest)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("staging dir %s left behind", StagingDir(dest))
		}
	}

	t.Run("more entries than the cap", func(t *testing.T) {
		lower(100, 64<<20)
		refused(t, manySmallEntries(t, 200), "the bundle holds more than 100 files")
	})
	t.Run("names and headers over the bytes cap", func(t *testing.T) {
		lower(1<<18, 16<<10)
		es := validEntries()
		for i := range 10 {
			long := fmt.Sprintf("%srepositories/quay.io/long/%sfile-%d", RegistryRoot, strings.Repeat(strings.Repeat("n", 200)+"/", 14), i)
			es = append(es, file(long, "x"))
		}
		refused(t, writeBundle(t, testMetadata(1<<30), es), "file names and tar headers take more than 16 KiB")
	})
	t.Run("a bundle within the caps", func(t *testing.T) {
		lower(300, 1<<20)
		ix := new(Index)
		if _, err := Extract(t.Context(), stage(t, manySmallEntries(t, 200), ""), filepath.Join(t.TempDir(), "out"),
			Options{Policy: Policy{SpaceFactor: -1}, Index: ix}); err != nil {
			t.Fatal(err)
		}
		within(t, ix)
	})
}
