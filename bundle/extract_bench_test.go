package bundle

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/ferry-edge/ferry/internal/imagetree"
)

// BenchmarkExtract_BlobHashing extracts a bundle of 16 × 32 MiB layers
// from the page cache with every blob hashed against its path (as always)
// and without (only here), so make bench prints what the tree check costs
// beside the whole-tar sha256 that runs on the other core.
func BenchmarkExtract_BlobHashing(b *testing.B) {
	dir := b.TempDir()
	small := imagetree.Tree{}
	var refs []string
	var entries []entry
	for i := range 16 {
		layer := make([]byte, 32<<20)
		rand.Read(layer)
		d := imagetree.Digest(layer)
		refs = append(refs, small.AddOver("quay.io/bench/img-"+strconv.Itoa(i), d, int64(len(layer))))
		entries = append(entries, file(RegistryRoot+imagetree.BlobPath(d), string(layer)))
	}
	entries = append(entries, treeEntries(small)[4:]...)
	meta := testMetadata(1 << 30)
	meta.Release, meta.Images = refs[0], refs[1:]
	src := stage(b, writeBundle(b, meta, entries), "")
	fi, err := os.Stat(src.Path)
	must(b, err)
	for _, on := range []bool{true, false} {
		b.Run("hashing="+strconv.FormatBool(on), func(b *testing.B) {
			hashBlobs = on
			defer func() { hashBlobs = true }()
			b.SetBytes(fi.Size())
			for i := 0; b.Loop(); i++ {
				dest := filepath.Join(dir, "out"+strconv.Itoa(i))
				if _, err := Extract(b.Context(), src, dest, Options{Policy: Policy{SpaceFactor: -1}}); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				os.RemoveAll(dest)
				b.StartTimer()
			}
		})
	}
}
