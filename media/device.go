package media

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ferry-edge/ferry/internal/mountinfo"
	"github.com/ferry-edge/ferry/udev"
)

// Which devices count as sticks: not a disk this node uses (Check), and
// a USB or MMC device or one of a kind the config allows (CheckKind), as
// udev tells the kinds (udev.Kinds).

// ErrNotRemovable: the device is not a stick (USB or MMC) nor of a kind
// the config allows: a network LUN, a hot-plugged virtio or NVMe disk, a
// tenant's raw block volume. Nothing on it is read.
var ErrNotRemovable = errors.New("not a USB or MMC device")

// StickKinds are read whatever the config says: a device on a USB bus (a
// BMC's virtual media is one) or an MMC/SD card. The removable flag alone
// is not enough: a SCSI target, an iSCSI LUN's included, sets it as it
// likes.
var StickKinds = []string{"usb", "mmc"}

// DeviceKinds are the kinds media.allow_devices may name besides
// StickKinds ("removable": a SATA optical drive, say); "any" is every
// block device (ferry before it told them apart). A "network" device
// (udev.Kinds) is never a removable, USB or MMC one.
var DeviceKinds = []string{"loop", "virtio", "nvme", "scsi", "ata", "removable", "any"}

// CheckKind refuses (ErrNotRemovable) dev unless one of its kinds
// (removable, usb, mmc, loop, …: see kinds) is in StickKinds or
// AllowDevices.
func (m *Media) CheckKind(dev string) error {
	if slices.Contains(m.AllowDevices, "any") {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return fmt.Errorf("%s: %w", dev, ErrNoMedium)
	}
	return m.checkKind(dev, fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)))
}

// checkKind is CheckKind for the device numbered num ("major:minor").
func (m *Media) checkKind(dev, num string) error {
	if slices.Contains(m.AllowDevices, "any") {
		return nil
	}
	kinds := udev.Kinds(m.sys(), m.udevData(), num)
	for _, k := range kinds {
		if slices.Contains(StickKinds, k) || slices.Contains(m.AllowDevices, k) {
			return nil
		}
	}
	what := "of no kind ferry knows"
	if len(kinds) > 0 {
		what = "a " + strings.Join(kinds, "/") + " device"
	}
	hint := "media.allow_devices (\"any\" for every kind)"
	if i := slices.IndexFunc(kinds, func(k string) bool { return slices.Contains(DeviceKinds, k) }); i >= 0 {
		hint = fmt.Sprintf("%q to media.allow_devices", kinds[i])
	}
	return fmt.Errorf("%s: %w (%s): to read such devices too, add %s", dev, ErrNotRemovable, what, hint)
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
	if udev.Size(sysDir) == 0 {
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
		if unix.Stat(mountinfo.Unescape(fields[0]), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK {
			out[fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))] = true
		}
	}
	return out
}
