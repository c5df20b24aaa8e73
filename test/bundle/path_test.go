package bundle_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/test/fixture"
)

// blobBytes is the bytes of every distinct blob a registry's storage
// holds (configs, layers and manifests, each once).
func blobBytes(t *testing.T, root string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(filepath.Join(root, "docker/registry/v2/blobs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "data" {
			return err
		}
		fi, err := d.Info()
		n += fi.Size()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCreateCLI_PathOfTwoReleasesStoresSharedBlobsOnce makes one bundle of
// an EUS-to-EUS-like path, two releases whose payloads share most layers
// (given newest first): the bundle holds both, each blob once (its size
// within 5% of the union of the two releases' distinct blobs, which is
// all the source registry holds), and its path in version order; inspect
// lists the hops. A path with a gap is refused, naming the missing minor,
// before anything is copied.
func TestCreateCLI_PathOfTwoReleasesStoresSharedBlobsOnce(t *testing.T) {
	reg := fixture.NewRegistry(t)
	sizes := make([]int64, 24)
	for i := range sizes {
		sizes[i] = 512 << 10 // the tar's own overhead (~1 KiB a file) stays small beside them, as beside real images
	}
	relA, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.17.3", ImageSizes: sizes})
	relB, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.18.1", ImageSizes: sizes, Shares: "4.17.3", Own: 8})
	union := blobBytes(t, reg.Dir)

	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	code, stderr := ferry(t, dir, "bundle", "create", "--quiet", "--release", relB, "--release", relA, "--mirror", reg.Mirror(),
		"--cert-dir", reg.CertsDir, "--output", out, "--signature-store", "")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	tarPath := filepath.Join(out, "upgrade-4.18.1-x86_64.tar")
	fi, err := os.Stat(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	ratio := float64(fi.Size()) / float64(union)
	t.Logf("bundle %d bytes, the two releases' distinct blobs %d bytes (%.3f)", fi.Size(), union, ratio)
	if ratio < 0.95 || ratio > 1.05 {
		t.Errorf("bundle of %d bytes is not within 5%% of the union of the releases' distinct blobs, %d bytes (ratio %.3f)", fi.Size(), union, ratio)
	}

	b, err := exec.Command(ferryBin, "bundle", "inspect", "-o", "json", tarPath).Output()
	if err != nil {
		t.Fatal(err)
	}
	var m bundle.Metadata
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	hops := m.Hops()
	if m.FormatVersion != bundle.FormatPath || len(hops) != 2 || hops[0].Version != "4.17.3" || hops[0].Release != relA ||
		hops[1].Version != "4.18.1" || m.Release != hops[1].Release {
		t.Errorf("metadata: format %d, path %+v, release %s; want format %d, 4.17.3 (%s) then 4.18.1 (%s)", m.FormatVersion, hops, m.Release, bundle.FormatPath, relA, relB)
	}
	b, err = exec.Command(ferryBin, "bundle", "inspect", tarPath).Output()
	if err != nil || !strings.Contains(string(b), "path:     4.17.3 → 4.18.1 (2 hops") || !strings.Contains(string(b), "hop 1: 4.17.3 ") {
		t.Errorf("inspect: %v\n%s", err, b)
	}

	// verify prints the command that approves each release of the path.
	b, err = exec.Command(ferryBin, "bundle", "verify", "--quiet", tarPath).Output()
	for _, rel := range []string{relA, relB} {
		if key, _ := cluster.ApprovalKey(rel); err != nil || !strings.Contains(string(b), `{"data":{"`+key+`":"approved"}}`) {
			t.Errorf("verify: %v\n%s\nwant the command approving %s", err, b, rel)
		}
	}

	relD, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.20.0", PayloadImages: 2})
	gap := filepath.Join(dir, "gap")
	code, stderr = ferry(t, dir, "bundle", "create", "--quiet", "--release", relA, "--release", relB, "--release", relD,
		"--mirror", reg.Mirror(), "--cert-dir", reg.CertsDir, "--output", gap, "--signature-store", "")
	if code != 1 || !strings.Contains(stderr, "skips 4.19") {
		t.Errorf("a path with a gap: exit %d, stderr:\n%s\nwant exit 1 naming 4.19", code, stderr)
	}
	noBundle(t, gap)
}
