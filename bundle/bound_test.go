package bundle

import (
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteBound_IsTheSmallerOfWhatIsKnown(t *testing.T) {
	for _, tc := range []struct {
		claimed int64
		approx  bool
		length  int64
		want    int64
	}{
		{100, false, 0, 100},
		{100, false, 50, 50},
		{100, false, 500, 100},
		{0, false, 70, 70},
		{0, false, 0, 0},
		{800, true, 0, 900},                     // "size" is approximate: an eighth more
		{800, true, 850, 850},                   // and never more than the file
		{math.MaxInt64, true, 0, math.MaxInt64}, // no overflow
	} {
		if got := writeBound(tc.claimed, tc.approx, tc.length); got != tc.want {
			t.Errorf("writeBound(%d, %v, %d) = %d, want %d", tc.claimed, tc.approx, tc.length, got, tc.want)
		}
	}
}

// factor × sizeBytes used to overflow to a negative need, which any disk
// has room for.
func TestCheckSpace_AHugeSizeDoesNotOverflowIntoRoom(t *testing.T) {
	for _, size := range []int64{math.MaxInt64/2 + 1, math.MaxInt64} {
		if err := checkSpace(t.TempDir(), size, 2); !errors.Is(err, ErrNoSpace) {
			t.Errorf("size %d: %v, want %v", size, err, ErrNoSpace)
		}
	}
}

// A seed-shaped bundle's size bounded nothing: its files could add up to
// any amount, written before the digest matched. Now its "size" (with an
// eighth of slack) bounds them, before the entry is written.
func TestExtract_ASeedShapedBundleIsBoundedByItsSize(t *testing.T) {
	meta := `{"version": "4.13.7", "arch": "x86_64", "size": "1 KiB",
  "release": "` + testRelease + `", "images": ["` + testImage + `"]}`
	es := append(validEntries(), file(RegistryRoot+"repositories/big/_uploads/x", strings.Repeat("z", 64<<10)))
	src := stage(t, writeBundle(t, []byte(meta), es), "")
	dest := filepath.Join(t.TempDir(), "out")
	_, err := Extract(t.Context(), src, dest, Options{Policy: Policy{SpaceFactor: -1}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "allow") {
		t.Fatalf("err %v, want the write bound", err)
	}
}

// A raw device (no file length to bound by but its own) and a reader that
// says its length are bounded by that length too.
func TestExtract_AReaderIsBoundedByItsLength(t *testing.T) {
	tb := writeBundle(t, testMetadata(1<<30), append(validEntries(), file(RegistryRoot+"repositories/big/_uploads/x", strings.Repeat("z", 64<<10))))
	src := stage(t, tb, "")
	src.Reader, src.Size = strings.NewReader(string(tb)), 4096 // claims less than its entries hold
	_, err := Extract(t.Context(), src, filepath.Join(t.TempDir(), "out"), Options{Policy: Policy{SpaceFactor: -1}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "allow") {
		t.Fatalf("err %v, want the write bound", err)
	}
}
