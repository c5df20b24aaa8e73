package bundle_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
)

// The seed's own example of metadata.json: no formatVersion, no sizeBytes.
const seedMetadata = `{
  "version": "4.13.7",
  "arch": "x86_64",
  "size": "16 GiB",
  "release": "quay.io/openshift-release-dev/ocp-release@sha256:` + "abababababababababababababababababababababababababababababababab" + `",
  "images": [
    "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:` + "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd" + `",
    "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:` + "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd" + `"
  ]
}`

func TestParseMetadata_SeedShapeIsReadAndSaysSo(t *testing.T) {
	m, err := bundle.ParseMetadata([]byte(seedMetadata))
	if err != nil {
		t.Fatal(err)
	}
	if m.Shape != bundle.ShapeSeed || m.SizeBytes != 16<<30 || len(m.Images) != 1 || len(m.Duplicates) != 1 {
		t.Fatalf("%+v", m)
	}
	// ferry's own shape stays strict: a duplicate there is invalid.
	strict := strings.Replace(seedMetadata, "{", `{"formatVersion": 1, "sizeBytes": 17179869184,`, 1)
	if _, err := bundle.ParseMetadata([]byte(strict)); !errors.Is(err, bundle.ErrInvalid) || !strings.Contains(err.Error(), "listed twice") {
		t.Fatalf("ferry shape with a duplicate: %v", err)
	}
}

func TestParseMetadata_SeedSizes(t *testing.T) {
	for in, want := range map[string]int64{"16 GiB": 16 << 30, "3.9GB": 3_900_000_000, "512 MiB": 512 << 20, "1024": 1024, "": 0, "lots": 0} {
		m := strings.Replace(seedMetadata, `"16 GiB"`, `"`+in+`"`, 1)
		got, err := bundle.ParseMetadata([]byte(m))
		if err != nil || got.SizeBytes != want {
			t.Errorf("size %q: %d, %v; want %d", in, got.SizeBytes, err, want)
		}
	}
}

// A seed-shaped bundle with no size at all extracts, its tar's length
// serving the space checks.
func TestExtract_SeedShapedBundle(t *testing.T) {
	dir := t.TempDir()
	meta := strings.Replace(seedMetadata, `"size": "16 GiB",`, ``, 1)
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	add := func(name, body string) {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
		tw.Write([]byte(body))
	}
	add("metadata.json", meta)
	add("docker/registry/v2/blobs/sha256/aa/aabb/data", strings.Repeat("layer ", 1000))
	tw.Close()
	tarPath := filepath.Join(dir, "upgrade-4.13.7-x86_64.tar")
	os.WriteFile(tarPath, b.Bytes(), 0o644)
	sum := sha256.Sum256(b.Bytes())
	os.WriteFile(filepath.Join(dir, "upgrade-4.13.7-x86_64.sha256"), []byte(hex.EncodeToString(sum[:])+"  upgrade-4.13.7-x86_64.tar\n"), 0o644)
	src, err := bundle.FindSource(tarPath, "")
	if err != nil {
		t.Fatal(err)
	}
	res, err := bundle.Extract(t.Context(), src, filepath.Join(dir, "out"), bundle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Metadata.Shape != bundle.ShapeSeed || res.Metadata.SizeBytes != int64(b.Len()) {
		t.Fatalf("metadata %+v", res.Metadata)
	}
}
