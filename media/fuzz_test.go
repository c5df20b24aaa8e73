package media

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzIsBundleTar feeds arbitrary first bytes of a raw stick to the probe
// that decides whether the device holds a bundle: it never panics, reads
// at most 64 KiB, and says yes only when the first entry really is a
// regular file named metadata.json.
func FuzzIsBundleTar(f *testing.F) {
	var good bytes.Buffer
	tw := tar.NewWriter(&good)
	tw.WriteHeader(&tar.Header{Name: metadataName, Typeflag: tar.TypeReg, Mode: 0o644, Size: 2, Format: tar.FormatPAX,
		PAXRecords: map[string]string{"comment": strings.Repeat("x", 1000)}})
	tw.Write([]byte("{}"))
	tw.Close()
	f.Add(good.Bytes())
	var link bytes.Buffer
	tw = tar.NewWriter(&link)
	tw.WriteHeader(&tar.Header{Name: metadataName, Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"})
	tw.Close()
	f.Add(link.Bytes())
	f.Add(bytes.Repeat([]byte{0}, 1024))
	f.Add([]byte("FAT32   "))
	f.Fuzz(func(t *testing.T, b []byte) {
		r := &countingReader{r: bytes.NewReader(b)}
		ok, err := isBundleTar(r)
		if err != nil {
			t.Fatalf("error from an in-memory reader: %v", err)
		}
		if r.n > 64<<10 {
			t.Fatalf("read %d bytes, want at most 64 KiB", r.n)
		}
		if ok {
			hdr, herr := tar.NewReader(bytes.NewReader(b)).Next()
			if herr != nil || hdr.Name != metadataName || hdr.Typeflag != tar.TypeReg {
				t.Fatalf("said bundle, but the first entry is %+v (%v)", hdr, herr)
			}
		}
	})
}

type countingReader struct {
	r *bytes.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// FuzzReadMountInfo parses arbitrary mountinfo text (mount points may hold
// any byte a stick's label or a user puts there, escaped by the kernel):
// no panic, and escapes undone only where they are valid octal.
func FuzzReadMountInfo(f *testing.F) {
	f.Add([]byte("36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n"))
	f.Add([]byte("50 1 7:3 / /run/ferry/media/loop3\\040x rw,nosuid,nodev,noexec - vfat /dev/loop3 ro\n"))
	f.Add([]byte("1 2 3\n\n- - - - - -\n"))
	f.Add([]byte("a b c d \\777\\1 e - \n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(t.TempDir(), "mountinfo")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		ents, err := readMountInfo(p)
		if err != nil {
			return
		}
		for _, e := range ents {
			if len(e.point) > len(b) {
				t.Fatalf("mount point %q longer than the input", e.point)
			}
		}
	})
}
