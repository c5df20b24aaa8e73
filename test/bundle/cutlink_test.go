package bundle_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/test/fixture"
)

// TestCreateCLI_ThroughALinkThatCutsBlobsMidwayResumesEachOnce (issue 36,
// item 4): ferry bundle create through a proxy that cuts every second large
// blob response in the middle completes, each cut blob resumed where it
// stopped, with at most 1.05× one copy of the bundle over the link; the
// bundle verifies.
func TestCreateCLI_ThroughALinkThatCutsBlobsMidwayResumesEachOnce(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 6, ImageSize: 1 << 20})
	p := fixture.NewLink(t, reg, fixture.LinkOptions{CutEvery: 2})
	out := t.TempDir()
	code, stderr := ferry(t, out, "bundle", "create", "--release", release,
		"--mirror", p.Mirror(), "--cert-dir", p.TrustIn(t, t.TempDir()), "--output", out, "--quiet", "--rate-limit", "64M")
	if code != 0 {
		t.Fatalf("bundle create through the cutting link: exit %d\n%s", code, stderr)
	}
	tars, _ := filepath.Glob(filepath.Join(out, "upgrade-*.tar"))
	if len(tars) != 1 {
		t.Fatalf("wrote %v", tars)
	}
	meta, err := bundle.InspectFile(tars[0])
	if err != nil {
		t.Fatal(err)
	}
	if p.Cuts() < 3 {
		t.Fatalf("the proxy cut %d responses: the test shows nothing", p.Cuts())
	}
	sent, size := p.Sent(), meta.SizeBytes
	if size <= 0 {
		fi, _ := os.Stat(tars[0])
		size = fi.Size()
	}
	ratio := float64(sent) / float64(size)
	t.Logf("%d responses cut; %d bytes over the link for a %d-byte bundle: %.3f×", p.Cuts(), sent, size, ratio)
	if ratio > 1.05 {
		t.Errorf("%.3f× one copy of the bundle crossed the link, want ≤ 1.05×", ratio)
	}
	if code, stderr := ferry(t, out, "bundle", "verify", tars[0], "--arch", meta.Arch); code != 0 {
		t.Fatalf("the bundle made through the cutting link does not verify: %d\n%s", code, stderr)
	}
}
