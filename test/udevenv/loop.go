package udevenv

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Loop is an image attached as a loop device: a plugged stick.
type Loop struct {
	Dev   string // "/dev/loop3"
	Image string
	// DiskSeq is the kernel's sequence number for this attachment: udev
	// events about it carry it, events left over from an earlier user of
	// the same /dev/loopN carry another.
	DiskSeq uint64
	t       testing.TB
}

// Attach attaches image with `losetup -f --show`: udev then reports a
// `change` event for Dev carrying ID_FS_TYPE. The device is detached (and
// anything still mounted from it lazily unmounted) when the test ends,
// whatever its outcome.
func Attach(t testing.TB, image string) *Loop {
	t.Helper()
	dev := Run(t, "losetup", "-f", "--show", image)
	l := &Loop{Dev: dev, Image: image, t: t}
	if b, err := os.ReadFile("/sys/class/block/" + strings.TrimPrefix(dev, "/dev/") + "/diskseq"); err == nil {
		l.DiskSeq, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	t.Cleanup(l.cleanup)
	return l
}

// AttachAt attaches image to the loop device dev (`losetup DEV IMAGE`),
// as Attach does: the same stick slot, plugged again with another stick.
// dev must be free (detached).
func AttachAt(t testing.TB, dev, image string) *Loop {
	t.Helper()
	Run(t, "losetup", dev, image)
	l := &Loop{Dev: dev, Image: image, t: t}
	if b, err := os.ReadFile("/sys/class/block/" + strings.TrimPrefix(dev, "/dev/") + "/diskseq"); err == nil {
		l.DiskSeq, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	t.Cleanup(l.cleanup)
	return l
}

// Detach detaches the device (`losetup -d`): udev reports a `change` with
// no ID_FS_TYPE and size 0. Note the kernel defers the detach while the
// device is open or mounted (it sets autoclear): use Pull to take a stick
// away from under a reader.
func (l *Loop) Detach() {
	l.t.Helper()
	Run(l.t, "losetup", "-d", l.Dev)
}

// Pull takes the medium away from under whoever reads it, as pulling a
// USB stick does: the image is emptied and the device's capacity set to 0
// (`losetup -c`), so reads return EOF or EIO and udev reports a `change`
// with size 0; then the device is detached, which the kernel completes
// when its last user closes it. The image is consumed: make another to
// plug the stick again.
func (l *Loop) Pull() {
	l.t.Helper()
	if err := os.Truncate(l.Image, 0); err != nil {
		l.t.Fatal(err)
	}
	Run(l.t, "losetup", "-c", l.Dev)
	Run(l.t, "losetup", "-d", l.Dev)
}

// Is reports whether ev is about this attachment: same device, and the
// same diskseq when the kernel has one.
func (l *Loop) Is(dev string, diskSeq uint64) bool {
	return dev == l.Dev && (l.DiskSeq == 0 || diskSeq == l.DiskSeq)
}

// Backing is the file the device is attached to now ("" when detached).
func (l *Loop) Backing() string {
	b, err := os.ReadFile("/sys/class/block/" + strings.TrimPrefix(l.Dev, "/dev/") + "/loop/backing_file")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (l *Loop) cleanup() {
	// A failed test may leave the device mounted: detach those mounts, or
	// the loop device stays busy forever.
	var st unix.Stat_t
	if unix.Stat(l.Dev, &st) == nil {
		num := fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
		for _, mp := range mountsOf(num) {
			_ = unix.Unmount(mp, unix.MNT_DETACH)
		}
	}
	if l.Backing() == l.Image {
		// Only our own attachment: the device may have been reused since.
		_, _ = run("losetup", "-d", l.Dev)
	}
}

// mountsOf lists the mount points of device number num ("7:3").
func mountsOf(num string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 4 && fs[2] == num {
			out = append(out, fs[4])
		}
	}
	return out
}
