package bundle_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/imagetree"
)

// metadata.json's imageBytes names images of the bundle only, with sizes
// that fit in it; without it the metadata is as valid as before.
func TestMetadata_ImageBytesValidated(t *testing.T) {
	const rel = "quay.io/a/release@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	base := func() *bundle.Metadata {
		return &bundle.Metadata{FormatVersion: 1, Version: "4.13.7", Arch: "x86_64", Size: "1 KiB", SizeBytes: 1024, Release: rel}
	}
	for _, tc := range []struct {
		name string
		ib   map[string]int64
		bad  string
	}{
		{"absent", nil, ""},
		{"the release", map[string]int64{rel: 1000}, ""},
		{"not an image of the bundle", map[string]int64{"quay.io/a/other@sha256:" + strings.Repeat("2", 64): 1}, "is not the release nor one of the images"},
		{"negative", map[string]int64{rel: -1}, "does not fit"},
		{"more than the bundle", map[string]int64{rel: 4096}, "does not fit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := base()
			m.ImageBytes = tc.ib
			err := bundle.ValidateMetadata(m)
			if tc.bad == "" && err != nil || tc.bad != "" && (!errors.Is(err, bundle.ErrInvalid) || !strings.Contains(err.Error(), tc.bad)) {
				t.Fatalf("got %v, want %q", err, tc.bad)
			}
		})
	}
}

// The estimate made before extraction never says less than what the
// extracted tree counts, whichever images the runtime holds, with
// imageBytes or without; with them it is near the exact count.
func TestEstimateMissingBytes_NeverBelowTheTreesCount(t *testing.T) {
	tree := imagetree.Tree{}
	shared := imagetree.Layer("base", 300<<10)
	refs := []string{
		tree.Add("quay.io/x/release", shared),
		tree.Add("quay.io/x/a", shared),
		tree.Add("quay.io/x/big", imagetree.Layer("big", 900<<10)),
		tree.Add("quay.io/x/small", imagetree.Layer("small", 10<<10)),
	}
	dir := t.TempDir()
	for p, b := range tree {
		p = filepath.Join(dir, bundle.RegistryRoot, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	meta := &bundle.Metadata{Arch: "x86_64", SizeBytes: tree.Size() + 512, Release: refs[0], Images: refs[1:]}
	blobs, err := bundle.ImageBlobs(dir, meta.AllImages(), "amd64")
	if err != nil {
		t.Fatal(err)
	}
	sizes := bundle.ImageSizes(blobs)
	for mask := range 1 << len(refs) {
		present := func(ref string) bool {
			for i, r := range refs {
				if r == ref {
					return mask&(1<<i) != 0
				}
			}
			return false
		}
		exact, n := bundle.MissingBytes(blobs, present)
		meta.ImageBytes = nil
		without, n1, per1 := bundle.EstimateMissingBytes(meta, present)
		meta.ImageBytes = sizes
		with, n2, per2 := bundle.EstimateMissingBytes(meta, present)
		if n1 != n || n2 != n || per1 || !per2 && n > 0 {
			t.Fatalf("mask %04b: %d, %d, %d images missing; per image %v %v", mask, n, n1, n2, per1, per2)
		}
		if without < exact || with < exact || with > without {
			t.Errorf("mask %04b: exact %d, estimated %d with imageBytes, %d without", mask, exact, with, without)
		}
		if n == 0 && (with != 0 || without != 0) {
			t.Errorf("mask %04b: nothing missing, yet %d / %d", mask, with, without)
		}
	}
	// Only the small image missing: imageBytes says its few KiB, not the
	// whole bundle.
	onlySmall := func(ref string) bool { return ref != refs[3] }
	meta.ImageBytes = sizes
	if with, _, _ := bundle.EstimateMissingBytes(meta, onlySmall); with > 20<<10 {
		t.Errorf("only the small image missing: %d bytes", with)
	}
	// An image imageBytes does not know: the whole bundle.
	delete(meta.ImageBytes, refs[3])
	if with, _, per := bundle.EstimateMissingBytes(meta, onlySmall); with != meta.SizeBytes || per {
		t.Errorf("an unknown image missing: %d bytes (per image %v)", with, per)
	}
}
