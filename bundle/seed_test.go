package bundle_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/imagetree"
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

// seedBundle is seedMetadata naming the images of a complete tree.
func seedBundle() (meta string, tree imagetree.Tree) {
	tree = imagetree.Tree{}
	release := tree.Add("quay.io/openshift-release-dev/ocp-release", imagetree.Layer("release", 0))
	image := tree.Add("quay.io/openshift-release-dev/ocp-v4.0-art-dev", imagetree.Layer("image", 6000))
	hexOf := func(ref string) string { _, d, _ := strings.Cut(ref, "@sha256:"); return d }
	meta = strings.ReplaceAll(seedMetadata, strings.Repeat("ab", 32), hexOf(release))
	return strings.ReplaceAll(meta, strings.Repeat("cd", 32), hexOf(image)), tree
}

// addTree writes tree's files to tw, sorted.
func addTree(tw *tar.Writer, tree imagetree.Tree) {
	for _, n := range slices.Sorted(maps.Keys(tree)) {
		tw.WriteHeader(&tar.Header{Name: bundle.RegistryRoot + n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(tree[n]))})
		tw.Write(tree[n])
	}
}

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
	meta, tree := seedBundle()
	meta = strings.Replace(meta, `"size": "16 GiB",`, ``, 1)
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	add := func(name, body string) {
		tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
		tw.Write([]byte(body))
	}
	add("metadata.json", meta)
	addTree(tw, tree)
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

// A seed-shaped tar made by GNU tar ends with zero record padding, which
// sha256sum covers: accepted, the digest is the file's; anything but zeros
// after the end marker is still refused.
func TestExtract_SeedShapedGNUPadding(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tail   []byte
		wantOK bool
	}{
		{"zeros to the 10 KiB record", nil, true},
		{"a non-zero byte in the padding", []byte{0, 0, 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var b bytes.Buffer
			tw := tar.NewWriter(&b)
			meta, tree := seedBundle()
			tw.WriteHeader(&tar.Header{Name: "metadata.json", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(meta))})
			tw.Write([]byte(meta))
			addTree(tw, tree)
			tw.Close()
			data := append(b.Bytes(), make([]byte, 10240-b.Len()%10240)...)
			if tc.tail != nil {
				copy(data[len(data)-len(tc.tail):], tc.tail)
			}
			tarPath := filepath.Join(dir, "upgrade-4.13.7-x86_64.tar")
			os.WriteFile(tarPath, data, 0o644)
			sum := sha256.Sum256(data)
			os.WriteFile(filepath.Join(dir, "upgrade-4.13.7-x86_64.sha256"), []byte(hex.EncodeToString(sum[:])+"  upgrade-4.13.7-x86_64.tar\n"), 0o644)
			src, _ := bundle.FindSource(tarPath, "")
			var ix bundle.Index
			res, err := bundle.Extract(t.Context(), src, filepath.Join(dir, "out"), bundle.Options{Index: &ix})
			if !tc.wantOK {
				if !errors.Is(err, bundle.ErrInvalid) || !strings.Contains(err.Error(), "follow the end") {
					t.Fatalf("got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(res.Digest) != "sha256:"+hex.EncodeToString(sum[:]) || res.TarSize != int64(len(data)) || ix.Size != int64(len(data)) {
				t.Fatalf("digest %s size %d index %d; want the whole file's", res.Digest, res.TarSize, ix.Size)
			}
			// The tar served to peers, regenerated from the tree, is the file.
			got := make([]byte, len(data))
			if _, err := ix.ReaderAt(filepath.Join(dir, "out")).ReadAt(got, 0); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatal("the regenerated tar differs from the file")
			}
		})
	}
}

// The same GNU tar dd'd onto a stick: the device goes on past the record
// padding, and has no .sha256. When the approved digest is the file's
// (sha256sum of the tar, padding included), the padding is the bundle's;
// when it is the digest up to the end marker (a tar with no padding on a
// zeroed stick), it is not. Anything else is refused.
func TestVerify_SeedShapedGNUTarOnARawDevice(t *testing.T) {
	meta, tree := seedBundle()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: "metadata.json", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(meta))})
	tw.Write([]byte(meta))
	addTree(tw, tree)
	tw.Close()
	bare := b.Bytes()
	file := append(bytes.Clone(bare), make([]byte, 10240-len(bare)%10240)...)
	digestOf := func(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }
	dev := filepath.Join(t.TempDir(), "sdb")
	os.WriteFile(dev, append(bytes.Clone(file), bytes.Repeat([]byte{0xAB}, 1<<20)...), 0o644)
	src := bundle.Source{Path: dev, Raw: true}

	for _, tc := range []struct {
		name     string
		approved string
		size     int
	}{
		{"approved as sha256sum of the GNU tar", digestOf(file), len(file)},
		{"approved up to the end marker", digestOf(bare), len(bare)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ix bundle.Index
			out := filepath.Join(t.TempDir(), "out")
			res, err := bundle.Extract(t.Context(), src, out, bundle.Options{Policy: bundle.Policy{ApprovedDigests: []string{tc.approved}}, Index: &ix})
			if err != nil {
				t.Fatal(err)
			}
			if string(res.Digest) != tc.approved || res.TarSize != int64(tc.size) || ix.Size != int64(tc.size) {
				t.Fatalf("digest %s size %d index %d; want %s %d", res.Digest, res.TarSize, ix.Size, tc.approved, tc.size)
			}
			got := make([]byte, tc.size)
			if _, err := ix.ReaderAt(out).ReadAt(got, 0); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			if !bytes.Equal(got, file[:tc.size]) {
				t.Fatal("the tar served to peers differs from the approved bytes")
			}
		})
	}
	other := bytes.Clone(file)
	other[len(other)-1] = 1
	if _, err := bundle.Verify(t.Context(), src, bundle.Options{Policy: bundle.Policy{ApprovedDigests: []string{digestOf(other)}}}); !errors.Is(err, bundle.ErrNotApproved) {
		t.Fatalf("another digest: %v", err)
	}
}
