// Package bigbundle writes large synthetic bundles (incompressible blobs,
// each stored under its own digest) for benchmarks and stress tests.
package bigbundle

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/imagetree"
)

// Make writes upgrade-0.1.<MiB>-x86_64.tar and its .sha256 in out, or
// reuses them, and returns the tar's path. Every blob's content hashes to
// the digest in its path, so CheckTree can tell a complete tree.
func Make(size, blobSize int64, out string) (string, error) {
	version := fmt.Sprintf("0.1.%d", size>>20) // 0.1: complete images (0.0 had bare blobs)
	name := "upgrade-" + version + "-x86_64"
	tarPath := filepath.Join(out, name+".tar")
	if _, err := os.Stat(strings.TrimSuffix(tarPath, ".tar") + ".sha256"); err == nil {
		return tarPath, nil
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	tree := filepath.Join(out, "tree-"+version)
	os.RemoveAll(tree)
	defer os.RemoveAll(tree)
	rng := rand.NewChaCha8([32]byte{1})
	small := imagetree.Tree{} // configs, manifests and links
	var images []string
	for i := int64(0); i*blobSize < size; i++ {
		n := min(blobSize, size-i*blobSize)
		buf := make([]byte, n)
		rng.Read(buf)
		sum := sha256.Sum256(buf)
		h := hex.EncodeToString(sum[:])
		dir := filepath.Join(tree, "docker/registry/v2/blobs/sha256", h[:2], h)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(dir, "data"), buf, 0o644); err != nil {
			return "", err
		}
		images = append(images, small.AddOver(fmt.Sprintf("quay.io/bench/img-%d", i), "sha256:"+h, n))
	}
	for p, b := range small {
		p = filepath.Join(tree, bundle.RegistryRoot, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return "", err
		}
	}
	meta := &bundle.Metadata{Version: version, Arch: "x86_64", Release: images[0], Images: images[1:],
		Created: time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)}
	f, err := os.Create(tarPath + ".partial")
	if err != nil {
		return "", err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	digest, _, err := bundle.WriteTar(w, meta, tree)
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	if err := os.Rename(tarPath+".partial", tarPath); err != nil {
		return "", err
	}
	line := bundle.FormatSHA256File(string(digest), filepath.Base(tarPath))
	if err := os.WriteFile(strings.TrimSuffix(tarPath, ".tar")+".sha256", []byte(line), 0o644); err != nil {
		return "", err
	}
	return tarPath, nil
}

// Blobs is how many blobs a Make bundle holds: per image, its big layer,
// a config and a manifest.
func Blobs(size, blobSize int64) int { return 3 * int((size+blobSize-1)/blobSize) }

// CheckTree verifies an extracted tree made from a Make bundle: every blob
// is there and hashes to its name, and the count matches (each image: its
// big layer, a config and a manifest).
func CheckTree(dir string, size, blobSize int64) error {
	want := Blobs(size, blobSize)
	n := 0
	err := filepath.WalkDir(filepath.Join(dir, "docker/registry/v2/blobs/sha256"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		if hex.EncodeToString(sum[:]) != filepath.Base(filepath.Dir(p)) {
			return fmt.Errorf("%s: content does not match its digest", p)
		}
		n++
		return nil
	})
	if err != nil {
		return err
	}
	if n != want {
		return fmt.Errorf("%d blobs in %s, want %d", n, dir, want)
	}
	return nil
}
