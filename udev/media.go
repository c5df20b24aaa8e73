package udev

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

var (
	// ErrNotBundle: the device holds no upgrade bundle (no upgrade-*.tar at
	// the root of its filesystem, or no raw tar starting with metadata.json).
	ErrNotBundle = errors.New("no upgrade bundle on this device")
	// ErrSystemDevice: the device belongs to this node (it, or another
	// partition of its disk, is mounted, used as swap or held by LVM/RAID).
	ErrSystemDevice = errors.New("device is in use by this node")
	// ErrNoMedium: the device is empty or gone (zero size, pulled).
	ErrNoMedium = errors.New("device has no medium")
	// ErrUnsupportedFS: a filesystem ferry does not read, or one the
	// kernel has no driver for.
	ErrUnsupportedFS = errors.New("unsupported filesystem")
	// ErrMount: mounting failed for another reason.
	ErrMount = errors.New("cannot mount device")
)

// metadataName is the first entry of a bundle tar (bundle.MetadataName).
const metadataName = "metadata.json"

// mountFlags keep a stick from doing anything but being read.
const mountFlags = unix.MS_RDONLY | unix.MS_NODEV | unix.MS_NOSUID | unix.MS_NOEXEC

// fsMountData lists the filesystems ferry mounts, with the options that keep
// the kernel from writing to the stick (no journal replay).
var fsMountData = map[string]string{
	"vfat":    "",
	"exfat":   "",
	"ext2":    "",
	"ext3":    "noload",
	"ext4":    "noload",
	"xfs":     "norecovery",
	"iso9660": "",
}

// Candidate is one bundle found on a medium.
type Candidate struct {
	// Name is the tar's base name ("upgrade-4.13.7-x86_64.tar"), or the
	// device's ("sdb") for a raw bundle.
	Name    string
	TarPath string // the tar file, or the device node itself when Raw
	// SHA256Path and SigPath are "" when the stick has no such file (always
	// for a raw bundle).
	SHA256Path string // <base>.sha256
	SigPath    string // <base>.tar.minisig
	Raw        bool
}

// Medium is an opened device: mounted (Dir set) or raw. Close it when done
// or when the device goes away.
type Medium struct {
	Device     string
	FSType     string
	Dir        string // mount point; "" for a raw medium
	Candidates []Candidate

	once     sync.Once
	closeErr error
}

// Close unmounts the medium (lazily if it is busy or its device is gone)
// and removes its mount point. It is safe to call more than once.
func (m *Medium) Close() error {
	m.once.Do(func() {
		if m.Dir == "" {
			return
		}
		m.closeErr = unmount(m.Dir)
	})
	return m.closeErr
}

func unmount(dir string) error {
	err := unix.Unmount(dir, 0)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		// Busy (a reader still holds a file) or the device is gone: detach
		// now, the kernel finishes when the last file closes.
		if derr := unix.Unmount(dir, unix.MNT_DETACH); derr != nil && !errors.Is(derr, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w (unmount it by hand: umount -l %s)", dir, derr, dir)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove mount point: %w", err)
	}
	return nil
}

// Media opens devices. The zero value of the path fields means the host's.
type Media struct {
	MountDir  string // private mount points are made under it
	Sys       string // "/sys"
	MountInfo string // "/proc/self/mountinfo"
	Swaps     string // "/proc/swaps"
}

// Open opens the device of ev with the host's defaults; see Media.Open.
func Open(ctx context.Context, ev Event, mountDir string) (*Medium, error) {
	return (&Media{MountDir: mountDir}).Open(ctx, ev)
}

func (m *Media) sys() string       { return or(m.Sys, "/sys") }
func (m *Media) mountInfo() string { return or(m.MountInfo, "/proc/self/mountinfo") }
func (m *Media) swaps() string     { return or(m.Swaps, "/proc/swaps") }

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Open looks for bundles on ev's device. A device that starts with a tar
// whose first entry is metadata.json is a raw bundle (candidate = the device
// node). Otherwise a device with a filesystem ferry reads is mounted
// read-only, nodev, nosuid, noexec in a new directory under MountDir, and
// every regular file upgrade-*.tar at its root is a candidate. The device
// is refused (ErrSystemDevice) when it is part of a disk this node uses.
// Errors wrap ErrNoMedium, ErrSystemDevice, ErrNotBundle, ErrUnsupportedFS
// or ErrMount.
func (m *Media) Open(ctx context.Context, ev Event) (*Medium, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if ev.Action == Remove {
		return nil, fmt.Errorf("%s: %w", ev.DevPath, ErrNoMedium)
	}
	if err := m.Check(ev.DevPath); err != nil {
		return nil, err
	}
	raw, err := startsWithBundle(ev.DevPath)
	if err != nil {
		return nil, err
	}
	if raw {
		return &Medium{Device: ev.DevPath, Candidates: []Candidate{{
			Name: filepath.Base(ev.DevPath), TarPath: ev.DevPath, Raw: true,
		}}}, nil
	}
	if ev.FSType == "" {
		return nil, fmt.Errorf("%s: %w (no filesystem, and no tar starting with %s)", ev.DevPath, ErrNotBundle, metadataName)
	}
	return m.mount(ev)
}

// Check refuses (ErrSystemDevice) a device that is part of a disk this node
// uses: the device or any partition of its disk is mounted outside
// MountDir, is swap, or is held by another block device (LVM, RAID,
// dm-crypt); so the root disk's partitions are refused. An empty device is
// ErrNoMedium.
func (m *Media) Check(dev string) error {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO) {
			return fmt.Errorf("%s: %w", dev, ErrNoMedium)
		}
		return fmt.Errorf("%s: %w", dev, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return fmt.Errorf("%s: %w: not a block device", dev, ErrNotBundle)
	}
	return m.checkDisk(dev, fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)))
}

// checkDisk is Check for the device numbered num ("major:minor").
func (m *Media) checkDisk(dev, num string) error {
	sysDir, err := filepath.EvalSymlinks(filepath.Join(m.sys(), "dev", "block", num))
	if err != nil {
		return fmt.Errorf("%s: %w: no sysfs entry for %s: %w", dev, ErrNoMedium, num, err)
	}
	if readSize(sysDir) == 0 {
		return fmt.Errorf("%s: %w (size 0)", dev, ErrNoMedium)
	}
	disk := sysDir
	if _, err := os.Stat(filepath.Join(sysDir, "partition")); err == nil {
		disk = filepath.Dir(sysDir)
	}
	parts := []string{disk}
	if entries, err := os.ReadDir(disk); err == nil {
		for _, e := range entries {
			p := filepath.Join(disk, e.Name())
			if _, err := os.Stat(filepath.Join(p, "partition")); err == nil {
				parts = append(parts, p)
			}
		}
	}
	mounts, err := m.mountsByDev()
	if err != nil {
		return err
	}
	swaps := m.swapDevs()
	for _, p := range parts {
		name := filepath.Base(p)
		b, err := os.ReadFile(filepath.Join(p, "dev"))
		if err != nil {
			continue
		}
		pn := strings.TrimSpace(string(b))
		if mp, ok := mounts[pn]; ok {
			return fmt.Errorf("%s: %w: %s is mounted at %s", dev, ErrSystemDevice, name, mp)
		}
		if swaps[pn] {
			return fmt.Errorf("%s: %w: %s is swap", dev, ErrSystemDevice, name)
		}
		if hs, _ := os.ReadDir(filepath.Join(p, "holders")); len(hs) > 0 {
			return fmt.Errorf("%s: %w: %s is held by %s", dev, ErrSystemDevice, name, hs[0].Name())
		}
	}
	return nil
}

// mountsByDev maps "major:minor" to a mount point, for mounts outside
// MountDir.
func (m *Media) mountsByDev() (map[string]string, error) {
	mis, err := readMountInfo(m.mountInfo())
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, mi := range mis {
		if m.MountDir != "" && within(mi.point, m.MountDir) {
			continue
		}
		if _, ok := out[mi.dev]; !ok {
			out[mi.dev] = mi.point
		}
	}
	return out, nil
}

func (m *Media) swapDevs() map[string]bool {
	out := map[string]bool{}
	f, err := os.Open(m.swaps())
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || !strings.HasPrefix(fields[0], "/") {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(unescapeMount(fields[0]), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK {
			out[fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))] = true
		}
	}
	return out
}

func within(path, dir string) bool {
	rel, err := filepath.Rel(filepath.Clean(dir), filepath.Clean(path))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

type mountEntry struct {
	dev, point, fstype string
}

// readMountInfo parses /proc/self/mountinfo.
func readMountInfo(path string) ([]mountEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		e := mountEntry{dev: fields[2], point: unescapeMount(fields[4])}
		for i := 5; i < len(fields)-1; i++ {
			if fields[i] == "-" {
				e.fstype = fields[i+1]
				break
			}
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	return out, nil
}

// unescapeMount undoes the kernel's \ooo escapes of space, tab, newline and
// backslash in mount paths.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// startsWithBundle reports whether dev starts with a tar whose first entry
// is the regular file metadata.json.
func startsWithBundle(dev string) (bool, error) {
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENOMEDIUM) {
			return false, fmt.Errorf("%s: %w: %w", dev, ErrNoMedium, err)
		}
		return false, fmt.Errorf("%s: %w", dev, err)
	}
	defer f.Close()
	ok, err := isBundleTar(f)
	if err != nil {
		return false, fmt.Errorf("%s: reading the first block: %w (the device may have been pulled)", dev, err)
	}
	return ok, nil
}

// isBundleTar reads at most 64 KiB of r (a PAX header may come first) and
// reports whether it is a tar whose first entry is metadata.json. Only a
// read error is an error; anything that is not such a tar is false.
func isBundleTar(r io.Reader) (bool, error) {
	er := &errReader{r: io.LimitReader(r, 64<<10)}
	hdr, err := tar.NewReader(er).Next()
	if er.err != nil {
		return false, er.err
	}
	if err != nil {
		return false, nil
	}
	return hdr.Name == metadataName && hdr.Typeflag == tar.TypeReg, nil
}

// errReader remembers a read error other than EOF, so that it can be told
// apart from a malformed tar.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
}

func (m *Media) mount(ev Event) (*Medium, error) {
	data, ok := fsMountData[ev.FSType]
	if !ok {
		return nil, fmt.Errorf("%s: %w %q: ferry reads vfat, exfat, ext2/3/4, xfs and iso9660; copy the bundle to such a stick, or write it raw", ev.DevPath, ErrUnsupportedFS, ev.FSType)
	}
	if m.MountDir == "" {
		return nil, fmt.Errorf("%s: %w: no mount directory configured", ev.DevPath, ErrMount)
	}
	if err := os.MkdirAll(m.MountDir, 0o700); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", ev.DevPath, ErrMount, err)
	}
	dir, err := os.MkdirTemp(m.MountDir, filepath.Base(ev.DevPath)+"-")
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", ev.DevPath, ErrMount, err)
	}
	if err := unix.Mount(ev.DevPath, dir, ev.FSType, mountFlags, data); err != nil {
		os.Remove(dir)
		switch {
		case errors.Is(err, unix.ENODEV):
			return nil, fmt.Errorf("%s: %w: this kernel has no %s driver (modprobe %s)", ev.DevPath, ErrUnsupportedFS, ev.FSType, ev.FSType)
		case errors.Is(err, unix.ENXIO), errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOMEDIUM):
			return nil, fmt.Errorf("%s: %w: %w", ev.DevPath, ErrNoMedium, err)
		default:
			return nil, fmt.Errorf("%s: %w as %s: %w (the filesystem may be damaged, or the stick was pulled)", ev.DevPath, ErrMount, ev.FSType, err)
		}
	}
	med := &Medium{Device: ev.DevPath, FSType: ev.FSType, Dir: dir}
	cands, err := findCandidates(dir)
	if err == nil && len(cands) == 0 {
		err = fmt.Errorf("%w: no upgrade-*.tar at the root of the %s filesystem", ErrNotBundle, ev.FSType)
	}
	if err != nil {
		if cerr := med.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, fmt.Errorf("%s: %w", ev.DevPath, err)
	}
	med.Candidates = cands
	return med, nil
}

// findCandidates lists the regular files upgrade-*.tar at the root of dir
// (names matched without regard to case, for FAT sticks), each with its
// <base>.sha256 and <base>.tar.minisig when present. Symlinks are ignored.
func findCandidates(dir string) ([]Candidate, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing the stick: %w", err)
	}
	regular := map[string]string{} // lower-case name → name
	for _, e := range entries {
		if e.Type().IsRegular() {
			regular[strings.ToLower(e.Name())] = e.Name()
		}
	}
	find := func(name string) string {
		if n, ok := regular[strings.ToLower(name)]; ok {
			return filepath.Join(dir, n)
		}
		return ""
	}
	var out []Candidate
	for lower, name := range regular {
		if !strings.HasPrefix(lower, "upgrade-") || !strings.HasSuffix(lower, ".tar") {
			continue
		}
		base := name[:len(name)-len(".tar")]
		out = append(out, Candidate{
			Name:       name,
			TarPath:    filepath.Join(dir, name),
			SHA256Path: find(base + ".sha256"),
			SigPath:    find(name + ".minisig"),
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
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
