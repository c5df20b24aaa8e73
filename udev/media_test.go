package udev

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFindCandidates(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"upgrade-4.13.7-x86_64.tar":         "t",
		"upgrade-4.13.7-x86_64.sha256":      "s",
		"upgrade-4.13.7-x86_64.tar.minisig": "m",
		"UPGRADE-4.14.0-X86_64.TAR":         "t", // a FAT stick written elsewhere
		"upgrade-4.14.0-x86_64.sha256":      "s",
		"upgrade-notes.txt":                 "n",
		"other.tar":                         "o",
		"sub/upgrade-9.9.9-x86_64.tar":      "only the root counts",
	})
	if err := os.Mkdir(filepath.Join(dir, "upgrade-dir.tar"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/shadow", filepath.Join(dir, "upgrade-evil-x86_64.tar")); err != nil {
		t.Fatal(err)
	}

	got, err := findCandidates(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []Candidate{
		{Name: "UPGRADE-4.14.0-X86_64.TAR", TarPath: filepath.Join(dir, "UPGRADE-4.14.0-X86_64.TAR"),
			SHA256Path: filepath.Join(dir, "upgrade-4.14.0-x86_64.sha256")},
		{Name: "upgrade-4.13.7-x86_64.tar", TarPath: filepath.Join(dir, "upgrade-4.13.7-x86_64.tar"),
			SHA256Path: filepath.Join(dir, "upgrade-4.13.7-x86_64.sha256"),
			SigPath:    filepath.Join(dir, "upgrade-4.13.7-x86_64.tar.minisig")},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d candidates %+v, want %d (symlinks, directories, sub-directories and other names excluded)", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("candidate %d:\n got  %+v\n want %+v", i, got[i], want[i])
		}
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
	writeFiles(t, disk, map[string]string{"size": "2048\n", "dev": "8:" + strconv.Itoa(minor) + "\n"})
	os.MkdirAll(filepath.Join(disk, "holders"), 0o755)
	link(t, disk, filepath.Join(sys, "dev/block", "8:"+strconv.Itoa(minor)))
	for i, p := range parts {
		pd := filepath.Join(disk, p)
		writeFiles(t, pd, map[string]string{"size": "1024\n", "dev": "8:" + strconv.Itoa(minor+i+1) + "\n", "partition": strconv.Itoa(i+1) + "\n"})
		os.MkdirAll(filepath.Join(pd, "holders"), 0o755)
		link(t, pd, filepath.Join(sys, "dev/block", "8:"+strconv.Itoa(minor+i+1)))
	}
}

func link(t *testing.T, target, name string) {
	t.Helper()
	os.MkdirAll(filepath.Dir(name), 0o755)
	if err := os.Symlink(target, name); err != nil {
		t.Fatal(err)
	}
}

func TestCheckDisk(t *testing.T) {
	sys := t.TempDir()
	fakeDisk(t, sys, "sda", 0, "sda1", "sda2", "sda3") // root disk: sda2 mounted at /
	fakeDisk(t, sys, "sdb", 16, "sdb1")                // the stick
	fakeDisk(t, sys, "sdc", 32, "sdc1")                // sdc1 swap-free LVM member
	fakeDisk(t, sys, "sdd", 48)                        // empty card reader
	writeFiles(t, filepath.Join(sys, "devices/pci/block/sdc/sdc1/holders"), map[string]string{"dm-0": ""})
	writeFiles(t, filepath.Join(sys, "devices/pci/block/sdd"), map[string]string{"size": "0\n"})
	mountDir := "/run/ferry/media"
	mi := filepath.Join(t.TempDir(), "mountinfo")
	writeFiles(t, filepath.Dir(mi), map[string]string{"mountinfo": strings.Join([]string{
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
	writeFiles(t, filepath.Dir(p), map[string]string{"mountinfo": "36 35 7:3 / /media/my\\040stick ro shared:1 - vfat /dev/loop3 ro\n"})
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
	if _, err := Open(ctx, Event{Action: Remove, DevPath: "/dev/sdz"}, t.TempDir()); !errors.Is(err, ErrNoMedium) {
		t.Errorf("remove event: err = %v, want ErrNoMedium", err)
	}
	if _, err := Open(ctx, Event{Action: Add, DevPath: "/dev/ferry-no-such-device"}, t.TempDir()); !errors.Is(err, ErrNoMedium) {
		t.Errorf("missing node: err = %v, want ErrNoMedium", err)
	}
	f := filepath.Join(t.TempDir(), "image")
	writeFiles(t, filepath.Dir(f), map[string]string{"image": "x"})
	if _, err := Open(ctx, Event{Action: Add, DevPath: f}, t.TempDir()); !errors.Is(err, ErrNotBundle) {
		t.Errorf("regular file: err = %v, want ErrNotBundle", err)
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
