package create_test

import (
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/create"
	"github.com/ferry-edge/ferry/test/fixture"
)

// bundle create writes each image's bytes into metadata.json: what the
// extracted tree says each image's blobs weigh, for the release, the
// payload, an extra by tag and a manifest list (its child for the arch).
func TestCreate_WritesEachImagesBytes(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 3, ImageSize: 64 << 10})
	reg.PushImage(t, "my-company/app", "v1")
	index, _ := reg.PushIndex(t, "my-company/multi", "v2", "amd64", "arm64")
	o := createFrom(t, reg, release, "quay.io/my-company/app:v1", index)
	o.KeepWork = true // the tree the tar holds
	res, err := create.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := bundle.InspectFile(res.TarPath)
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := bundle.ImageBlobs(res.WorkDir, meta.AllImages(), bundle.GoArch(meta.Arch))
	if err != nil {
		t.Fatal(err)
	}
	want := bundle.ImageSizes(blobs)
	if len(meta.ImageBytes) != len(meta.AllImages()) {
		t.Fatalf("imageBytes has %d entries for %d images", len(meta.ImageBytes), len(meta.AllImages()))
	}
	for _, ref := range meta.AllImages() {
		if got := meta.ImageBytes[ref]; got != want[ref] || got < 64<<10 && strings.Contains(ref, fixture.PayloadRepo) {
			t.Errorf("%s: imageBytes %d, the tree says %d", ref, got, want[ref])
		}
	}
}
