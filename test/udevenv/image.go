package udevenv

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// File is one file to put at the root of an image: its content is Data,
// or the file at Path (for big bundles made on disk).
type File struct {
	Name string
	Data []byte
	Path string
}

// size is the file's length.
func (f File) size(t testing.TB) int64 {
	if f.Path == "" {
		return int64(len(f.Data))
	}
	st, err := os.Stat(f.Path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// materialize returns a path holding the file's content, inside dir.
func (f File) materialize(t testing.TB, dir string) string {
	t.Helper()
	if f.Path != "" {
		return f.Path
	}
	p := filepath.Join(dir, f.Name)
	if err := os.WriteFile(p, f.Data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func imageSize(t testing.TB, files []File, overhead int64) int64 {
	var total int64
	for _, f := range files {
		total += f.size(t)
	}
	size := total + total/8 + overhead
	return (size + 1<<20 - 1) &^ (1<<20 - 1)
}

// VFATImage makes a FAT image (mkfs.vfat, files copied in with mcopy: no
// mount needed) labelled label, holding files at its root.
func VFATImage(t testing.TB, label string, files ...File) string {
	t.Helper()
	dir := t.TempDir()
	img := filepath.Join(dir, "vfat.img")
	if err := os.Truncate(mustCreate(t, img), imageSize(t, files, 8<<20)); err != nil {
		t.Fatal(err)
	}
	Run(t, "mkfs.vfat", "-n", label, img)
	src := filepath.Join(dir, "src")
	os.Mkdir(src, 0o755)
	for _, f := range files {
		Run(t, "mcopy", "-i", img, f.materialize(t, src), "::/"+f.Name)
	}
	return img
}

// Ext4Image makes an ext4 image (mkfs.ext4 -d) labelled label, holding
// files at its root.
func Ext4Image(t testing.TB, label string, files ...File) string {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		dst := filepath.Join(root, f.Name)
		if f.Path != "" {
			if os.Link(f.Path, dst) != nil {
				copyFile(t, f.Path, dst)
			}
			continue
		}
		if err := os.WriteFile(dst, f.Data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img := filepath.Join(dir, "ext4.img")
	size := imageSize(t, files, 16<<20)
	Run(t, "mkfs.ext4", "-q", "-F", "-L", label, "-d", root, img, fmt.Sprintf("%dk", size>>10))
	return img
}

// RawImage makes an image holding content on the bare device, as
// `dd of=/dev/sdX` would: a raw bundle. It is padded with zeros to a
// whole number of MiB (loop devices use whole sectors).
func RawImage(t testing.TB, content File) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "raw.img")
	out := mustCreateFile(t, img)
	defer out.Close()
	var r io.Reader = bytes.NewReader(content.Data)
	if content.Path != "" {
		in, err := os.Open(content.Path)
		if err != nil {
			t.Fatal(err)
		}
		defer in.Close()
		r = in
	}
	n, err := io.Copy(out, r)
	if err != nil {
		t.Fatal(err)
	}
	if err := out.Truncate((n + 1<<20 - 1) &^ (1<<20 - 1)); err != nil {
		t.Fatal(err)
	}
	return img
}

// BlankImage is an image of size bytes of zeros: a stick with nothing on it.
func BlankImage(t testing.TB, size int64) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "blank.img")
	if err := os.Truncate(mustCreate(t, img), size); err != nil {
		t.Fatal(err)
	}
	return img
}

// SmallBundleTar is a tar shaped like a bundle (metadata.json first, then
// one file under docker/registry/v2/), for tests of the media layer that
// do not verify bundles. The lead's agent tests use real bundles.
func SmallBundleTar(t testing.TB, version string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, data []byte) {
		h := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg,
			ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
		}
	}
	add("metadata.json", []byte(`{"formatVersion":1,"version":"`+version+`","arch":"x86_64"}`))
	add("docker/registry/v2/blobs/sha256/00/0000/data", bytes.Repeat([]byte("ferry "), 2000))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func mustCreate(t testing.TB, path string) string {
	t.Helper()
	mustCreateFile(t, path).Close()
	return path
}

func mustCreateFile(t testing.TB, path string) *os.File {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func copyFile(t testing.TB, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out := mustCreateFile(t, dst)
	defer out.Close()
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
}

// Run runs a command, failing the test with its output if it fails, and
// returns its trimmed stdout.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := run(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func run(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}
