package vm

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// MakeVFATStick writes a FAT32 stick image (no partition table, like a
// "superfloppy" stick) holding files at its root, without mounting
// anything (mkfs.vfat + mcopy).
func MakeVFATStick(ctx context.Context, img string, files ...string) error {
	var total int64
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return err
		}
		total += st.Size()
	}
	size := max(64<<20, total+total/10+(16<<20)) // FAT32 needs ≥ 33 MiB
	size = (size + (1 << 20) - 1) &^ ((1 << 20) - 1)
	os.Remove(img)
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		return err
	}
	if err := os.Truncate(img, size); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "mkfs.vfat", "-F", "32", "-n", "FERRY", img).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.vfat: %w: %s", err, out)
	}
	args := append([]string{"-i", img}, files...)
	args = append(args, "::/")
	cmd := exec.CommandContext(ctx, "mcopy", args...)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mcopy: %w: %s", err, out)
	}
	return nil
}

// MakeRawStick writes tarPath onto a stick image the way `dd of=/dev/sdX`
// does: the tar at offset 0, the rest of the device zeros (the image is
// rounded up to whole MiB, as real devices are).
func MakeRawStick(img, tarPath string) error {
	src, err := os.Open(tarPath)
	if err != nil {
		return err
	}
	defer src.Close()
	os.MkdirAll(filepath.Dir(img), 0o755)
	dst, err := os.Create(img)
	if err != nil {
		return err
	}
	n, err := io.Copy(dst, src)
	if err != nil {
		dst.Close()
		return err
	}
	if err := dst.Truncate((n + 2<<20) &^ ((1 << 20) - 1)); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// MakeISO writes an ISO 9660 image holding files at its root, as an
// engineer burns a bundle for BMC virtual media (genisoimage; level 3
// holds files over 4 GiB, Joliet and Rock Ridge keep the names).
func MakeISO(ctx context.Context, img string, files ...string) error {
	os.Remove(img)
	args := append([]string{"-quiet", "-iso-level", "3", "-J", "-R", "-V", "FERRY", "-o", img}, files...)
	if out, err := exec.CommandContext(ctx, "genisoimage", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("genisoimage: %w: %s", err, out)
	}
	return nil
}

// MakeExFATStick formats a sparse image of size bytes as exFAT (no
// partition table, mkfs.exfat) and runs fill with the stick's root
// mounted read-write. The host's kernel may have no exfat driver (the
// guest's has), so the stick is mounted through exfat-fuse on a loop
// device.
func MakeExFATStick(ctx context.Context, img string, size int64, fill func(root string) error) error {
	os.Remove(img)
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		return err
	}
	if err := os.Truncate(img, size); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "mkfs.exfat", "-L", "FERRY", img).CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.exfat: %w: %s", err, out)
	}
	return WithExFATMounted(ctx, img, true, fill)
}

// WithExFATMounted runs fn with the exFAT stick image img mounted
// (exfat-fuse over a loop device; read-only unless rw), and unmounts it.
func WithExFATMounted(ctx context.Context, img string, rw bool, fn func(root string) error) (err error) {
	loopArgs, fuseOpts := []string{"-f", "--show"}, "rw"
	if !rw {
		loopArgs, fuseOpts = []string{"-f", "--show", "-r"}, "ro"
	}
	out, err := exec.CommandContext(ctx, "losetup", append(loopArgs, img)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("losetup %s: %w: %s", img, err, out)
	}
	loop := strings.TrimSpace(string(out))
	defer func() {
		if out, derr := exec.Command("losetup", "-d", loop).CombinedOutput(); derr != nil && err == nil {
			err = fmt.Errorf("losetup -d %s: %w: %s", loop, derr, out)
		}
	}()
	root, err := os.MkdirTemp("", "ferry-exfat-")
	if err != nil {
		return err
	}
	defer os.Remove(root)
	// exfat-fuse wants a block device when run as root: hence the loop device
	if out, err := exec.CommandContext(ctx, "mount.exfat-fuse", "-o", fuseOpts, loop, root).CombinedOutput(); err != nil {
		return fmt.Errorf("mount.exfat-fuse %s: %w: %s", loop, err, out)
	}
	defer func() {
		// fusermount/umount return once exfat-fuse has written everything back
		if out, uerr := exec.Command("umount", root).CombinedOutput(); uerr != nil && err == nil {
			err = fmt.Errorf("umount %s: %w: %s", root, uerr, out)
		}
	}()
	return fn(root)
}

// copyInto copies files into dir.
func copyInto(dir string, files ...string) error {
	for _, f := range files {
		src, err := os.Open(f)
		if err != nil {
			return err
		}
		dst, err := os.Create(filepath.Join(dir, filepath.Base(f)))
		if err != nil {
			src.Close()
			return err
		}
		_, err = io.Copy(dst, src)
		src.Close()
		if cerr := dst.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}
