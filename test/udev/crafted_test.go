package udevtest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ferry-edge/ferry/media"
	"github.com/ferry-edge/ferry/test/udevenv"
	"github.com/ferry-edge/ferry/udev"
)

// secretMarker is in host files a crafted stick points at.
const secretMarker = "FERRY-SECRET-MARKER-91c3"

// craftedImage makes the ext4 image of an attacker's stick: the .sha256
// a symlink to a shadow-like host file, the .minisig a symlink to a
// kubeconfig-like one, the tar a FIFO (or, with tarData, a regular
// file holding it); and, since ferry once chose
// files by the directory entry's type, each entry's type byte is forged
// to say "regular file" (the image is made without metadata_csum so
// that the forged directory block is still read).
func craftedImage(t *testing.T, tarData []byte) string {
	t.Helper()
	host := t.TempDir()
	shadow := filepath.Join(host, "shadow")
	kubeconfig := filepath.Join(host, "kubeconfig")
	for p, body := range map[string]string{
		shadow:     "root:$y$j9T$" + secretMarker + ":19000:0:99999:7:::\n",
		kubeconfig: "token: " + secretMarker + "\n",
	} {
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	names := map[string]byte{ // name → its real ext4 file type
		"upgrade-1.0-x86_64.sha256":      7, // EXT4_FT_SYMLINK
		"upgrade-1.0-x86_64.tar.minisig": 7,
		"upgrade-1.0-x86_64.tar":         5, // EXT4_FT_FIFO
	}
	if err := os.Symlink(shadow, filepath.Join(root, "upgrade-1.0-x86_64.sha256")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(kubeconfig, filepath.Join(root, "upgrade-1.0-x86_64.tar.minisig")); err != nil {
		t.Fatal(err)
	}
	if tarData != nil {
		delete(names, "upgrade-1.0-x86_64.tar")
		if err := os.WriteFile(filepath.Join(root, "upgrade-1.0-x86_64.tar"), tarData, 0o644); err != nil {
			t.Fatal(err)
		}
	} else if err := unix.Mkfifo(filepath.Join(root, "upgrade-1.0-x86_64.tar"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(t.TempDir(), "crafted.img")
	udevenv.Run(t, "mkfs.ext4", "-q", "-F", "-O", "^metadata_csum", "-L", "EVIL", "-d", root, img, "16m")
	b, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	for name, typ := range names {
		// ext4_dir_entry_2: inode u32, rec_len u16, name_len u8, file_type u8, name.
		forged := 0
		for off := 0; ; {
			i := bytes.Index(b[off:], []byte(name))
			if i < 0 {
				break
			}
			i += off
			off = i + 1
			if i >= 8 && b[i-2] == byte(len(name)) && b[i-1] == typ {
				b[i-1] = 1 // EXT4_FT_REG_FILE
				forged++
			}
		}
		if forged == 0 {
			t.Fatalf("no directory entry for %s in the image", name)
		}
	}
	if err := os.WriteFile(img, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return img
}

// TestCraftedStick_RefusedWithoutLeakOrHang is issue 22's stick: its
// files lie about their type. Open refuses its bundle promptly with a
// reason naming the file and the fix, that holds nothing of the host
// files; and the same device, plugged again with a good stick, is read.
func TestCraftedStick_RefusedWithoutLeakOrHang(t *testing.T) {
	udevenv.Require(t)
	udevenv.RequireFS(t, "ext4")
	t.Run("FIFO tar, linked sidecars", func(t *testing.T) { craftedStick(t, nil, "upgrade-1.0-x86_64.tar", "a FIFO") })
	t.Run("good tar, .sha256 linked to a host file", func(t *testing.T) {
		craftedStick(t, udevenv.SmallBundleTar(t, "1.0"), "upgrade-1.0-x86_64.sha256", "symbolic link")
	})
}

func craftedStick(t *testing.T, tarData []byte, file, what string) {
	events := watch(t, false)
	l := udevenv.Attach(t, craftedImage(t, tarData))
	ev := waitFor(t, events, l, func(e udev.Event) bool { return e.FSType == "ext4" })

	type result struct {
		med *media.Medium
		err error
	}
	done := make(chan result, 1)
	go func() {
		med, err := openStick(t.Context(), ev, t.TempDir())
		done <- result{med, err}
	}()
	var res result
	select {
	case res = <-done:
	case <-time.After(bound):
		t.Fatalf("Open of the crafted stick did not return within %s (a FIFO blocks it)", bound)
	}
	if res.err != nil {
		t.Fatalf("Open: %v (want the stick mounted and its bundle refused)", res.err)
	}
	med := res.med
	// The forgery worked: the listing says "regular file" for each.
	entries, err := os.ReadDir(med.Dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "upgrade-") && !e.Type().IsRegular() {
			t.Errorf("%s: the image's entry type was not forged (%v): the test proves less", e.Name(), e.Type())
		}
	}
	if len(med.Candidates) != 1 {
		t.Fatalf("candidates %+v, want the one bundle, refused", med.Candidates)
	}
	c := med.Candidates[0]
	if !errors.Is(c.Err, media.ErrUnsafeFile) || c.Tar != nil || c.SHA256 != nil || c.Sig != nil {
		t.Fatalf("candidate %+v: want refused (ErrUnsafeFile) with no file open", c)
	}
	reason := c.Err.Error()
	t.Logf("reason: %s", reason)
	if strings.Contains(reason, secretMarker) || strings.Contains(reason, "root:") {
		t.Fatalf("the reason leaks a host file: %s", reason)
	}
	if !strings.Contains(reason, fmt.Sprintf("%q", file)) || !strings.Contains(reason, what) || !strings.Contains(reason, "copy the file itself") {
		t.Errorf("reason %q does not name %s, %s and the fix", reason, file, what)
	}
	// Even by path, nothing on this mount follows a link (nosymfollow).
	if b, err := os.ReadFile(filepath.Join(med.Dir, "upgrade-1.0-x86_64.sha256")); err == nil {
		t.Errorf("the .sha256 link was followed by path: %q", b)
	}
	if err := med.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	l.Detach()
	waitFor(t, events, l, udev.Event.Gone)

	// The same slot, a good stick: read as any other.
	tarData = udevenv.SmallBundleTar(t, "1.0.0")
	good := udevenv.AttachAt(t, l.Dev, udevenv.Ext4Image(t, "STICK", stickFiles(t, tarData)...))
	ev = waitFor(t, events, good, func(e udev.Event) bool { return e.FSType == "ext4" })
	med, err = openStick(t.Context(), ev, t.TempDir())
	if err != nil {
		t.Fatalf("Open of a good stick in the same slot: %v", err)
	}
	defer med.Close()
	if len(med.Candidates) != 1 || med.Candidates[0].Err != nil || med.Candidates[0].Tar == nil {
		t.Fatalf("good stick: candidates %+v", med.Candidates)
	}
	got, err := io.ReadAll(med.Candidates[0].Tar)
	if err != nil || !bytes.Equal(got, tarData) {
		t.Fatalf("good stick's tar read back differs (err %v)", err)
	}
}

// A loop device is no stick unless the config says so: nothing on it is
// read, and the refusal says which key to set.
func TestLoopDevice_RefusedByDefault(t *testing.T) {
	udevenv.Require(t)
	events := watch(t, false)
	l := udevenv.Attach(t, udevenv.RawImage(t, udevenv.File{Data: udevenv.SmallBundleTar(t, "1.0.0")}))
	ev := waitFor(t, events, l, func(e udev.Event) bool { return e.Size > 0 })
	_, err := media.Open(t.Context(), ev, t.TempDir())
	if !errors.Is(err, media.ErrNotRemovable) || !strings.Contains(err.Error(), fmt.Sprintf("%q to media.allow_devices", "loop")) {
		t.Fatalf("Open of a loop device by default: err = %v, want ErrNotRemovable naming media.allow_devices", err)
	}
}
