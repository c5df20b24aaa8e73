package udev

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParseMessage feeds arbitrary netlink datagrams (udev's libudev
// framing or the kernel's ACTION@DEVPATH form) to the parser: it never
// panics, and an event it accepts is a block add/change/remove with an
// absolute device path.
func FuzzParseMessage(f *testing.F) {
	f.Add(udevMessage("ACTION=change", "DEVPATH=/devices/virtual/block/loop3", "SUBSYSTEM=block",
		"DEVNAME=/dev/loop3", "DEVTYPE=disk", "DISKSEQ=11", "MAJOR=7", "MINOR=3",
		"ID_FS_TYPE=vfat", "ID_FS_LABEL=STICK", "SEQNUM=840"))
	f.Add(udevMessage("ACTION=add", "DEVPATH=/devices/pci/usb/block/sdb/sdb1", "SUBSYSTEM=block",
		"DEVNAME=sdb1", "DEVTYPE=partition", "ID_FS_LABEL=a=b", "MAJOR=8", "MINOR=17"))
	f.Add(udevMessage("ACTION=remove", "SUBSYSTEM=block", "DEVNAME=/dev/sdb"))
	f.Add(udevMessage("ACTION=add", "SUBSYSTEM=usb", "DEVNAME=bus/usb/001/002"))
	f.Add([]byte("add@/devices/virtual/block/loop0\x00ACTION=add\x00DEVPATH=/devices/virtual/block/loop0\x00SUBSYSTEM=block\x00DEVNAME=loop0\x00DISKSEQ=x\x00"))
	f.Add([]byte("libudev\x00abc"))
	f.Add([]byte("libudev\x00\xfe\xed\xca\xfe\x28\x00\x00\x00\xff\xff\xff\xff"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, msg []byte) {
		sys := t.TempDir()
		ev, ok, err := parseMessage(msg, sys)
		if err != nil || !ok {
			if ok {
				t.Fatalf("ok with error %v", err)
			}
			return
		}
		switch ev.Action {
		case Add, Change, Remove:
		default:
			t.Fatalf("accepted action %q", ev.Action)
		}
		if !strings.HasPrefix(ev.DevPath, "/") {
			t.Fatalf("device path %q is not absolute", ev.DevPath)
		}
		if ev.Size < 0 {
			t.Fatalf("negative size %d", ev.Size)
		}
	})
}

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
