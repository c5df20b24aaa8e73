package bundle

import (
	"context"
	"crypto/rand"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/internal/imagetree"
)

// countingPacer counts the bytes it was asked to pace, and can refuse.
type countingPacer struct {
	n, largest int
	err        error
}

func (p *countingPacer) Waited(time.Duration) {}

func (p *countingPacer) Pace(_ context.Context, n int) error {
	p.n += n
	p.largest = max(p.largest, n)
	return p.err
}

func pacedBundle(t *testing.T) (Source, int) {
	small := imagetree.Tree{}
	layer := make([]byte, 3<<20+17)
	rand.Read(layer)
	d := imagetree.Digest(layer)
	ref := small.AddOver("quay.io/pace/img", d, int64(len(layer)))
	entries := append([]entry{file(RegistryRoot+imagetree.BlobPath(d), string(layer))}, treeEntries(small)[4:]...)
	meta := testMetadata(1 << 30)
	meta.Release, meta.Images = ref, nil
	return stage(t, writeBundle(t, meta, entries), ""), len(layer)
}

func TestExtract_PacesEveryByteWritten(t *testing.T) {
	src, layer := pacedBundle(t)
	p := &countingPacer{}
	if _, err := Extract(t.Context(), src, filepath.Join(t.TempDir(), "out"), Options{Policy: Policy{SpaceFactor: -1}, Pacer: p}); err != nil {
		t.Fatal(err)
	}
	if p.n < layer {
		t.Errorf("paced %d bytes, want at least the layer's %d", p.n, layer)
	}
}

// A synced extraction writes back as it goes: paced, it must reach the
// disk a write-behind window at a time, not a whole read chunk at once.
func TestExtract_SyncedPacesAWindowAtATime(t *testing.T) {
	src, layer := pacedBundle(t)
	p := &countingPacer{}
	if _, err := Extract(t.Context(), src, filepath.Join(t.TempDir(), "out"), Options{Policy: Policy{SpaceFactor: -1}, Pacer: p, Sync: true}); err != nil {
		t.Fatal(err)
	}
	if p.n < layer {
		t.Errorf("paced %d bytes, want at least the layer's %d", p.n, layer)
	}
	if p.largest > writeBehindWindow || chunkSize <= writeBehindWindow {
		t.Errorf("largest paced step %d bytes, want at most a window (%d) of a %d-byte chunk", p.largest, writeBehindWindow, chunkSize)
	}
}

func TestExtract_PacerErrorStopsIt(t *testing.T) {
	src, _ := pacedBundle(t)
	p := &countingPacer{err: context.Canceled}
	_, err := Extract(t.Context(), src, filepath.Join(t.TempDir(), "out"), Options{Policy: Policy{SpaceFactor: -1}, Pacer: p})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Extract with a pause ended by its context: %v, want context.Canceled", err)
	}
}
