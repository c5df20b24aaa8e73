package netns

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ferry-edge/ferry/test/udevenv"
)

// Stick is a bundle on an ext4 filesystem on a loop device, mounted
// read-only as the agent mounts a stick: reads of it go through the
// device, where a cgroup can cap them (udevenv.CapReads).
type Stick struct {
	Tar string // the bundle's path on the mounted filesystem
	Dev string // the loop device
}

// NewStick puts tarPath and its .sha256 on a fresh loop-mounted ext4
// (cold: nothing of it in the page cache). Agents that should not mount
// it themselves need media.detect = "manual" (a udevd may run beside).
func NewStick(t testing.TB, tarPath string) Stick {
	t.Helper()
	sha := strings.TrimSuffix(tarPath, ".tar") + ".sha256"
	img := udevenv.Ext4Image(t, "FERRY", udevenv.File{Name: filepath.Base(tarPath), Path: tarPath},
		udevenv.File{Name: filepath.Base(sha), Path: sha})
	loop := udevenv.Attach(t, img) // its cleanup unmounts, lazily if still open
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	udevenv.Run(t, "mount", "-o", "ro,nodev,nosuid,noexec", loop.Dev, mnt)
	return Stick{Tar: filepath.Join(mnt, filepath.Base(tarPath)), Dev: loop.Dev}
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

func blocks(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}
