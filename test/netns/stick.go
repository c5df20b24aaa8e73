package netns

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// Stick is a bundle on an ext4 filesystem on a loop device, mounted
// read-only as the agent mounts a stick: reads of it go through the
// device, where a cgroup can cap them (ThrottleReads).
type Stick struct {
	Tar string // the bundle's path on the mounted filesystem
	Dev string // the loop device's major:minor
}

// NewStick puts tarPath and its .sha256 on a fresh loop-mounted ext4
// (cold: nothing of it in the page cache). Agents that should not mount
// it themselves need media.detect = "manual" (a udevd may run beside).
func NewStick(t testing.TB, tarPath string) Stick {
	t.Helper()
	dir := t.TempDir()
	files := filepath.Join(dir, "files")
	if err := os.Mkdir(files, 0o755); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	sha := strings.TrimSuffix(tarPath, ".tar") + ".sha256"
	for _, p := range []string{tarPath, sha} {
		dst := filepath.Join(files, filepath.Base(p))
		if os.Link(p, dst) != nil {
			run(t, "cp", p, dst)
		}
	}
	img := filepath.Join(dir, "stick.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, (fi.Size()+fi.Size()/16+64<<20)&^(1<<20-1)); err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.ext4", "-q", "-d", files, img)
	out, err := exec.Command("losetup", "-f", "--show", img).Output()
	if err != nil {
		t.Fatalf("losetup %s: %v", img, err)
	}
	loop := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", loop).Run() })
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, "mount", "-o", "ro,nodev,nosuid,noexec", loop, mnt)
	t.Cleanup(func() { // before losetup -d
		if exec.Command("umount", mnt).Run() != nil {
			exec.Command("umount", "-l", mnt).Run() // still open: gone once closed
		}
	})
	dev := strings.TrimSpace(run(t, "lsblk", "-dno", "MAJ:MIN", loop))
	return Stick{Tar: filepath.Join(mnt, filepath.Base(tarPath)), Dev: dev}
}

// ThrottleReads caps what process pid reads from device dev
// (major:minor) at rate bytes/s: with cgroup v2's io.max where the io
// controller is available, else with cgroup v1's blkio throttle (these
// machines mount cgroup v1 for blkio). The process goes back to the root
// cgroup at cleanup.
func ThrottleReads(t testing.TB, pid int, dev string, rate int64) {
	t.Helper()
	root, file, line := "/sys/fs/cgroup/blkio", "blkio.throttle.read_bps_device", fmt.Sprintf("%s %d", dev, rate)
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && strings.Contains(" "+string(b)+" ", " io ") {
		root, file, line = "/sys/fs/cgroup", "io.max", fmt.Sprintf("%s rbps=%d", dev, rate)
		if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+io"), 0o644); err != nil {
			t.Fatalf("enable the io controller: %v", err)
		}
	}
	cg := filepath.Join(root, "ferry-stick-"+strconv.Itoa(pid))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatalf("a cgroup to throttle the stick: %v (needs root and cgroup v2 io or v1 blkio)", err)
	}
	t.Cleanup(func() {
		os.WriteFile(filepath.Join(root, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
		os.Remove(cg)
	})
	if err := os.WriteFile(filepath.Join(cg, file), []byte(line), 0o644); err != nil {
		t.Fatalf("throttle %s: %v", dev, err)
	}
	if err := os.WriteFile(filepath.Join(cg, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		t.Fatalf("move %d into %s: %v", pid, cg, err)
	}
}

// DiskUse is the bytes the files under dirs take on disk (allocated
// blocks: a sparse file counts what it holds).
func DiskUse(dirs ...string) int64 {
	var n int64
	for _, d := range dirs {
		filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err != nil {
				return nil // gone meanwhile (renamed, removed)
			}
			if fi, err := e.Info(); err == nil {
				n += blocks(fi)
			}
			return nil
		})
	}
	return n
}

func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func blocks(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}
