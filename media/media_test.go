package media

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferry-edge/ferry/internal/fakesys"
	"github.com/ferry-edge/ferry/udev"
)

func TestFindCandidates(t *testing.T) {
	dir := t.TempDir()
	fakesys.Write(t, dir, map[string]string{
		"upgrade-4.13.7-x86_64.tar":         "t",
		"upgrade-4.13.7-x86_64.sha256":      "s",
		"upgrade-4.13.7-x86_64.tar.minisig": "m",
		"UPGRADE-4.14.0-X86_64.TAR":         "T", // a FAT stick written elsewhere
		"upgrade-4.14.0-x86_64.sha256":      "s",
		"upgrade-notes.txt":                 "n",
		"other.tar":                         "o",
		"sub/upgrade-9.9.9-x86_64.tar":      "only the root counts",
	})

	got, err := findCandidates(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { (&Medium{Candidates: got}).Close() })
	want := []Candidate{
		{Name: "UPGRADE-4.14.0-X86_64.TAR", TarPath: filepath.Join(dir, "UPGRADE-4.14.0-X86_64.TAR"),
			SHA256Path: filepath.Join(dir, "upgrade-4.14.0-x86_64.sha256")},
		{Name: "upgrade-4.13.7-x86_64.tar", TarPath: filepath.Join(dir, "upgrade-4.13.7-x86_64.tar"),
			SHA256Path: filepath.Join(dir, "upgrade-4.13.7-x86_64.sha256"),
			SigPath:    filepath.Join(dir, "upgrade-4.13.7-x86_64.tar.minisig")},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d candidates %+v, want %d (sub-directories and other names excluded)", len(got), got, len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.Name != w.Name || g.TarPath != w.TarPath || g.SHA256Path != w.SHA256Path || g.SigPath != w.SigPath || g.Raw || g.Err != nil {
			t.Errorf("candidate %d:\n got  %+v\n want %+v", i, g, w)
		}
		if (g.SHA256 != nil) != (w.SHA256Path != "") || (g.Sig != nil) != (w.SigPath != "") || g.Tar == nil {
			t.Errorf("candidate %d: files open: tar %v sha256 %v sig %v", i, g.Tar, g.SHA256, g.Sig)
		}
	}
	// Read through the descriptor opened, also as /proc/self/fd/N.
	b, err := io.ReadAll(got[0].Tar)
	if err != nil || string(b) != "T" {
		t.Errorf("tar read through its descriptor: %q, %v", b, err)
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/self/fd/%d", got[1].Sig.Fd())); err != nil || string(b) != "m" {
		t.Errorf("minisig reopened through /proc/self/fd: %q, %v", b, err)
	}
}

// secretMarker is in a host file that a crafted stick points at.
const secretMarker = "SECRET-MARKER-4f1d"

// A crafted stick: its files are symlinks to host files, a FIFO, a
// directory, a sidecar the size of /dev/zero's patience. Each bundle
// named by such a file is refused with a reason that names the file
// and never holds the host file's bytes; nothing blocks.
func TestFindCandidates_RefusesWhatIsNotARegularFile(t *testing.T) {
	host := filepath.Join(t.TempDir(), "shadow")
	fakesys.Write(t, filepath.Dir(host), map[string]string{"shadow": "root:" + secretMarker + ":19000::::::\n"})
	tests := []struct {
		name  string
		make  func(t *testing.T, dir string)
		says  string // in the reason
		wants string // the file named
	}{
		{"sha256 is a symlink to a host file", func(t *testing.T, dir string) {
			fakesys.Write(t, dir, map[string]string{"upgrade-1.0-x86_64.tar": "t"})
			fakesys.Link(t, host, filepath.Join(dir, "upgrade-1.0-x86_64.sha256"))
		}, "symbolic link", "upgrade-1.0-x86_64.sha256"},
		{"minisig is a symlink to a host file", func(t *testing.T, dir string) {
			fakesys.Write(t, dir, map[string]string{"upgrade-1.0-x86_64.tar": "t", "upgrade-1.0-x86_64.sha256": "s"})
			fakesys.Link(t, host, filepath.Join(dir, "upgrade-1.0-x86_64.tar.minisig"))
		}, "symbolic link", "upgrade-1.0-x86_64.tar.minisig"},
		{"tar is a symlink", func(t *testing.T, dir string) {
			fakesys.Link(t, host, filepath.Join(dir, "upgrade-1.0-x86_64.tar"))
		}, "symbolic link", "upgrade-1.0-x86_64.tar"},
		{"tar is a FIFO", func(t *testing.T, dir string) {
			if err := unix.Mkfifo(filepath.Join(dir, "upgrade-1.0-x86_64.tar"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "FIFO", "upgrade-1.0-x86_64.tar"},
		{"sha256 is a FIFO", func(t *testing.T, dir string) {
			fakesys.Write(t, dir, map[string]string{"upgrade-1.0-x86_64.tar": "t"})
			if err := unix.Mkfifo(filepath.Join(dir, "upgrade-1.0-x86_64.sha256"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "FIFO", "upgrade-1.0-x86_64.sha256"},
		{"tar is a directory", func(t *testing.T, dir string) {
			os.Mkdir(filepath.Join(dir, "upgrade-1.0-x86_64.tar"), 0o755)
		}, "directory", "upgrade-1.0-x86_64.tar"},
		{"minisig over the cap", func(t *testing.T, dir string) {
			fakesys.Write(t, dir, map[string]string{"upgrade-1.0-x86_64.tar": "t",
				"upgrade-1.0-x86_64.tar.minisig": strings.Repeat(secretMarker, MaxSidecar/len(secretMarker)+1)})
		}, "over 4096 bytes", "upgrade-1.0-x86_64.tar.minisig"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.make(t, dir)
			done := make(chan struct{})
			var got []Candidate
			var err error
			go func() { defer close(done); got, err = findCandidates(dir) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("findCandidates blocked")
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 {
				t.Fatalf("candidates %+v, want one, refused", got)
			}
			c := got[0]
			if !errors.Is(c.Err, ErrUnsafeFile) || c.Tar != nil || c.SHA256 != nil || c.Sig != nil {
				t.Fatalf("candidate %+v: want Err ErrUnsafeFile and no file open", c)
			}
			msg := c.Err.Error()
			if !strings.Contains(msg, tt.says) || !strings.Contains(msg, strconv.Quote(tt.wants)) {
				t.Errorf("reason %q does not say %q naming %q", msg, tt.says, tt.wants)
			}
			if strings.Contains(msg, secretMarker) {
				t.Errorf("reason %q echoes a file's bytes", msg)
			}
		})
	}
}

// A stray link does not hide a good bundle on the same stick: the one
// that can be read comes first.
func TestFindCandidates_ReadableFirst(t *testing.T) {
	dir := t.TempDir()
	fakesys.Write(t, dir, map[string]string{"upgrade-2.0-x86_64.tar": "t"})
	fakesys.Link(t, "/etc/passwd", filepath.Join(dir, "upgrade-1.0-x86_64.tar"))
	got, err := findCandidates(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { (&Medium{Candidates: got}).Close() })
	if len(got) != 2 || got[0].Name != "upgrade-2.0-x86_64.tar" || got[0].Err != nil || got[1].Err == nil {
		t.Fatalf("candidates %+v", got)
	}
}

func tarWith(t *testing.T, first string, typ byte, pax bool) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	h := &tar.Header{Name: first, Typeflag: typ, Mode: 0o644, Size: 2, Format: tar.FormatUSTAR}
	if typ != tar.TypeReg {
		h.Size = 0
	}
	if pax {
		h.Format = tar.FormatPAX
		h.PAXRecords = map[string]string{"comment": strings.Repeat("x", 600)}
	}
	if err := tw.WriteHeader(h); err != nil {
		t.Fatal(err)
	}
	if h.Size > 0 {
		tw.Write([]byte("{}"))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestIsBundleTar(t *testing.T) {
	tests := []struct {
		name string
		data []byte
		want bool
	}{
		{"ustar starting with metadata.json", tarWith(t, "metadata.json", tar.TypeReg, false), true},
		{"pax header before metadata.json", tarWith(t, "metadata.json", tar.TypeReg, true), true},
		{"another first entry", tarWith(t, "docker/registry/v2/x", tar.TypeReg, false), false},
		{"metadata.json as a directory", tarWith(t, "metadata.json", tar.TypeDir, false), false},
		{"zeros (empty stick)", make([]byte, 4096), false},
		{"a partition table", append(make([]byte, 510), 0x55, 0xaa), false},
		{"nothing", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := isBundleTar(bytes.NewReader(tt.data))
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("isBundleTar = %v, want %v", got, tt.want)
			}
		})
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("input/output error") }

func TestIsBundleTar_ReportsReadErrors(t *testing.T) {
	if _, err := isBundleTar(io.MultiReader(bytes.NewReader(make([]byte, 100)), failingReader{})); err == nil {
		t.Fatal("a read error was taken for a non-tar")
	}
}

// fakeDisk lays out sysfs for disk "name" (major 8) with the given
// partitions, and returns sys.
func fakeDisk(t *testing.T, sys, name string, minor int, parts ...string) {
	t.Helper()
	disk := filepath.Join(sys, "devices/pci/block", name)
	fakesys.Write(t, disk, map[string]string{"size": "2048\n", "dev": "8:" + strconv.Itoa(minor) + "\n"})
	os.MkdirAll(filepath.Join(disk, "holders"), 0o755)
	fakesys.Link(t, disk, filepath.Join(sys, "dev/block", "8:"+strconv.Itoa(minor)))
	for i, p := range parts {
		pd := filepath.Join(disk, p)
		fakesys.Write(t, pd, map[string]string{"size": "1024\n", "dev": "8:" + strconv.Itoa(minor+i+1) + "\n", "partition": strconv.Itoa(i+1) + "\n"})
		os.MkdirAll(filepath.Join(pd, "holders"), 0o755)
		fakesys.Link(t, pd, filepath.Join(sys, "dev/block", "8:"+strconv.Itoa(minor+i+1)))
	}
}

func TestCheckDisk(t *testing.T) {
	sys := t.TempDir()
	fakeDisk(t, sys, "sda", 0, "sda1", "sda2", "sda3") // root disk: sda2 mounted at /
	fakeDisk(t, sys, "sdb", 16, "sdb1")                // the stick
	fakeDisk(t, sys, "sdc", 32, "sdc1")                // sdc1 swap-free LVM member
	fakeDisk(t, sys, "sdd", 48)                        // empty card reader
	fakesys.Write(t, filepath.Join(sys, "devices/pci/block/sdc/sdc1/holders"), map[string]string{"dm-0": ""})
	fakesys.Write(t, filepath.Join(sys, "devices/pci/block/sdd"), map[string]string{"size": "0\n"})
	mountDir := "/run/ferry/media"
	mi := filepath.Join(t.TempDir(), "mountinfo")
	fakesys.Write(t, filepath.Dir(mi), map[string]string{"mountinfo": strings.Join([]string{
		"27 1 8:2 / / rw,relatime - ext4 /dev/sda2 rw",
		"30 27 8:17 / /run/ferry/media/sdb1-123 ro,nosuid,nodev,noexec - vfat /dev/sdb1 ro",
		"31 27 0:25 / /tmp rw - tmpfs tmpfs rw",
	}, "\n") + "\n"})
	m := &Media{MountDir: mountDir, Sys: sys, MountInfo: mi, Swaps: filepath.Join(t.TempDir(), "none")}

	tests := []struct {
		name    string
		num     string
		wantErr error
		detail  string
	}{
		{"root partition", "8:2", ErrSystemDevice, "sda2 is mounted at /"},
		{"another partition of the root disk", "8:3", ErrSystemDevice, "sda2 is mounted at /"},
		{"the root disk itself", "8:0", ErrSystemDevice, "mounted at /"},
		{"a stick partition mounted by ferry", "8:17", nil, ""},
		{"the stick's whole disk", "8:16", nil, ""},
		{"a partition held by device-mapper", "8:33", ErrSystemDevice, "held by dm-0"},
		{"an empty device", "8:48", ErrNoMedium, "size 0"},
		{"an unknown device", "8:99", ErrNoMedium, "no sysfs entry"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := m.checkDisk("/dev/x", tt.num)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("checkDisk(%s) = %v, want %v", tt.num, err, tt.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), tt.detail) {
				t.Errorf("error %q does not say %q", err, tt.detail)
			}
		})
	}
}

func TestReadMountInfo_UnescapesPaths(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mountinfo")
	fakesys.Write(t, filepath.Dir(p), map[string]string{"mountinfo": "36 35 7:3 / /media/my\\040stick ro shared:1 - vfat /dev/loop3 ro\n"})
	got, err := readMountInfo(p)
	if err != nil {
		t.Fatal(err)
	}
	want := mountEntry{dev: "7:3", point: "/media/my stick", fstype: "vfat"}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("got %+v, want [%+v]", got, want)
	}
}

func TestWithin(t *testing.T) {
	for _, tt := range []struct {
		path, dir string
		want      bool
	}{
		{"/run/ferry/media/sdb1-1", "/run/ferry/media", true},
		{"/run/ferry/media", "/run/ferry/media", true},
		{"/run/ferry/media2/x", "/run/ferry/media", false},
		{"/", "/run/ferry/media", false},
	} {
		if got := within(tt.path, tt.dir); got != tt.want {
			t.Errorf("within(%q, %q) = %v, want %v", tt.path, tt.dir, got, tt.want)
		}
	}
}

func TestOpen_RefusesWithoutOpening(t *testing.T) {
	ctx := t.Context()
	if _, err := Open(ctx, udev.Event{Action: udev.Remove, DevPath: "/dev/sdz"}, t.TempDir()); !errors.Is(err, ErrNoMedium) {
		t.Errorf("remove event: err = %v, want ErrNoMedium", err)
	}
	if _, err := Open(ctx, udev.Event{Action: udev.Add, DevPath: "/dev/ferry-no-such-device"}, t.TempDir()); !errors.Is(err, ErrNoMedium) {
		t.Errorf("missing node: err = %v, want ErrNoMedium", err)
	}
	f := filepath.Join(t.TempDir(), "image")
	fakesys.Write(t, filepath.Dir(f), map[string]string{"image": "x"})
	if _, err := Open(ctx, udev.Event{Action: udev.Add, DevPath: f}, t.TempDir()); !errors.Is(err, ErrNotBundle) {
		t.Errorf("regular file: err = %v, want ErrNotBundle", err)
	}
}

// A stranger's ext2/3/4 or xfs stick is not mounted unless the config
// allows its filesystem (their drivers are not hardened against a crafted
// image): refused before anything is mounted, saying why and how to allow
// it, in the error and the log. vfat, exFAT and iso9660 are tried always.
func TestMount_OnlyDefaultFilesystemsUnlessTheConfigAllows(t *testing.T) {
	dev := filepath.Join(t.TempDir(), "sdz1") // not a device: a mount tried fails
	fakesys.Write(t, filepath.Dir(dev), map[string]string{"sdz1": "x"})
	for _, tc := range []struct {
		fstype  string
		extra   []string
		refused bool
	}{
		{"ext4", nil, true},
		{"ext2", nil, true},
		{"ext3", nil, true},
		{"xfs", []string{"ext4"}, true},
		{"ext4", []string{"ext4"}, false},
		{"xfs", []string{"xfs"}, false},
		{"vfat", nil, false},
		{"exfat", nil, false},
		{"iso9660", nil, false},
	} {
		t.Run(tc.fstype+" allowing "+strings.Join(tc.extra, ","), func(t *testing.T) {
			var logs bytes.Buffer
			mountDir := filepath.Join(t.TempDir(), "mnt")
			m := &Media{MountDir: mountDir, ExtraFilesystems: tc.extra, Log: slog.New(slog.NewTextHandler(&logs, nil))}
			_, err := m.mount(dev, tc.fstype)
			if err == nil {
				t.Fatal("a regular file was mounted")
			}
			byPolicy := strings.Contains(err.Error(), "not mounted by default")
			if !tc.refused {
				if byPolicy {
					t.Fatalf("refused by default: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrUnsupportedFS) || !byPolicy || !strings.Contains(err.Error(), "media.extra_filesystems") {
				t.Fatalf("got %v, want ErrUnsupportedFS saying why and how to allow it", err)
			}
			if !strings.Contains(logs.String(), "stick ignored") || !strings.Contains(logs.String(), "fstype="+tc.fstype) {
				t.Errorf("log %q does not say the stick was ignored", logs.String())
			}
			if _, err := os.Stat(mountDir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a mount point was made for a refused stick: %v", err)
			}
		})
	}
}

func TestMediumClose_RawIsANoOp(t *testing.T) {
	m := &Medium{Device: "/dev/sdb", Candidates: []Candidate{{Raw: true}}}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}

// fakeKindDisk lays out sysfs (and udev's database) for a whole disk
// numbered num at devPath under sys, with removable set and props in
// its udev record.
func fakeKindDisk(t *testing.T, sys, data, devPath, num, removable string, props ...string) {
	t.Helper()
	dir := filepath.Join(sys, devPath)
	fakesys.Write(t, dir, map[string]string{"size": "2048\n", "dev": num + "\n", "removable": removable + "\n"})
	fakesys.Link(t, dir, filepath.Join(sys, "dev/block", num))
	var rec strings.Builder
	for _, p := range props {
		rec.WriteString("E:" + p + "\n")
	}
	fakesys.Write(t, data, map[string]string{"b" + num: rec.String()})
}

func TestCheckKind(t *testing.T) {
	sys, data := t.TempDir(), t.TempDir()
	fakeKindDisk(t, sys, data, "devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0/block/sdb", "8:16", "1",
		"ID_BUS=usb", "ID_USB_DRIVER=usb-storage", "ID_PATH=pci-0000:00:14.0-usb-0:1:1.0-scsi-0:0:0:0")
	// The same USB stick as a partition whose udev record lacks the bus.
	fakesys.Write(t, filepath.Join(sys, "devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0/block/sdb/sdb1"),
		map[string]string{"partition": "1\n", "dev": "8:17\n", "size": "1024\n"})
	fakesys.Link(t, filepath.Join(sys, "devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0/block/sdb/sdb1"), filepath.Join(sys, "dev/block/8:17"))
	// A USB disk that says it is not removable (many do): still USB.
	fakeKindDisk(t, sys, data, "devices/pci0000:00/0000:00:14.0/usb2/2-2/2-2:1.0/host7/target7:0:0/7:0:0:0/block/sdc", "8:32", "0", "ID_BUS=usb")
	fakeKindDisk(t, sys, data, "devices/pci0000:00/0000:00:1c.0/mmc_host/mmc0/mmc0:0001/block/mmcblk0", "179:0", "0", "ID_DRIVE_FLASH_SD=1")
	fakeKindDisk(t, sys, data, "devices/virtual/block/loop3", "7:3", "0")
	fakeKindDisk(t, sys, data, "devices/pci0000:00/0000:00:05.0/virtio2/block/vdb", "253:16", "0", "ID_PATH=pci-0000:00:05.0")
	fakeKindDisk(t, sys, data, "devices/pci0000:00/0000:00:06.0/nvme/nvme1/nvme1n1", "259:0", "0")
	fakeKindDisk(t, sys, data, "devices/platform/host3/session1/target3:0:0/3:0:0:1/block/sdd", "8:48", "0", "ID_BUS=scsi", "ID_PATH=ip-10.0.0.5:3260-iscsi-iqn.2024-01.lun-1")
	// iSCSI LUNs whose target's name (the remote owner's choice) says usb.
	fakeKindDisk(t, sys, data, "devices/platform/host4/session2/target4:0:0/4:0:0:1/block/sdf", "8:80", "0", "ID_BUS=scsi",
		"ID_PATH=ip-10.0.0.1:3260-iscsi-iqn.2001-04.com.example:usb-lun-1")
	fakeKindDisk(t, sys, data, "devices/platform/host5/session3/target5:0:0/5:0:0:2/block/sdg", "8:96", "0", "ID_BUS=scsi",
		"ID_PATH=ip-10.0.0.1:3260-iscsi-iqn.2001-04.com.example:disk-usb-2-lun-2")
	// A real USB disk whose udev record has its path but no bus.
	fakeKindDisk(t, sys, data, "devices/pci0000:00/0000:00:14.0/usb3/3-1/3-1:1.0/host8/target8:0:0/8:0:0:0/block/sdh", "8:112", "0",
		"ID_PATH=pci-0000:00:14.0-usb-0:1:1.0-scsi-0:0:0:0")
	fakeKindDisk(t, sys, data, "devices/pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0/block/sde", "8:64", "0", "ID_BUS=ata")
	fakeKindDisk(t, sys, data, "devices/pci0000:00/0000:00:1f.2/ata2/host1/target1:0:0/1:0:0:0/block/sr0", "11:0", "1", "ID_BUS=ata")
	// An iSCSI LUN whose target sets the removable flag, one that also
	// claims USB in its udev record, and a Fibre Channel one.
	fakeKindDisk(t, sys, data, "devices/platform/host9/session7/target9:0:0/9:0:0:1/block/sdi", "8:128", "1", "ID_BUS=scsi",
		"ID_PATH=ip-10.0.0.5:3260-iscsi-iqn.2024-01.example:stick-lun-1")
	fakeKindDisk(t, sys, data, "devices/platform/host10/session8/target10:0:0/10:0:0:1/block/sdj", "8:144", "1",
		"ID_BUS=usb", "ID_USB_DRIVER=usb-storage")
	fakeKindDisk(t, sys, data, "devices/pci0000:00/0000:05:00.0/host11/rport-11:0-2/target11:0:0/11:0:0:0/block/sdk", "8:160", "1",
		"ID_BUS=scsi", "ID_PATH=pci-0000:05:00.0-fc-0x500601603ce01a2b-lun-0")
	// NVMe over TCP.
	fakeKindDisk(t, sys, data, "devices/virtual/nvme-fabrics/ctl/nvme2/nvme2n1", "259:8", "1")
	// A BMC's virtual media: a USB CD-ROM.
	fakeKindDisk(t, sys, data, "devices/pci0000:00/0000:00:14.0/usb1/1-4/1-4:1.0/host12/target12:0:0/12:0:0:0/block/sr1", "11:1", "1",
		"ID_BUS=usb", "ID_USB_DRIVER=usb-storage", "ID_PATH=pci-0000:00:14.0-usb-0:4:1.0-scsi-0:0:0:0", "ID_CDROM=1")
	// A virtio-scsi CD-ROM (a hypervisor's, not a BMC's): removable only.
	fakeKindDisk(t, sys, data, "devices/pci0000:00/0000:00:07.0/virtio5/host13/target13:0:0/13:0:0:0/block/sr2", "11:2", "1",
		"ID_BUS=scsi", "ID_PATH=pci-0000:00:07.0-scsi-0:0:0:0")

	tests := []struct {
		name  string
		num   string
		allow []string
		ok    bool
		says  string
	}{
		{"usb stick", "8:16", nil, true, ""},
		{"usb stick partition", "8:17", nil, true, ""},
		{"usb disk not flagged removable", "8:32", nil, true, ""},
		{"sd card", "179:0", nil, true, ""},
		{"sata optical drive: removable only", "11:0", nil, false, `add "removable"`},
		{"sata optical drive allowed", "11:0", []string{"removable"}, true, ""},
		{"bmc virtual media", "11:1", nil, true, ""},
		{"virtio-scsi cd-rom: removable only", "11:2", nil, false, "a removable/virtio/scsi device"},
		{"iscsi LUN flagged removable", "8:128", nil, false, "a network/scsi device"},
		{"iscsi LUN flagged removable, removable allowed", "8:128", []string{"removable"}, false, "network"},
		{"iscsi LUN claiming usb", "8:144", nil, false, "a network/scsi device"},
		{"fibre channel LUN flagged removable", "8:160", nil, false, "a network/scsi device"},
		{"nvme over tcp", "259:8", []string{"removable"}, false, "a network/nvme device"},
		{"loop device by default", "7:3", nil, false, `add "loop" to media.allow_devices`},
		{"loop device allowed", "7:3", []string{"loop"}, true, ""},
		{"virtio disk hot-plugged", "253:16", []string{"loop"}, false, `add "virtio"`},
		{"virtio allowed", "253:16", []string{"loop", "virtio"}, true, ""},
		{"nvme disk", "259:0", nil, false, "nvme"},
		{"iscsi LUN", "8:48", nil, false, "scsi"},
		{"iscsi LUN whose target's name says usb", "8:80", nil, false, "a network/scsi device"},
		{"iscsi LUN whose target's name has a usb segment", "8:96", nil, false, "a network/scsi device"},
		{"usb disk known by its ID_PATH", "8:112", nil, true, ""},
		{"sata disk", "8:64", nil, false, "ata"},
		{"anything with any", "8:48", []string{"any"}, true, ""},
		{"unknown device", "1:99", nil, false, "no kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &Media{Sys: sys, UdevData: data, AllowDevices: tt.allow}
			err := m.checkKind("/dev/x", tt.num)
			if tt.ok {
				if err != nil {
					t.Fatalf("refused (kinds %v): %v", udev.Kinds(sys, data, tt.num), err)
				}
				return
			}
			if !errors.Is(err, ErrNotRemovable) || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("err = %v (kinds %v), want ErrNotRemovable saying %q", err, udev.Kinds(sys, data, tt.num), tt.says)
			}
		})
	}
}
