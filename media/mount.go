package media

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"golang.org/x/sys/unix"
)

// mountFlags keep a stick from doing anything but being read; with
// nosymfollow (Linux 5.10) no symbolic link on it is followed by anyone,
// on kernels that know the flag.
const mountFlags = unix.MS_RDONLY | unix.MS_NODEV | unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NOSYMFOLLOW

// fsMountData lists the filesystems ferry can mount, with the options that
// keep the kernel from writing to the stick (no journal replay). Only
// DefaultFilesystems are mounted unless Media.ExtraFilesystems names more.
var fsMountData = map[string]string{
	"vfat":    "",
	"exfat":   "",
	"ext2":    "",
	"ext3":    "noload",
	"ext4":    "noload",
	"xfs":     "norecovery",
	"iso9660": "",
}

// DefaultFilesystems are mounted on any stick: what a technician's stick
// holds. A raw stick (a tar written to the device) is read too.
var DefaultFilesystems = []string{"vfat", "exfat", "iso9660"}

// ExtraFilesystems may be named in Media.ExtraFilesystems. Their kernel
// drivers are not hardened against a crafted image, so a stranger's stick
// of one of them is not mounted unless the node's config says so.
var ExtraFilesystems = []string{"ext2", "ext3", "ext4", "xfs"}

func (m *Media) mount(dev, fsType string) (*Medium, error) {
	data, ok := fsMountData[fsType]
	if !ok {
		return nil, fmt.Errorf("%s: %w %q: ferry reads vfat, exfat and iso9660 (ext2/3/4 and xfs where the config allows); copy the bundle to such a stick, or write it raw", dev, ErrUnsupportedFS, fsType)
	}
	if !slices.Contains(DefaultFilesystems, fsType) && !slices.Contains(m.ExtraFilesystems, fsType) {
		err := fmt.Errorf("%s: %w %q: not mounted by default, since its kernel driver is not hardened against a crafted stick; copy the bundle to a vfat, exFAT or iso9660 stick, or write it raw, or allow %s in media.extra_filesystems in ferry's config", dev, ErrUnsupportedFS, fsType, fsType)
		m.log().Warn("stick ignored: its filesystem is not read by default", "device", dev, "fstype", fsType, "err", err)
		return nil, err
	}
	if m.MountDir == "" {
		return nil, fmt.Errorf("%s: %w: no mount directory configured", dev, ErrMount)
	}
	if err := os.MkdirAll(m.MountDir, 0o700); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", dev, ErrMount, err)
	}
	dir, err := os.MkdirTemp(m.MountDir, filepath.Base(dev)+"-")
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", dev, ErrMount, err)
	}
	if err := m.mountRO(dev, fsType, dir, data); err != nil {
		os.Remove(dir)
		switch {
		case errors.Is(err, unix.ENODEV):
			return nil, fmt.Errorf("%s: %w: this kernel has no %s driver (modprobe %s)", dev, ErrUnsupportedFS, fsType, fsType)
		case errors.Is(err, unix.ENXIO), errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOMEDIUM):
			return nil, fmt.Errorf("%s: %w: %w", dev, ErrNoMedium, err)
		default:
			return nil, fmt.Errorf("%s: %w as %s: %w (the filesystem may be damaged, or the stick was pulled)", dev, ErrMount, fsType, err)
		}
	}
	med := &Medium{Device: dev, FSType: fsType, Dir: dir}
	cands, err := findCandidates(dir)
	med.Candidates = cands
	if err == nil && len(cands) == 0 {
		err = fmt.Errorf("%w: no upgrade-*.tar at the root of the %s filesystem", ErrNotBundle, fsType)
	}
	if err != nil {
		if cerr := med.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, fmt.Errorf("%s: %w", dev, err)
	}
	return med, nil
}

// mountRO mounts ev's device read-only at dir with mountFlags; a kernel
// that refuses nosymfollow (EINVAL before Linux 5.10) gets the mount
// without it, said once in the log: the files are still opened without
// following symbolic links (findCandidates).
func (m *Media) mountRO(dev, fsType, dir, data string) error {
	err := unix.Mount(dev, dir, fsType, mountFlags, data)
	if errors.Is(err, unix.EINVAL) {
		if err2 := unix.Mount(dev, dir, fsType, mountFlags&^unix.MS_NOSYMFOLLOW, data); err2 == nil {
			m.noSymfollow.Do(func() {
				m.log().Warn("this kernel refuses the nosymfollow mount option (Linux 5.10 has it): sticks are mounted without it; ferry still opens no symbolic link on them", "device", dev)
			})
			return nil
		}
	}
	return err
}

// Sweep unmounts (lazily) whatever is mounted under MountDir and removes
// the leftover mount points: what a crashed agent left behind. Call it at
// start, before opening anything.
func (m *Media) Sweep() error {
	if m.MountDir == "" {
		return nil
	}
	mis, err := readMountInfo(m.mountInfo())
	if err != nil {
		return err
	}
	var points []string
	for _, mi := range mis {
		if within(mi.point, m.MountDir) && filepath.Clean(mi.point) != filepath.Clean(m.MountDir) {
			points = append(points, mi.point)
		}
	}
	// Deepest first.
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	entries, err := os.ReadDir(m.MountDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, e := range entries {
		if e.IsDir() {
			// Remove (not RemoveAll): a mount point still mounted is busy
			// and must not be emptied recursively.
			_ = os.Remove(filepath.Join(m.MountDir, e.Name()))
		}
	}
	return errors.Join(errs...)
}
