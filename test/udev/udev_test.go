// Package udevtest runs ferry's udev and media packages against the
// host's real kernel and systemd-udevd: loop devices stand in for USB
// sticks.
//
// Needs root and the packages of test/setup/install-deps.sh (udev,
// util-linux, dosfstools, mtools, e2fsprogs). Run: go test ./test/udev/
// (about 10 s).
package udevtest

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/ferry-edge/ferry/media"
	"github.com/ferry-edge/ferry/test/udevenv"
	"github.com/ferry-edge/ferry/udev"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { os.Exit(udevenv.Main(m)) }

// bound is how long a test waits for udev before failing rather than
// hanging; not a speed requirement (speed is logged and benchmarked).
const bound = 60 * time.Second

func testLog(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// watch starts a real Monitor (without the startup scan unless scan) for
// the rest of the test.
func watch(t testing.TB, scan bool) <-chan udev.Event {
	t.Helper()
	m := udev.NewMonitor(testLog(t))
	m.NoScan = !scan
	ch, err := m.Events(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// waitFor returns the first event about l's attachment that satisfies ok.
// Other test binaries may use loop devices at the same time, so events are
// matched on the device's diskseq too.
func waitFor(t testing.TB, ch <-chan udev.Event, l *udevenv.Loop, ok func(udev.Event) bool) udev.Event {
	t.Helper()
	timeout := time.NewTimer(bound)
	defer timeout.Stop()
	for {
		select {
		case ev, open := <-ch:
			if !open {
				t.Fatalf("event channel closed while waiting for %s", l.Dev)
			}
			if l.Is(ev.DevPath, ev.DiskSeq) && ok(ev) {
				return ev
			}
		case <-timeout.C:
			t.Fatalf("no matching udev event for %s within %s", l.Dev, bound)
		}
	}
}

// openStick is media.Open for the loop devices that stand in for sticks
// here: ferry reads only USB and MMC devices unless
// media.allow_devices names other kinds.
func openStick(ctx context.Context, ev udev.Event, mountDir string) (*media.Medium, error) {
	return (&media.Media{MountDir: mountDir, AllowDevices: []string{"loop"}, ExtraFilesystems: []string{"ext4"}}).Open(ctx, ev)
}

func stickFiles(t testing.TB, tarData []byte) []udevenv.File {
	return []udevenv.File{
		{Name: "upgrade-1.0.0-x86_64.tar", Data: tarData},
		{Name: "upgrade-1.0.0-x86_64.sha256", Data: []byte("0000  upgrade-1.0.0-x86_64.tar\n")},
		{Name: "upgrade-1.0.0-x86_64.tar.minisig", Data: []byte("sig\n")},
		{Name: "README.txt", Data: []byte("not a bundle\n")},
	}
}

func TestStickWithFilesystem_EventMountFindClose(t *testing.T) {
	udevenv.Require(t)
	tarData := udevenv.SmallBundleTar(t, "1.0.0")
	for _, tt := range []struct {
		fstype string
		image  func(testing.TB, string, ...udevenv.File) string
	}{
		{"ext4", udevenv.Ext4Image},
		{"vfat", udevenv.VFATImage},
	} {
		t.Run(tt.fstype, func(t *testing.T) {
			img := tt.image(t, "STICK", stickFiles(t, tarData)...)
			events := watch(t, false)
			start := time.Now()
			l := udevenv.Attach(t, img)
			ev := waitFor(t, events, l, func(e udev.Event) bool { return e.FSType != "" })
			t.Logf("losetup → udev event: %v (%s)", time.Since(start).Round(time.Millisecond), ev)
			if ev.Action != udev.Change || ev.FSType != tt.fstype || ev.Label != "STICK" || ev.Size == 0 || ev.Gone() {
				t.Fatalf("event %+v, want change with fs %s, label STICK and a size", ev, tt.fstype)
			}

			mountDir := t.TempDir()
			opened := time.Now()
			med, err := openStick(t.Context(), ev, mountDir)
			if !udevenv.CanMount(tt.fstype) {
				// Some VM kernels lack the driver; Open must say so.
				if !errors.Is(err, media.ErrUnsupportedFS) {
					t.Fatalf("Open on a kernel without %s: err = %v, want ErrUnsupportedFS", tt.fstype, err)
				}
				t.Logf("this kernel has no %s driver; Open said: %v", tt.fstype, err)
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			t.Cleanup(func() { med.Close() })
			if len(med.Candidates) != 1 {
				t.Fatalf("candidates %+v, want one", med.Candidates)
			}
			c := med.Candidates[0]
			if c.Raw || c.Name != "upgrade-1.0.0-x86_64.tar" ||
				c.SHA256Path != filepath.Join(med.Dir, "upgrade-1.0.0-x86_64.sha256") ||
				c.SigPath != filepath.Join(med.Dir, "upgrade-1.0.0-x86_64.tar.minisig") {
				t.Fatalf("candidate %+v", c)
			}
			if c.Tar == nil || c.SHA256 == nil || c.Sig == nil || c.Err != nil {
				t.Fatalf("candidate %+v: want its three files open", c)
			}
			// Read through the descriptor Open made, as the agent does.
			f, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", c.Tar.Fd()))
			if err != nil {
				t.Fatal(err)
			}
			first := make([]byte, 1)
			if _, err := io.ReadFull(f, first); err != nil {
				t.Fatal(err)
			}
			t.Logf("udev event → Open → first byte read: %v", time.Since(opened).Round(time.Millisecond))
			rest, err := io.ReadAll(f)
			f.Close()
			if err != nil || !bytes.Equal(append(first, rest...), tarData) {
				t.Fatalf("tar read back differs (err %v)", err)
			}

			// Read-only, nodev, nosuid, noexec, nosymfollow.
			if err := os.WriteFile(filepath.Join(med.Dir, "x"), []byte("x"), 0o644); !errors.Is(err, unix.EROFS) {
				t.Errorf("writing to the stick: err = %v, want EROFS", err)
			}
			opts := mountOptions(t, med.Dir)
			for _, o := range []string{"ro", "nodev", "nosuid", "noexec", "nosymfollow"} {
				if !opts[o] {
					t.Errorf("mount options %v lack %s", opts, o)
				}
			}

			if err := med.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if mountOptions(t, med.Dir) != nil {
				t.Error("still mounted after Close")
			}
			if _, err := os.Stat(med.Dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("mount point left behind: %v", err)
			}
		})
	}
}

// mountOptions are the per-mount options of the mount at dir, nil when
// nothing is mounted there.
func mountOptions(t testing.TB, dir string) map[string]bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[4] == dir {
			opts := map[string]bool{}
			for _, o := range strings.Split(f[5], ",") {
				opts[o] = true
			}
			return opts
		}
	}
	return nil
}

func TestRawTarDevice_GivesRawCandidate(t *testing.T) {
	udevenv.Require(t)
	tarData := udevenv.SmallBundleTar(t, "1.0.0")
	img := udevenv.RawImage(t, udevenv.File{Data: tarData})
	events := watch(t, false)
	start := time.Now()
	l := udevenv.Attach(t, img)
	ev := waitFor(t, events, l, func(e udev.Event) bool { return e.Size > 0 })
	t.Logf("losetup → udev event: %v (%s)", time.Since(start).Round(time.Millisecond), ev)
	if ev.FSType != "" {
		t.Fatalf("udev found a filesystem %q on a raw tar", ev.FSType)
	}
	med, err := openStick(t.Context(), ev, t.TempDir())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer med.Close()
	if med.Dir != "" || len(med.Candidates) != 1 || !med.Candidates[0].Raw ||
		med.Candidates[0].TarPath != l.Dev || med.Candidates[0].SHA256Path != "" {
		t.Fatalf("medium %+v, want one raw candidate on %s", med, l.Dev)
	}
	f, err := os.Open(med.Candidates[0].TarPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h, err := tar.NewReader(f).Next()
	if err != nil || h.Name != "metadata.json" {
		t.Fatalf("first entry %v, %v", h, err)
	}
}

func TestBlankDevice_IsNotABundle(t *testing.T) {
	udevenv.Require(t)
	events := watch(t, false)
	l := udevenv.Attach(t, udevenv.BlankImage(t, 4<<20))
	ev := waitFor(t, events, l, func(e udev.Event) bool { return e.Size > 0 })
	if _, err := openStick(t.Context(), ev, t.TempDir()); !errors.Is(err, media.ErrNotBundle) {
		t.Fatalf("Open on a blank stick: err = %v, want ErrNotBundle", err)
	}
}

func TestDetach_EmitsGoneEvent(t *testing.T) {
	udevenv.Require(t)
	events := watch(t, false)
	l := udevenv.Attach(t, udevenv.Ext4Image(t, "STICK", stickFiles(t, []byte("x"))...))
	waitFor(t, events, l, func(e udev.Event) bool { return e.FSType == "ext4" })
	l.Detach()
	ev := waitFor(t, events, l, udev.Event.Gone)
	t.Logf("detach event: %s", ev)
	if _, err := openStick(t.Context(), ev, t.TempDir()); !errors.Is(err, media.ErrNoMedium) {
		t.Errorf("Open after detach: err = %v, want ErrNoMedium", err)
	}
}

// bigTar is a bundle-shaped tar large enough that pulling the stick after
// its first block leaves most of it unread (not in the page cache).
func bigTar(t testing.TB) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	meta := []byte(`{"formatVersion":1}`)
	tw.WriteHeader(&tar.Header{Name: "metadata.json", Mode: 0o644, Size: int64(len(meta)), Typeflag: tar.TypeReg})
	tw.Write(meta)
	blob := bytes.Repeat([]byte{0xa5}, 32<<20)
	tw.WriteHeader(&tar.Header{Name: "docker/registry/v2/blobs/big", Mode: 0o644, Size: int64(len(blob)), Typeflag: tar.TypeReg})
	tw.Write(blob)
	tw.Close()
	return buf.Bytes()
}

// readAfterPull reads 4 KiB of r, pulls the stick, and reads the rest: it
// must end with an error or short, never hang or succeed in full.
func readAfterPull(t *testing.T, r io.Reader, l *udevenv.Loop, want int) {
	t.Helper()
	head := make([]byte, 4096)
	if _, err := io.ReadFull(r, head); err != nil {
		t.Fatal(err)
	}
	pulled := time.Now()
	l.Pull()
	t.Logf("pull took %v", time.Since(pulled).Round(time.Millisecond))
	n, err := io.Copy(io.Discard, r)
	t.Logf("read after pull returned after %v", time.Since(pulled).Round(time.Millisecond))
	total := int(n) + len(head)
	t.Logf("read after pull: %d of %d bytes, err %v", total, want, err)
	if err == nil && total >= want {
		t.Fatal("the whole bundle was read from a pulled stick")
	}
}

func TestPulledMidRead_RawDevice(t *testing.T) {
	udevenv.Require(t)
	data := bigTar(t)
	events := watch(t, false)
	l := udevenv.Attach(t, udevenv.RawImage(t, udevenv.File{Data: data}))
	ev := waitFor(t, events, l, func(e udev.Event) bool { return e.Size > 0 })
	med, err := openStick(t.Context(), ev, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(med.Candidates[0].TarPath, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	readAfterPull(t, alignedReader{f}, l, len(data))
	f.Close()
	gone := waitFor(t, events, l, udev.Event.Gone)
	t.Logf("pull event: %s", gone)
	if err := med.Close(); err != nil {
		t.Fatalf("Close after pull: %v", err)
	}
}

// alignedReader reads an O_DIRECT file through an aligned buffer, so that
// nothing comes from the page cache.
type alignedReader struct{ f *os.File }

func (a alignedReader) Read(p []byte) (int, error) {
	buf := alignedBuf(64 << 10)
	n, err := a.f.Read(buf)
	if n > len(p) {
		n = len(p) // callers here read at least 4 KiB at a time
	}
	copy(p, buf[:n])
	return n, err
}

func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := 4096 - int(uintptr(unsafe.Pointer(&b[0]))&4095)
	return b[off : off+n]
}

func TestPulledMidRead_MountedFilesystem(t *testing.T) {
	udevenv.Require(t)
	data := bigTar(t)
	events := watch(t, false)
	l := udevenv.Attach(t, udevenv.Ext4Image(t, "STICK", udevenv.File{Name: "upgrade-1.0.0-x86_64.tar", Data: data}))
	ev := waitFor(t, events, l, func(e udev.Event) bool { return e.FSType == "ext4" })
	// Drop what mkfs left in the page cache for this device.
	unix.Sync()
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0o200)
	med, err := openStick(t.Context(), ev, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(med.Candidates[0].TarPath)
	if err != nil {
		t.Fatal(err)
	}
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_RANDOM) // no read-ahead past what is asked
	readAfterPull(t, f, l, len(data))
	gone := waitFor(t, events, l, udev.Event.Gone)
	t.Logf("pull event: %s", gone)
	closing := time.Now()
	defer func() { t.Logf("Close took %v", time.Since(closing).Round(time.Millisecond)) }()
	// Close with the file still open and the device gone: lazy unmount.
	if err := med.Close(); err != nil {
		t.Fatalf("Close after pull: %v", err)
	}
	f.Close()
	if mountOptions(t, med.Dir) != nil {
		t.Error("still mounted after Close")
	}
}

func TestStartupScan_SeesAttachedDevice(t *testing.T) {
	udevenv.Require(t)
	l := udevenv.Attach(t, udevenv.Ext4Image(t, "SCANME", stickFiles(t, []byte("x"))...))
	udevenv.Run(t, "udevadm", "settle", "--timeout=30")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	m := udev.NewMonitor(testLog(t))
	ch, err := m.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ev := waitFor(t, ch, l, func(udev.Event) bool { return true })
	if !ev.Scanned || ev.Action != udev.Add || ev.FSType != "ext4" || ev.Label != "SCANME" || ev.Size == 0 {
		t.Fatalf("first event for %s: %+v, want the scan's add with ext4/SCANME", l.Dev, ev)
	}
}

func TestOwnDevices_AreRefused(t *testing.T) {
	udevenv.Require(t)
	// The root filesystem's device.
	var st unix.Stat_t
	if err := unix.Stat("/", &st); err != nil {
		t.Fatal(err)
	}
	if root := blockDevOf(t, st.Dev); root != "" {
		if _, err := openStick(t.Context(), udev.Event{Action: udev.Add, DevPath: root, FSType: "ext4"}, t.TempDir()); !errors.Is(err, media.ErrSystemDevice) {
			t.Errorf("Open(%s, the root device): err = %v, want ErrSystemDevice", root, err)
		}
	} else {
		t.Log("the root filesystem is not on a block device here; checking a mounted loop device only")
	}

	// A stick someone mounted elsewhere.
	events := watch(t, false)
	l := udevenv.Attach(t, udevenv.Ext4Image(t, "STICK", stickFiles(t, []byte("x"))...))
	ev := waitFor(t, events, l, func(e udev.Event) bool { return e.FSType == "ext4" })
	elsewhere := t.TempDir()
	if err := unix.Mount(l.Dev, elsewhere, "ext4", unix.MS_RDONLY, "noload"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(elsewhere, unix.MNT_DETACH) })
	_, err := openStick(t.Context(), ev, t.TempDir())
	if !errors.Is(err, media.ErrSystemDevice) || !strings.Contains(err.Error(), elsewhere) {
		t.Fatalf("Open of a device mounted at %s: err = %v, want ErrSystemDevice naming the mount", elsewhere, err)
	}
}

// blockDevOf finds the /dev node of device number dev, "" if none.
func blockDevOf(t testing.TB, dev uint64) string {
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(dev), unix.Minor(dev)))
	if err != nil {
		return ""
	}
	return "/dev/" + filepath.Base(link)
}

func TestSweep_UnmountsWhatACrashLeft(t *testing.T) {
	udevenv.Require(t)
	events := watch(t, false)
	l := udevenv.Attach(t, udevenv.Ext4Image(t, "STICK", stickFiles(t, []byte("x"))...))
	ev := waitFor(t, events, l, func(e udev.Event) bool { return e.FSType == "ext4" })
	stick := &media.Media{MountDir: t.TempDir(), AllowDevices: []string{"loop"}, ExtraFilesystems: []string{"ext4"}}
	med, err := stick.Open(t.Context(), ev)
	if err != nil {
		t.Fatal(err)
	}
	// The agent dies here without Close; the next one sweeps at start.
	if err := stick.Sweep(); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if mountOptions(t, med.Dir) != nil {
		t.Error("still mounted after Sweep")
	}
	if _, err := os.Stat(med.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("mount point left after Sweep: %v", err)
	}
	if err := med.Close(); err != nil {
		t.Errorf("Close after Sweep: %v", err)
	}
}

// A stranger's ext4 stick, seen by the real udev, is not mounted by
// default: its driver is not hardened against a crafted image. The
// refusal says which key would read it, and nothing is mounted.
func TestStickWithExt4_IgnoredByDefault(t *testing.T) {
	udevenv.Require(t)
	img := udevenv.Ext4Image(t, "STICK", stickFiles(t, udevenv.SmallBundleTar(t, "1.0.0"))...)
	events := watch(t, false)
	l := udevenv.Attach(t, img)
	ev := waitFor(t, events, l, func(e udev.Event) bool { return e.FSType == "ext4" })
	mountDir := t.TempDir()
	_, err := (&media.Media{MountDir: mountDir, AllowDevices: []string{"loop"}}).Open(t.Context(), ev)
	if !errors.Is(err, media.ErrUnsupportedFS) || !strings.Contains(err.Error(), "media.extra_filesystems") {
		t.Fatalf("Open of an ext4 stick by default: %v, want ErrUnsupportedFS naming media.extra_filesystems", err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), l.Dev) || strings.Contains(string(mi), mountDir) {
		t.Fatalf("%s is mounted although refused", l.Dev)
	}
}
