package create_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/create"
	"github.com/ferry-edge/ferry/test/fixture"
)

// A run stopped in the middle of a blob (ferry restarted, the pull window
// closed) keeps what that blob had received; the next run asks for the
// rest with a Range request, so the whole bundle crosses the link once.
func TestCreate_AStoppedRunResumesMidBlob(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 1, ImageSize: 6 << 20})
	link := fixture.NewLink(t, reg, fixture.LinkOptions{Rate: 4 << 20})
	o := createFrom(t, reg, release)
	o.Mirrors = []create.Mirror{{Prefix: "quay.io/", Location: link.Host() + "/"}}
	tr, err := create.NewTransport(link.TrustIn(t, t.TempDir()), true)
	if err != nil {
		t.Fatal(err)
	}
	o.Transport = tr
	o.WorkDir = filepath.Join(t.TempDir(), "work")

	// Stopped once 2 MiB of the 6 MiB blob crossed the link, however slow
	// the machine (a deadline would stop it before or after the blob on a
	// busy one).
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		for link.Sent() < 2<<20 && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
	}()
	if _, err := create.Run(ctx, o); err == nil {
		t.Fatal("the first run finished: the link is too fast to stop it mid-blob")
	}
	parts, _ := filepath.Glob(filepath.Join(o.WorkDir, ".partial", "*"))
	var kept int64
	for _, p := range parts {
		if fi, err := os.Stat(p); err == nil {
			kept += fi.Size()
		}
	}
	if kept == 0 {
		t.Fatalf("the stopped run kept nothing of its blob (%v)", parts)
	}
	first := link.Sent()

	res, err := create.Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	ratio := float64(link.Sent()) / float64(res.Metadata.SizeBytes)
	t.Logf("stopped after %d bytes (%d kept mid-blob); %d bytes in all for a %d-byte bundle: %.3f×", first, kept, link.Sent(), res.Metadata.SizeBytes, ratio)
	if ratio > 1.05 {
		t.Errorf("%.3f× the bundle crossed the link: the second run did not resume the blob", ratio)
	}
	if _, err := bundle.Verify(t.Context(), bundle.Source{Path: res.TarPath, SHA256Path: res.SHA256Path}, bundle.Options{}); err != nil {
		t.Fatalf("the resumed bundle does not verify: %v", err)
	}
}
