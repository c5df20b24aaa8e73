package udev

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/ferry-edge/ferry/internal/safefile"
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
	// ErrUnsafeFile: a file on the stick that ferry does not read: a
	// symbolic link, a FIFO, a device, a directory where a bundle file
	// is named, or a sidecar over MaxSidecar.
	ErrUnsafeFile = errors.New("unsafe file on the stick")
)

// MaxSidecar bounds a .sha256 or .tar.minisig on a stick: each is a line
// or a few, and a minisig travels to every peer.
const MaxSidecar = 4 << 10

// metadataName is the first entry of a bundle tar (bundle.MetadataName).
const metadataName = "metadata.json"

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

// Candidate is one bundle found on a medium.
//
// The files of a mounted stick are opened when the stick is, relative to
// the mount, refusing symbolic links and anything but regular files
// (Err); read them through Tar, SHA256 and Sig (or /proc/self/fd/N of
// them), never by opening the paths again.
type Candidate struct {
	// Name is the tar's base name ("upgrade-4.13.7-x86_64.tar"), or the
	// device's ("sdb") for a raw bundle.
	Name    string
	TarPath string // where the tar is (for messages), or the device node itself when Raw
	// SHA256Path and SigPath are "" when the stick has no such file (always
	// for a raw bundle); for messages, like TarPath.
	SHA256Path string // <base>.sha256
	SigPath    string // <base>.tar.minisig
	Raw        bool

	// Tar, SHA256 and Sig are the files, open until the Medium is closed;
	// nil for a raw bundle, for a sidecar the stick lacks, and when Err is
	// set.
	Tar, SHA256, Sig *os.File
	// Err, wrapping ErrUnsafeFile, says why this bundle cannot be read (a
	// symlink, a FIFO, an oversized sidecar…): refuse it with this
	// reason. It names the file and the fix, never the file's bytes.
	Err error
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
		for _, c := range m.Candidates {
			for _, f := range []*os.File{c.Tar, c.SHA256, c.Sig} {
				if f != nil {
					f.Close()
				}
			}
		}
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
	UdevData  string // "/run/udev/data"
	// AllowDevices are the kinds of device read besides removable, USB
	// and MMC ones (see DeviceKinds): "loop", "virtio", "nvme", "scsi",
	// "ata", or "any".
	AllowDevices []string
	// ExtraFilesystems are filesystems mounted besides DefaultFilesystems:
	// some of ExtraFilesystems. Empty by default.
	ExtraFilesystems []string
	// Log is told what the kernel refuses (nosymfollow) and which sticks
	// are left unmounted for their filesystem; nil discards.
	Log *slog.Logger

	noSymfollow sync.Once // logs once that the kernel lacks nosymfollow
}

// Open opens the device of ev with the host's defaults; see Media.Open.
func Open(ctx context.Context, ev Event, mountDir string) (*Medium, error) {
	return (&Media{MountDir: mountDir}).Open(ctx, ev)
}

func (m *Media) sys() string       { return or(m.Sys, "/sys") }
func (m *Media) mountInfo() string { return or(m.MountInfo, "/proc/self/mountinfo") }
func (m *Media) swaps() string     { return or(m.Swaps, "/proc/swaps") }
func (m *Media) udevData() string  { return or(m.UdevData, "/run/udev/data") }

func (m *Media) log() *slog.Logger {
	if m.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return m.Log
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Open looks for bundles on ev's device. A device that starts with a tar
// whose first entry is metadata.json is a raw bundle (candidate = the device
// node). Otherwise a device with a filesystem ferry reads is mounted
// read-only, nodev, nosuid, noexec, nosymfollow in a new directory under
// MountDir, and every upgrade-*.tar at its root is a candidate, opened
// with its sidecars (see Candidate). The device is refused
// (ErrSystemDevice) when it is part of a disk this node uses, and
// (ErrNotRemovable) when it is not a removable, USB or MMC device nor of
// a kind in AllowDevices, before anything on it is read. Errors wrap
// ErrNoMedium, ErrSystemDevice, ErrNotRemovable, ErrNotBundle,
// ErrUnsupportedFS or ErrMount.
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
	if err := m.CheckKind(ev.DevPath); err != nil {
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
		return nil, fmt.Errorf("%s: %w %q: ferry reads vfat, exfat and iso9660 (ext2/3/4 and xfs where the config allows); copy the bundle to such a stick, or write it raw", ev.DevPath, ErrUnsupportedFS, ev.FSType)
	}
	if !slices.Contains(DefaultFilesystems, ev.FSType) && !slices.Contains(m.ExtraFilesystems, ev.FSType) {
		err := fmt.Errorf("%s: %w %q: not mounted by default, since its kernel driver is not hardened against a crafted stick; copy the bundle to a vfat, exFAT or iso9660 stick, or write it raw, or allow %s in media.extra_filesystems in ferry's config", ev.DevPath, ErrUnsupportedFS, ev.FSType, ev.FSType)
		m.log().Warn("stick ignored: its filesystem is not read by default", "device", ev.DevPath, "fstype", ev.FSType, "err", err)
		return nil, err
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
	if err := m.mountRO(ev, dir, data); err != nil {
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
	med.Candidates = cands
	if err == nil && len(cands) == 0 {
		err = fmt.Errorf("%w: no upgrade-*.tar at the root of the %s filesystem", ErrNotBundle, ev.FSType)
	}
	if err != nil {
		if cerr := med.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, fmt.Errorf("%s: %w", ev.DevPath, err)
	}
	return med, nil
}

// mountRO mounts ev's device read-only at dir with mountFlags; a kernel
// that refuses nosymfollow (EINVAL before Linux 5.10) gets the mount
// without it, said once in the log: the files are still opened without
// following symbolic links (findCandidates).
func (m *Media) mountRO(ev Event, dir, data string) error {
	err := unix.Mount(ev.DevPath, dir, ev.FSType, mountFlags, data)
	if errors.Is(err, unix.EINVAL) {
		if err2 := unix.Mount(ev.DevPath, dir, ev.FSType, mountFlags&^unix.MS_NOSYMFOLLOW, data); err2 == nil {
			m.noSymfollow.Do(func() {
				m.log().Warn("this kernel refuses the nosymfollow mount option (Linux 5.10 has it): sticks are mounted without it; ferry still opens no symbolic link on them", "device", ev.DevPath)
			})
			return nil
		}
	}
	return err
}

// findCandidates lists upgrade-*.tar at the root of dir (names matched
// without regard to case, for FAT sticks), each with its <base>.sha256
// and <base>.tar.minisig when present, and opens them (safefile.OpenBeneath):
// relative to dir, no symbolic links, regular files only, never blocking.
// The directory entry's type is not trusted (on ext4 or xfs it is a byte
// the stick's maker chose): a name that opens as anything but a regular
// file makes its candidate's Err. On error, the files already opened are
// in the returned candidates, for Medium.Close.
func findCandidates(dir string) ([]Candidate, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("listing the stick: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("listing the stick: %w", err)
	}
	byLower := map[string]string{} // lower-case name → name
	for _, n := range names {
		byLower[strings.ToLower(n)] = n
	}
	var out []Candidate
	for lower, name := range byLower {
		if !strings.HasPrefix(lower, "upgrade-") || !strings.HasSuffix(lower, ".tar") {
			continue
		}
		base := name[:len(name)-len(".tar")]
		c := Candidate{Name: name, TarPath: filepath.Join(dir, name)}
		if n, ok := byLower[strings.ToLower(base+".sha256")]; ok {
			c.SHA256Path = filepath.Join(dir, n)
		}
		if n, ok := byLower[strings.ToLower(name+".minisig")]; ok {
			c.SigPath = filepath.Join(dir, n)
		}
		c.open(d)
		out = append(out, c)
	}
	// Those that can be read first: a stick's stray link does not hide
	// its bundle.
	sort.Slice(out, func(i, j int) bool {
		if (out[i].Err == nil) != (out[j].Err == nil) {
			return out[i].Err == nil
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// open opens c's files in the stick's root d; on the first refusal it
// closes them and sets Err.
func (c *Candidate) open(d *os.File) {
	var err error
	if c.Tar, err = openOnStick(d, c.TarPath, 0); err == nil && c.SHA256Path != "" {
		c.SHA256, err = openOnStick(d, c.SHA256Path, MaxSidecar)
	}
	if err == nil && c.SigPath != "" {
		c.Sig, err = openOnStick(d, c.SigPath, MaxSidecar)
	}
	if err != nil {
		for _, f := range []*os.File{c.Tar, c.SHA256, c.Sig} {
			if f != nil {
				f.Close()
			}
		}
		c.Tar, c.SHA256, c.Sig, c.Err = nil, nil, nil, err
	}
}

// openOnStick opens the file at path (in d) as safefile.OpenBeneath does,
// refusing it (ErrUnsafeFile) when it is not a regular file or, with
// max > 0, when it is over max bytes. The error names the file and the
// fix.
func openOnStick(d *os.File, path string, max int64) (*os.File, error) {
	name := filepath.Base(path)
	f, err := safefile.OpenBeneath(d, name)
	if err != nil {
		if errors.Is(err, safefile.ErrNotRegular) {
			return nil, fmt.Errorf("%w: %v: ferry reads only regular files on a stick; copy the file itself (not a link to it) onto the stick", ErrUnsafeFile, err)
		}
		return nil, fmt.Errorf("%w: %q cannot be opened: %v: copy it onto the stick again", ErrUnsafeFile, name, errors.Unwrap(err))
	}
	if max > 0 {
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%w: %q cannot be read: %v: copy it onto the stick again", ErrUnsafeFile, name, err)
		}
		if fi.Size() > max {
			f.Close()
			return nil, fmt.Errorf("%w: %q is over %d bytes: it is not a .sha256 or .minisig file; copy the right one onto the stick", ErrUnsafeFile, name, max)
		}
	}
	return f, nil
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
