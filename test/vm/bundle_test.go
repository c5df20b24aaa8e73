package vm

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/test/fixture"
)

// testBundle is a bundle on the host, ready to be put on a stick.
type testBundle struct {
	Tar    string // upgrade-<version>-<arch>.tar
	SHA    string // its .sha256
	Digest string // sha256:<hex>
	Meta   *bundle.Metadata
	Refs   []string // release and every image: what must end up pinned
	Bytes  int64
	Via    string // how it was made
	// Command and Output are the `ferry bundle create` run, when it ran.
	Command string
	Output  string
}

// makeBundle makes a bundle of a synthetic release with n payload images of
// size random bytes each, served by a fixture registry: with
// `ferry bundle create` when the binary has it, else with the bundle
// package's writer over the registry's storage tree (the same layout).
func makeBundle(t *testing.T, ctx context.Context, e *env, version string, n int, size int64) *testBundle {
	t.Helper()
	start := time.Now()
	reg := fixture.NewRegistry(t)
	release, payload := reg.PushRelease(t, fixture.ReleaseOptions{Version: version, PayloadImages: n, ImageSize: size, Seed: uint64(time.Now().UnixNano())})
	out := t.TempDir()
	b := &testBundle{}
	if hasCommand(e.bins.Ferry, "bundle", "create") {
		b.Via = "ferry bundle create"
		// The release's signature from a store, as Red Hat's serves it.
		args := []string{"bundle", "create", "--release", release,
			"--mirror", reg.Mirror(), "--cert-dir", reg.CertsDir, "--output", out, "--signature-store", reg.SignatureStore(t)}
		b.Command = "ferry " + strings.Join(args, " ")
		o, err := exec.CommandContext(ctx, e.bins.Ferry, args...).CombinedOutput()
		b.Output = string(o)
		if err != nil {
			t.Fatalf("ferry bundle create: %v\n%s", err, o)
		}
	} else {
		b.Via = "bundle.WriteTar over the fixture registry's tree (no `ferry bundle create` yet)"
		meta := &bundle.Metadata{Version: version, Arch: "x86_64", Release: release, Images: payload,
			Created: time.Now().UTC().Truncate(time.Second)}
		p := filepath.Join(out, meta.Name()+".tar")
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		d, _, err := bundle.WriteTar(f, meta, reg.Dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		hexd := d.Encoded()
		if err := os.WriteFile(filepath.Join(out, meta.Name()+".sha256"),
			[]byte(bundle.FormatSHA256File(hexd, meta.Name()+".tar")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tars, _ := filepath.Glob(filepath.Join(out, "upgrade-*.tar"))
	if len(tars) != 1 {
		t.Fatalf("bundle: want one upgrade-*.tar in %s, got %v", out, tars)
	}
	b.Tar = tars[0]
	b.SHA = strings.TrimSuffix(b.Tar, ".tar") + ".sha256"
	meta, err := bundle.InspectFile(b.Tar)
	if err != nil {
		t.Fatal(err)
	}
	b.Meta = meta
	b.Refs = append([]string{meta.Release}, meta.Images...)
	sum, err := hashFile(b.Tar)
	if err != nil {
		t.Fatal(err)
	}
	b.Digest = "sha256:" + sum
	st, _ := os.Stat(b.Tar)
	b.Bytes = st.Size()
	t.Logf("bundle %s: %d images, %.1f MiB, %s, made in %.1fs by %s", filepath.Base(b.Tar), len(b.Refs),
		float64(b.Bytes)/(1<<20), b.Digest[:19], time.Since(start).Seconds(), b.Via)
	return b
}

func hasCommand(bin string, args ...string) bool {
	return exec.Command(bin, append(args, "-h")...).Run() == nil
}

// tampered copies b's tar and .sha256 into a new directory with one byte
// of the largest blob's data flipped: the tar still parses and its
// metadata is intact, only the digest is wrong.
func (b *testBundle) tampered(t *testing.T) (tarPath, shaPath string) {
	t.Helper()
	data, err := os.ReadFile(b.Tar)
	if err != nil {
		t.Fatal(err)
	}
	off, err := largestEntryData(data)
	if err != nil {
		t.Fatal(err)
	}
	data[off] ^= 0x01
	dir := t.TempDir()
	tarPath = filepath.Join(dir, filepath.Base(b.Tar))
	shaPath = filepath.Join(dir, filepath.Base(b.SHA))
	if err := os.WriteFile(tarPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	sha, err := os.ReadFile(b.SHA)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(shaPath, sha, 0o644); err != nil {
		t.Fatal(err)
	}
	return tarPath, shaPath
}

// largestEntryData is the offset of the middle of the largest regular
// file's data in a tar.
func largestEntryData(data []byte) (int64, error) {
	cr := &countReader{r: bytes.NewReader(data)}
	tr := tar.NewReader(cr)
	var best, bestSize int64
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
		if h.Typeflag == tar.TypeReg && h.Size > bestSize {
			best, bestSize = cr.n+h.Size/2, h.Size
		}
	}
	if bestSize == 0 {
		return 0, fmt.Errorf("no regular file in the tar")
	}
	return best, nil
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
