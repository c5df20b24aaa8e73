package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"
)

// builderVersion is part of every cache key: bump it when the way the image
// is built changes in a way the hashed inputs do not show.
const builderVersion = "ferry-vm-image-4"

// Suite is the Debian release of the guest.
const Suite = "bookworm"

// GuestPackages are installed into the guest with mmdebstrap
// --variant=essential. golang-github-containers-common is Debian 12's
// containers-common; netavark satisfies its container-network-stack need
// with 4 MB instead of 45; procps gives /bin/kill, without which crio's
// ExecReload fails (203/EXEC) and crio silently keeps its old config;
// curl is what ferry-install --peers asks the peers with, as on RHCOS.
var GuestPackages = []string{
	"systemd-sysv", "udev", "dbus", "kmod", "mount", "busybox",
	"conmon", "runc", "golang-github-containers-common", "netavark",
	"libseccomp2", "ca-certificates", "procps", "curl",
}

// guestModules selects the kernel modules copied into the guest (paths
// relative to /lib/modules/KVER); their dependencies come along.
var guestModules = regexp.MustCompile(`^kernel/(` + strings.Join([]string{
	`drivers/usb/(host/xhci|storage/|core/|common/)`,
	`drivers/scsi/(sd_mod|sr_mod|sg|scsi_mod|scsi_common)\.ko`,
	`drivers/virtio/`,
	`drivers/block/(virtio_blk|loop)\.ko`,
	`drivers/net/(virtio_net|net_failover)\.ko`,
	`drivers/char/(virtio_console|hw_random/virtio-rng)\.ko`,
	`drivers/input/evdev\.ko`,
	`drivers/acpi/button\.ko`,
	`fs/(overlayfs|fat|exfat|isofs|ext4|jbd2|xfs|nls|autofs)/`,
	`fs/mbcache\.ko`,
	`lib/(crc|libcrc32c)`,
	`crypto/(crc32c|crct10dif)`,
}, "|") + `)`)

// initramfsModules are what the initramfs needs to mount the root image.
var initramfsModules = regexp.MustCompile(`^kernel/(drivers/virtio/virtio_pci|drivers/block/virtio_blk|crypto/crc32c_generic|fs/ext4/ext4)\.ko`)

//go:embed guest
var guestFiles embed.FS

// baseGuestFiles are the files of guest/ that go into the cached image; the
// others go into each boot's layer.
var baseGuestFiles = []string{"init", "crio.conf", "crio.service", "crictl.yaml"}

// ImageConfig says where the guest image is built and cached.
type ImageConfig struct {
	// CacheDir keeps every build product between runs
	// (default /var/cache/ferry-test/vm).
	CacheDir string
	// CRIODir holds crio, crictl and pinns (test/setup/build-crio.sh prints it).
	CRIODir string
	// AptSources is the deb822 sources file mmdebstrap uses (default: the host's).
	AptSources string
	Log        *slog.Logger
}

// Image is a bootable guest: Debian's kernel, a busybox initramfs and an
// ext4 root image holding systemd, udev, D-Bus and CRI-O as a service. It
// is read-only: VMs boot it with snapshot=on and get ferry from a per-boot
// layer.
type Image struct {
	Kernel        string // vmlinux (PVH entry) or vmlinuz
	Initrd        string
	Rootfs        string // raw ext4
	KernelVersion string
}

// DefaultCacheDir is where images are cached unless FERRY_CACHE says
// otherwise (same variable as test/setup/build-crio.sh).
func DefaultCacheDir() string {
	if c := os.Getenv("FERRY_CACHE"); c != "" {
		return filepath.Join(c, "vm")
	}
	return "/var/cache/ferry-test/vm"
}

// BuildImage returns the cached image for the current inputs, building what
// is missing: the kernel (once per Debian kernel version), the Debian root
// (once per package list) and the image itself (once per crio build and
// guest file set). A warm cache answers in about a second.
func BuildImage(ctx context.Context, cfg ImageConfig) (*Image, error) {
	if cfg.CacheDir == "" {
		cfg.CacheDir = DefaultCacheDir()
	}
	if cfg.AptSources == "" {
		cfg.AptSources = "/etc/apt/sources.list.d/debian.sources"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	for _, b := range []string{"crio", "crictl", "pinns"} {
		if _, err := os.Stat(filepath.Join(cfg.CRIODir, b)); err != nil {
			return nil, fmt.Errorf("%w: %s: run test/setup/build-crio.sh and pass the directory it prints", ErrHostSetup, err)
		}
	}
	if err := os.MkdirAll(cfg.CacheDir, 0o755); err != nil {
		return nil, err
	}
	unlock, err := lockDir(cfg.CacheDir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	b := &builder{cfg: cfg, log: cfg.Log}
	k, err := b.kernel(ctx)
	if err != nil {
		return nil, fmt.Errorf("guest kernel: %w", err)
	}
	root, err := b.debianRoot(ctx)
	if err != nil {
		return nil, fmt.Errorf("guest root (mmdebstrap): %w", err)
	}
	img, err := b.image(ctx, k, root)
	if err != nil {
		return nil, fmt.Errorf("guest image: %w", err)
	}
	return img, nil
}

// ErrHostSetup means the host lacks a package or a build product the VM
// tests need; the message names the script that provides it.
var ErrHostSetup = errors.New("VM test host not set up")

type builder struct {
	cfg ImageConfig
	log *slog.Logger
}

type kernel struct {
	version string
	dir     string // unpacked package, with modules.dep
	boot    string // vmlinux or vmlinuz
}

func (k kernel) modDir() string { return filepath.Join(k.dir, "lib/modules", k.version) }

func (b *builder) kernel(ctx context.Context) (kernel, error) {
	out, err := b.output(ctx, "apt-cache", "depends", "linux-image-amd64")
	if err != nil || !strings.Contains(out, "Depends: linux-image-") {
		if _, err := b.output(ctx, "apt-get", "update", "-qq"); err != nil {
			return kernel{}, err
		}
		if out, err = b.output(ctx, "apt-cache", "depends", "linux-image-amd64"); err != nil {
			return kernel{}, err
		}
	}
	m := regexp.MustCompile(`Depends: (linux-image-(\S+))`).FindStringSubmatch(out)
	if m == nil {
		return kernel{}, fmt.Errorf("apt-cache depends linux-image-amd64 names no kernel package:\n%s", out)
	}
	pkg, ver := m[1], m[2]
	k := kernel{version: ver, dir: filepath.Join(b.cfg.CacheDir, "kernel-"+ver)}
	done := filepath.Join(k.dir, ".done")
	if _, err := os.Stat(done); err != nil {
		start := time.Now()
		os.RemoveAll(k.dir)
		tmp := k.dir + ".tmp"
		os.RemoveAll(tmp)
		if err := os.MkdirAll(filepath.Join(tmp, "deb"), 0o755); err != nil {
			return k, err
		}
		if err := b.runIn(ctx, filepath.Join(tmp, "deb"), "apt-get", "download", pkg); err != nil {
			return k, err
		}
		debs, _ := filepath.Glob(filepath.Join(tmp, "deb", "*.deb"))
		if len(debs) != 1 {
			return k, fmt.Errorf("apt-get download %s: got %d .deb files", pkg, len(debs))
		}
		if err := b.run(ctx, "dpkg-deb", "-x", debs[0], filepath.Join(tmp, "root")); err != nil {
			return k, err
		}
		if err := b.run(ctx, "depmod", "-b", filepath.Join(tmp, "root"), ver); err != nil {
			return k, err
		}
		if err := os.Rename(filepath.Join(tmp, "root"), k.dir); err != nil {
			return k, err
		}
		os.RemoveAll(tmp)
		if err := b.extractVmlinux(ctx, k); err != nil {
			b.log.Warn("no uncompressed kernel; booting vmlinuz (about 4 s slower under TCG)", "err", err)
		}
		if err := os.WriteFile(done, nil, 0o644); err != nil {
			return k, err
		}
		b.log.Info("guest kernel unpacked", "version", ver, "took", time.Since(start).Round(time.Millisecond))
	}
	k.boot = filepath.Join(k.dir, "vmlinux")
	if _, err := os.Stat(k.boot); err != nil {
		k.boot = filepath.Join(k.dir, "boot", "vmlinuz-"+ver)
	}
	return k, nil
}

// extractVmlinux writes the ELF inside Debian's bzImage (an xz stream)
// next to it: QEMU boots it through its PVH note, skipping the real-mode
// setup and the in-guest decompressor.
func (b *builder) extractVmlinux(ctx context.Context, k kernel) error {
	z, err := os.ReadFile(filepath.Join(k.dir, "boot", "vmlinuz-"+k.version))
	if err != nil {
		return err
	}
	i := bytes.Index(z, []byte("\xfd7zXZ\x00"))
	if i < 0 {
		return errors.New("no xz stream in vmlinuz")
	}
	cmd := exec.CommandContext(ctx, "xz", "-dc", "--single-stream")
	cmd.Stdin = bytes.NewReader(z[i:])
	var elf bytes.Buffer
	cmd.Stdout = &elf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("xz: %w", err)
	}
	if !bytes.HasPrefix(elf.Bytes(), []byte("\x7fELF")) {
		return errors.New("decompressed kernel is not an ELF file")
	}
	return writeAtomic(filepath.Join(k.dir, "vmlinux"), elf.Bytes(), 0o644)
}

// debianRoot is the mmdebstrap tarball for GuestPackages.
func (b *builder) debianRoot(ctx context.Context) (string, error) {
	sources, err := os.ReadFile(b.cfg.AptSources)
	if err != nil {
		return "", fmt.Errorf("%w: apt sources: %v", ErrHostSetup, err)
	}
	key := hashStrings(builderVersion, Suite, strings.Join(GuestPackages, ","), string(sources))
	tarball := filepath.Join(b.cfg.CacheDir, "debian-"+Suite+"-"+key+".tar")
	if _, err := os.Stat(tarball); err == nil {
		return tarball, nil
	}
	start := time.Now()
	b.log.Info("building the Debian root with mmdebstrap (once per package list, about a minute)")
	tmp := tarball + ".tmp.tar"
	err = b.run(ctx, "mmdebstrap", "--variant=essential", "--quiet",
		"--include="+strings.Join(GuestPackages, ","),
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-include=/usr/share/doc/*/copyright",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		"--dpkgopt=path-exclude=/usr/share/info/*",
		`--customize-hook=rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*`,
		Suite, tmp, b.cfg.AptSources)
	if err != nil {
		os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, tarball); err != nil {
		return "", err
	}
	b.log.Info("Debian root built", "took", time.Since(start).Round(time.Second))
	return tarball, nil
}

// staticFiles are host files copied into the guest, hashed into the key.
func (b *builder) staticFiles() map[string]string {
	m := map[string]string{
		"/usr/local/bin/crio":   filepath.Join(b.cfg.CRIODir, "crio"),
		"/usr/local/bin/crictl": filepath.Join(b.cfg.CRIODir, "crictl"),
		"/usr/local/bin/pinns":  filepath.Join(b.cfg.CRIODir, "pinns"),
	}
	// Debian's distribution 2.8: the guest's stand-in registry for the
	// floor measurement (crio's fastest pull of the bundle's images).
	if _, err := os.Stat("/usr/bin/docker-registry"); err == nil {
		m["/usr/local/bin/docker-registry"] = "/usr/bin/docker-registry"
	}
	return m
}

func (b *builder) image(ctx context.Context, k kernel, debian string) (*Image, error) {
	h := sha256.New()
	fmt.Fprintln(h, builderVersion, k.version, filepath.Base(debian))
	for _, name := range baseGuestFiles {
		data, err := guestFiles.ReadFile("guest/" + name)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(h, "%s %x\n", name, sha256.Sum256(data))
	}
	static := b.staticFiles()
	for _, dst := range sortedKeys(static) {
		sum, err := hashFile(static[dst])
		if err != nil {
			return nil, err
		}
		fmt.Fprintln(h, dst, sum)
	}
	busybox, err := hashFile("/bin/busybox")
	if err != nil {
		return nil, fmt.Errorf("%w: %v (install busybox-static: test/setup/setup-vm-host.sh)", ErrHostSetup, err)
	}
	fmt.Fprintln(h, "busybox", busybox)
	key := hex.EncodeToString(h.Sum(nil))[:16]
	dir := filepath.Join(b.cfg.CacheDir, "image-"+key)
	img := &Image{
		Kernel:        k.boot,
		Initrd:        filepath.Join(dir, "initrd.img"),
		Rootfs:        filepath.Join(dir, "rootfs.img"),
		KernelVersion: k.version,
	}
	if _, err := os.Stat(filepath.Join(dir, ".done")); err == nil {
		return img, nil
	}
	start := time.Now()
	os.RemoveAll(dir)
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	defer os.RemoveAll(tmp)
	root := filepath.Join(tmp, "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	if err := b.run(ctx, "tar", "-C", root, "--numeric-owner", "-xpf", debian); err != nil {
		return nil, err
	}
	if err := copyModules(ctx, b, k, root, guestModules); err != nil {
		return nil, err
	}
	if err := customize(root, static); err != nil {
		return nil, err
	}
	if err := b.initramfs(ctx, k, filepath.Join(tmp, "initrd.img")); err != nil {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	usedMB, err := duMB(ctx, root)
	if err != nil {
		return nil, err
	}
	// free space for the extracted bundle (2 × its size), CRI-O's image
	// store and ferry's storage floor (1 GiB by default); sparse on the host.
	sizeMB := usedMB*13/10 + 3072
	if err := b.run(ctx, "mkfs.ext4", "-q", "-F", "-L", "ferry-root", "-E", "root_owner=0:0",
		"-d", root, filepath.Join(tmp, "rootfs.img"), fmt.Sprintf("%dM", sizeMB)); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(root); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, ".done"), []byte(key+"\n"), 0o644); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	// older images are dead weight: keep only the current one
	old, _ := filepath.Glob(filepath.Join(b.cfg.CacheDir, "image-*"))
	for _, o := range old {
		if o != dir {
			os.RemoveAll(o)
		}
	}
	b.log.Info("guest image built", "dir", dir, "rootMB", usedMB, "imageMB", sizeMB, "took", time.Since(start).Round(time.Millisecond))
	return img, nil
}

// customize turns the Debian root into the test guest.
func customize(root string, static map[string]string) error {
	write := func(p, s string, mode os.FileMode) error {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		os.Remove(full)
		return os.WriteFile(full, []byte(s), mode)
	}
	embedded := func(p, name string, mode os.FileMode) error {
		data, err := guestFiles.ReadFile("guest/" + name)
		if err != nil {
			return err
		}
		return write(p, string(data), mode)
	}
	link := func(target, p string) error {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		os.Remove(full)
		return os.Symlink(target, full)
	}
	steps := []func() error{
		func() error { return write("/etc/hostname", "ferry-vm\n", 0o644) },
		func() error { return write("/etc/hosts", "127.0.0.1 localhost\n", 0o644) },
		// mmdebstrap leaves the host's resolv.conf; the guest has no DNS
		func() error { return write("/etc/resolv.conf", "", 0o644) },
		func() error { return write("/etc/fstab", "", 0o644) },
		func() error { return write("/etc/machine-id", "f3e1a0c0de0000000000000000000001\n", 0o444) },
		func() error { return embedded("/etc/crio/crio.conf", "crio.conf", 0o644) },
		func() error { return embedded("/etc/systemd/system/crio.service", "crio.service", 0o644) },
		func() error { return embedded("/etc/crictl.yaml", "crictl.yaml", 0o644) },
		func() error {
			return link("/etc/systemd/system/crio.service", "/etc/systemd/system/multi-user.target.wants/crio.service")
		},
		func() error { return link("/etc/systemd/system/crio.service", "/etc/systemd/system/cri-o.service") },
	}
	for _, d := range []string{"/etc/crio/crio.conf.d", "/etc/containers/registries.conf.d",
		"/etc/containers/certs.d", "/etc/cni/net.d", "/etc/ferry", "/var/lib/ferry-vm"} {
		steps = append(steps, func() error { return os.MkdirAll(filepath.Join(root, d), 0o755) })
	}
	// units that only cost boot time in a throw-away guest
	for _, u := range []string{"e2scrub_all.timer", "e2scrub_reap.service", "fstrim.timer",
		"systemd-timesyncd.service", "serial-getty@ttyS0.service", "getty@tty1.service"} {
		steps = append(steps, func() error { return link("/dev/null", "/etc/systemd/system/"+u) })
	}
	for _, dst := range sortedKeys(static) {
		steps = append(steps, func() error {
			data, err := os.ReadFile(static[dst])
			if err != nil {
				return err
			}
			return write(dst, string(data), 0o755)
		})
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	// empty root password: `machinectl`/console debugging by hand
	shadow := filepath.Join(root, "etc/shadow")
	data, err := os.ReadFile(shadow)
	if err != nil {
		return err
	}
	data = regexp.MustCompile(`(?m)^root:[^:]*:`).ReplaceAll(data, []byte("root::"))
	return os.WriteFile(shadow, data, 0o640)
}

func (b *builder) initramfs(ctx context.Context, k kernel, out string) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), "initramfs-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, d := range []string{"bin", "dev", "proc", "sys", "newroot"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), bb, 0o755); err != nil {
		return err
	}
	init, err := guestFiles.ReadFile("guest/init")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "init"), init, 0o755); err != nil {
		return err
	}
	if err := copyModules(ctx, b, k, dir, initramfsModules); err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	cmd := exec.CommandContext(ctx, "sh", "-c", "find . | sort | cpio -o -H newc --quiet | gzip -1")
	cmd.Dir, cmd.Stdout = dir, f
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("cpio: %w: %s", err, stderr.String())
	}
	return f.Close()
}

// copyModules copies the modules matching want, and every module they
// depend on, into root's /lib/modules, then runs depmod there.
func copyModules(ctx context.Context, b *builder, k kernel, root string, want *regexp.Regexp) error {
	deps, err := readModulesDep(filepath.Join(k.modDir(), "modules.dep"))
	if err != nil {
		return err
	}
	mods := moduleClosure(deps, want)
	if len(mods) == 0 {
		return fmt.Errorf("no module of kernel %s matches %s", k.version, want)
	}
	dst := filepath.Join(root, "lib/modules", k.version)
	for _, m := range mods {
		if err := copyFile(filepath.Join(k.modDir(), m), filepath.Join(dst, m), 0o644); err != nil {
			return err
		}
	}
	for _, f := range []string{"modules.order", "modules.builtin", "modules.builtin.modinfo"} {
		if err := copyFile(filepath.Join(k.modDir(), f), filepath.Join(dst, f), 0o644); err != nil {
			return err
		}
	}
	return b.run(ctx, "depmod", "-b", root, k.version)
}

// readModulesDep parses modules.dep: "path: dep dep ...".
func readModulesDep(path string) (map[string][]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(string(data), "\n") {
		mod, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		deps[mod] = strings.Fields(rest)
	}
	return deps, nil
}

// moduleClosure is every module matching want plus its dependencies, sorted.
func moduleClosure(deps map[string][]string, want *regexp.Regexp) []string {
	seen := map[string]bool{}
	var visit func(string)
	visit = func(m string) {
		if seen[m] {
			return
		}
		seen[m] = true
		for _, d := range deps[m] {
			visit(d)
		}
	}
	for m := range deps {
		if want.MatchString(m) {
			visit(m)
		}
	}
	return sortedKeys(seen)
}

func (b *builder) run(ctx context.Context, name string, args ...string) error {
	_, err := b.output(ctx, name, args...)
	return err
}

func (b *builder) runIn(ctx context.Context, dir, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, tail(out))
	}
	return nil
}

func (b *builder) output(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return "", fmt.Errorf("%w: %s not installed (run test/setup/setup-vm-host.sh)", ErrHostSetup, name)
		}
		return "", fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, tail(append(stdout.Bytes(), stderr.Bytes()...)))
	}
	return stdout.String(), nil
}

func tail(b []byte) string {
	const n = 4000
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func duMB(ctx context.Context, dir string) (int, error) {
	out, err := exec.CommandContext(ctx, "du", "-sm", dir).Output()
	if err != nil {
		return 0, fmt.Errorf("du %s: %w", dir, err)
	}
	var n int
	_, err = fmt.Sscan(string(out), &n)
	return n, err
}

func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() { f.Close() }, nil
}

func hashStrings(s ...string) string {
	h := sha256.New()
	for _, x := range s {
		fmt.Fprintf(h, "%d:%s\n", len(x), x)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func copyFile(src, dst string, mode os.FileMode) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, data, mode)
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
