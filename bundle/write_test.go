package bundle

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func writeTreeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, "docker/registry/v2", name)
		if err := os.MkdirAll(filepath.Dir(p), 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

var writeTree = map[string]string{
	"blobs/sha256/ab/" + strings.Repeat("ab", 32) + "/data":                            strings.Repeat("x", 3000),
	"blobs/sha256/cd/" + strings.Repeat("cd", 32) + "/data":                            "{}",
	"repositories/a-b/_layers/sha256/" + strings.Repeat("ab", 32) + "/link":            "sha256:" + strings.Repeat("ab", 32),
	"repositories/a/_manifests/revisions/sha256/" + strings.Repeat("cd", 32) + "/link": "sha256:" + strings.Repeat("cd", 32),
	"repositories/a/_manifests/tags/v1/current/link":                                   "sha256:" + strings.Repeat("cd", 32),
}

func testMeta() *Metadata {
	return &Metadata{
		Version: "4.13.7", Arch: "x86_64",
		Release: "quay.io/openshift-release-dev/ocp-release@sha256:" + strings.Repeat("cd", 32),
		Images:  []string{"quay.io/my/app:v1@sha256:" + strings.Repeat("ab", 32)},
		Created: time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC),
	}
}

func TestWriteTar_SameInputsSameBytes(t *testing.T) {
	var digests []string
	for range 2 {
		root := t.TempDir()
		writeTreeFiles(t, root, writeTree)
		var buf bytes.Buffer
		dg, n, err := WriteTar(&buf, testMeta(), root)
		d := string(dg)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(buf.Bytes())
		if want := "sha256:" + hex.EncodeToString(sum[:]); d != want || n != int64(buf.Len()) {
			t.Fatalf("returned %s %d, wrote %s %d", d, n, want, buf.Len())
		}
		digests = append(digests, d)
	}
	if digests[0] != digests[1] {
		t.Fatalf("same tree and metadata gave %s and %s", digests[0], digests[1])
	}
}

func TestWriteTar_MetadataFirstSortedCanonicalNoTrailingBytes(t *testing.T) {
	root := t.TempDir()
	writeTreeFiles(t, root, writeTree)
	meta := testMeta()
	var buf bytes.Buffer
	if _, _, err := WriteTar(&buf, meta, root); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	var names []string
	var files int64
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(meta.Created) {
			t.Errorf("%s: header not canonical: %+v", h.Name, h)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if h.Mode != 0o755 || !strings.HasSuffix(h.Name, "/") {
				t.Errorf("dir %s mode %o", h.Name, h.Mode)
			}
		case tar.TypeReg:
			if h.Mode != 0o644 {
				t.Errorf("file %s mode %o", h.Name, h.Mode)
			}
			files += h.Size
		default:
			t.Errorf("%s: type %c", h.Name, h.Typeflag)
		}
		if h.Name == MetadataName {
			b, _ := io.ReadAll(tr)
			m, err := ParseMetadata(b)
			if err != nil {
				t.Fatal(err)
			}
			if m.SizeBytes != meta.SizeBytes {
				t.Errorf("metadata.json says %d, WriteTar set %d", m.SizeBytes, meta.SizeBytes)
			}
		}
	}
	if names[0] != MetadataName {
		t.Fatalf("first entry %q", names[0])
	}
	for i := 2; i < len(names); i++ {
		if names[i-1] >= names[i] {
			t.Fatalf("not sorted: %q then %q", names[i-1], names[i])
		}
	}
	for _, n := range names[1:] {
		if !strings.HasPrefix(n, RegistryRoot) || n == RegistryRoot {
			t.Fatalf("entry %q is not below %s", n, RegistryRoot)
		}
	}
	if files != meta.SizeBytes {
		t.Fatalf("files add up to %d, sizeBytes %d", files, meta.SizeBytes)
	}
	// The archive ends right after the two zero blocks: the last 1024 bytes
	// are zero, the 512 before them are not all zero, and the length is a
	// multiple of 512 (no record padding to 10240).
	b := buf.Bytes()
	if len(b)%512 != 0 || !bytes.Equal(b[len(b)-1024:], make([]byte, 1024)) {
		t.Fatalf("bad end of archive (len %d)", len(b))
	}
	if bytes.Equal(b[len(b)-1536:len(b)-1024], make([]byte, 512)) {
		t.Fatal("more than two zero blocks at the end")
	}
}

func TestWriteTar_RefusesSpecialFiles(t *testing.T) {
	for name, mk := range map[string]func(p string) error{
		"symlink": func(p string) error { return os.Symlink("/etc/passwd", p) },
		"fifo":    func(p string) error { return syscall.Mkfifo(p, 0o644) },
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			writeTreeFiles(t, root, writeTree)
			if err := mk(filepath.Join(root, "docker/registry/v2/blobs/evil")); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			_, _, err := WriteTar(&buf, testMeta(), root)
			if !errors.Is(err, ErrTreeEntry) {
				t.Fatalf("got %v, want ErrTreeEntry", err)
			}
		})
	}
}

func TestWriteTar_RefusesInvalidMetadataAndMissingTree(t *testing.T) {
	root := t.TempDir()
	writeTreeFiles(t, root, writeTree)
	m := testMeta()
	m.Arch = "amd64"
	if _, _, err := WriteTar(io.Discard, m, root); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad arch: got %v", err)
	}
	if _, _, err := WriteTar(io.Discard, testMeta(), t.TempDir()); err == nil {
		t.Fatal("empty root: no error")
	}
}

func TestFormatSHA256File(t *testing.T) {
	h := strings.Repeat("0f", 32)
	for _, in := range []string{h, "sha256:" + h} {
		if got, want := FormatSHA256File(in, "upgrade-4.13.7-x86_64.tar"), h+"  upgrade-4.13.7-x86_64.tar\n"; got != want {
			t.Fatalf("got %q want %q", got, want)
		}
	}
}

func TestRepoPaths(t *testing.T) {
	for _, tc := range []struct {
		name string
		refs []string
		want map[string]string
	}{
		{"host stripped", []string{"quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + strings.Repeat("a", 64), "quay.io/my/app:v1@sha256:" + strings.Repeat("b", 64)},
			map[string]string{"quay.io/openshift-release-dev/ocp-v4.0-art-dev": "openshift-release-dev/ocp-v4.0-art-dev", "quay.io/my/app": "my/app"}},
		{"colliding paths keep their hosts", []string{"a.io/team/app", "localhost:5000/team/app", "c.io/other"},
			map[string]string{"a.io/team/app": "a.io/team/app", "localhost:5000/team/app": "localhost-5000/team/app", "c.io/other": "other"}},
		{"a host-kept path colliding with a stripped one", []string{"a.io/x", "b.io/x", "c.io/a.io/x"},
			map[string]string{"a.io/x": "a.io/x", "b.io/x": "b.io/x", "c.io/a.io/x": "c.io/a.io/x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := RepoPaths(tc.refs)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v", got)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s: got %q want %q", k, got[k], v)
				}
			}
		})
	}
	if RepoPath("quay.io/a/b") != "a/b" || RepoPath("docker.io/library/busybox:1@sha256:"+strings.Repeat("a", 64)) != "library/busybox" {
		t.Fatal("RepoPath")
	}
}
