package create_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/create"
	"github.com/ferry-edge/ferry/test/fixture"
	"github.com/ferry-edge/ferry/test/releasesig"
)

// TestCreate_PathGivesEachHopItsOwnSignatures: signature files given for
// a path go each with the release it signs; the path is in version
// order, every release and payload image listed once.
func TestCreate_PathGivesEachHopItsOwnSignatures(t *testing.T) {
	reg := fixture.NewRegistry(t)
	relA, payA := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.17.3", PayloadImages: 6})
	relB, payB := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.18.1", PayloadImages: 6})
	sigA, sigB := releasesig.Test().SignRelease(relA, "4.17.3", "x86_64"), releasesig.Test().SignRelease(relB, "4.18.1", "x86_64")
	o := createFrom(t, reg, "")
	o.Releases = []string{relB, relA}
	o.ReleaseSignatures = [][]byte{sigB, sigA}
	res, err := create.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	m := res.Metadata
	hops := m.Hops()
	if len(hops) != 2 || hops[0].Release != relA || hops[1].Release != relB || m.Version != "4.18.1" {
		t.Fatalf("path %+v, version %s: want 4.17.3 (%s) then 4.18.1 (%s)", hops, m.Version, relA, relB)
	}
	if len(hops[0].ReleaseSignatures) != 1 || !bytes.Equal(hops[0].ReleaseSignatures[0], sigA) ||
		len(hops[1].ReleaseSignatures) != 1 || !bytes.Equal(hops[1].ReleaseSignatures[0], sigB) {
		t.Errorf("each hop does not carry its own signature: %d, %d", len(hops[0].ReleaseSignatures), len(hops[1].ReleaseSignatures))
	}
	if want := 1 + len(payA) + len(payB); len(m.Images) != want {
		t.Errorf("%d images, want %d (the first release and both payloads)", len(m.Images), want)
	}
	back, err := bundle.InspectFile(res.TarPath)
	if err != nil || len(back.Path) != 2 || back.FormatVersion != bundle.FormatPath {
		t.Errorf("read back: %v, %+v", err, back)
	}

	// A signature of a release not in the path is refused, naming it.
	other, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.16.9", PayloadImages: 1})
	o = createFrom(t, reg, "")
	o.Releases = []string{relA, relB}
	o.ReleaseSignatures = [][]byte{releasesig.Test().SignRelease(other, "4.16.9", "x86_64")}
	_, err = create.Run(t.Context(), o)
	if !errors.Is(err, create.ErrRelease) || !strings.Contains(err.Error(), "none of the releases given") {
		t.Errorf("a signature of another release: %v", err)
	}
	// --version with a path is refused: each release says its own.
	o = createFrom(t, reg, "")
	o.Releases, o.Version = []string{relA, relB}, "4.18.1"
	if _, err := create.Run(t.Context(), o); err == nil || !strings.Contains(err.Error(), "drop --version") {
		t.Errorf("--version with a path: %v", err)
	}
}
