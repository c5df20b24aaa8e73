// Command mkbig writes a large synthetic bundle (incompressible blobs) for
// the benchmarks: upgrade-<version>-x86_64.tar and its .sha256 in -out.
// An existing bundle of the same size is reused.
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/bundle"
)

func main() {
	size := flag.Int64("size-mib", 2048, "bundle size in MiB")
	blob := flag.Int64("blob-mib", 32, "size of each blob in MiB")
	out := flag.String("out", "/var/tmp/ferry-bench", "output directory")
	flag.Parse()
	if err := run(*size<<20, *blob<<20, *out); err != nil {
		fmt.Fprintln(os.Stderr, "mkbig:", err)
		os.Exit(1)
	}
}

func run(size, blobSize int64, out string) error {
	version := fmt.Sprintf("0.0.%d", size>>20)
	name := "upgrade-" + version + "-x86_64"
	tarPath := filepath.Join(out, name+".tar")
	if _, err := os.Stat(strings.TrimSuffix(tarPath, ".tar") + ".sha256"); err == nil {
		fmt.Println(tarPath)
		return nil
	}
	tree := filepath.Join(out, "tree-"+version)
	os.RemoveAll(tree)
	defer os.RemoveAll(tree)
	rng := rand.NewChaCha8([32]byte{1})
	var images []string
	for i := int64(0); i*blobSize < size; i++ {
		n := min(blobSize, size-i*blobSize)
		buf := make([]byte, n)
		rng.Read(buf)
		sum := sha256.Sum256(buf)
		h := hex.EncodeToString(sum[:])
		dir := filepath.Join(tree, "docker/registry/v2/blobs/sha256", h[:2], h)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "data"), buf, 0o644); err != nil {
			return err
		}
		images = append(images, "quay.io/bench/img@sha256:"+h)
	}
	meta := &bundle.Metadata{Version: version, Arch: "x86_64", Release: images[0], Images: images[1:],
		Created: time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)}
	f, err := os.Create(tarPath + ".partial")
	if err != nil {
		return err
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
		return err
	}
	if err := os.Rename(tarPath+".partial", tarPath); err != nil {
		return err
	}
	line := bundle.FormatSHA256File(strings.TrimPrefix(digest, "sha256:"), filepath.Base(tarPath))
	if err := os.WriteFile(strings.TrimSuffix(tarPath, ".tar")+".sha256", []byte(line), 0o644); err != nil {
		return err
	}
	fmt.Println(tarPath)
	return nil
}
