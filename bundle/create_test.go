package bundle_test

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/test/fixture"
)

// createFrom makes CreateOptions that fetch reg's quay.io/... images.
func createFrom(t *testing.T, reg *fixture.Registry, release string, extra ...string) bundle.CreateOptions {
	t.Helper()
	tr, err := bundle.NewTransport(reg.CertsDir, true)
	if err != nil {
		t.Fatal(err)
	}
	return bundle.CreateOptions{
		Release:     release,
		ExtraImages: extra,
		Mirrors:     []bundle.Mirror{{Prefix: "quay.io/", Location: reg.Host + "/"}},
		Transport:   tr,
		OutputDir:   t.TempDir(),
		Created:     time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC),
	}
}

func tarNames(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var names []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
}

func TestCreate_WritesBundleOfReleaseAndExtras(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, payload := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 20})
	byDigest := reg.PushImage(t, "my-company/agent", "")
	reg.PushImage(t, "my-company/app", "v1")
	o := createFrom(t, reg, release, "quay.io/my-company/app:v1", byDigest)
	res, err := bundle.Create(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	m := res.Metadata
	if m.Version != "4.13.7" || m.Arch != "x86_64" || m.Release != release {
		t.Fatalf("metadata %+v", m)
	}
	if len(m.Images) != 22 {
		t.Fatalf("%d images, want 22: %v", len(m.Images), m.Images)
	}
	for i, p := range payload {
		if m.Images[i] != p {
			t.Fatalf("images[%d] = %s, want %s", i, m.Images[i], p)
		}
	}
	if !strings.HasPrefix(m.Images[20], "quay.io/my-company/app:v1@sha256:") || m.Images[21] != byDigest {
		t.Fatalf("extras: %v", m.Images[20:])
	}
	if filepath.Base(res.TarPath) != "upgrade-4.13.7-x86_64.tar" {
		t.Fatalf("tar %s", res.TarPath)
	}
	sha, err := os.ReadFile(res.SHA256Path)
	if err != nil || string(sha) != strings.TrimPrefix(res.Digest, "sha256:")+"  upgrade-4.13.7-x86_64.tar\n" {
		t.Fatalf(".sha256 %q %v", sha, err)
	}
	names := tarNames(t, res.TarPath)
	if names[0] != bundle.MetadataName {
		t.Fatalf("first entry %s", names[0])
	}
	if _, err := os.Stat(res.WorkDir); !os.IsNotExist(err) {
		t.Fatalf("work dir left behind: %v", err)
	}
	entries, _ := os.ReadDir(o.OutputDir)
	if len(entries) != 2 {
		t.Fatalf("output holds %d files, want the tar and .sha256", len(entries))
	}
	t.Logf("%d entries, %d bytes, %d blobs fetched", len(names), res.TarSize, res.BlobsFetched)
}
