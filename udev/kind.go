package udev

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Kinds says what the block device numbered num ("major:minor") is, from
// sysfs under sys (its place in the device tree, its disk's removable
// flag) and udev's database in udevData (ID_BUS, ID_USB_DRIVER, ID_PATH,
// ID_DRIVE_FLASH_SD): "removable", "usb", "mmc", "loop", "virtio",
// "nvme", "scsi", "ata"; several may hold (a USB disk is scsi too), none
// for an unknown device. Which kinds count as sticks is package media's
// decision.
func Kinds(sys, udevData, num string) []string {
	sysDir, err := filepath.EvalSymlinks(filepath.Join(sys, "dev", "block", num))
	if err != nil {
		return nil
	}
	disk := sysDir
	if _, err := os.Stat(filepath.Join(sysDir, "partition")); err == nil {
		disk = filepath.Dir(sysDir)
	}
	props, _ := readProps(filepath.Join(udevData, "b"+num), "E:")
	if props == nil {
		props = map[string]string{}
	}
	if disk != sysDir {
		// A partition's record usually repeats its disk's; take the
		// disk's for what the partition's lacks.
		if b, err := os.ReadFile(filepath.Join(disk, "dev")); err == nil {
			dp, _ := readProps(filepath.Join(udevData, "b"+strings.TrimSpace(string(b))), "E:")
			for k, v := range dp {
				if _, ok := props[k]; !ok {
					props[k] = v
				}
			}
		}
	}
	name := filepath.Base(disk)
	dev := filepath.ToSlash(sysDir)
	has := func(s string) bool { return strings.Contains(dev, s) }
	idPath := props["ID_PATH"]
	var out []string
	add := func(k string, cond bool) {
		if cond && !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	add("removable", readUint(filepath.Join(disk, "removable")) == 1)
	add("usb", props["ID_BUS"] == "usb" || props["ID_USB_DRIVER"] != "" ||
		pathThrough(idPath, "usb") || underUSBBus(dev))
	add("mmc", strings.HasPrefix(name, "mmcblk") || props["ID_DRIVE_FLASH_SD"] == "1" ||
		props["ID_DRIVE_MEDIA_FLASH_SD"] == "1" || has("/mmc_host/"))
	add("loop", strings.HasPrefix(name, "loop"))
	add("virtio", strings.HasPrefix(name, "vd") || has("/virtio") || pathThrough(idPath, "virtio"))
	add("nvme", strings.HasPrefix(name, "nvme") || has("/nvme"))
	add("ata", props["ID_BUS"] == "ata" || has("/ata"))
	add("scsi", props["ID_BUS"] == "scsi" || strings.HasPrefix(name, "sd") || strings.HasPrefix(name, "sr"))
	return out
}

// pathThrough reports whether udev's ID_PATH goes through bus: a segment
// of its own, as path_id writes them ("pci-0000:00:14.0-usb-0:1:1.0-scsi-0:0:0:0"),
// before any network transport. An iSCSI LUN's path carries its target's
// name, which its remote owner chooses
// ("ip-10.0.0.1:3260-iscsi-iqn.2001-04.com.example:usb-lun-1"): nothing
// from there on tells what the device is.
func pathThrough(idPath, bus string) bool {
	for _, seg := range strings.Split(idPath, "-") {
		switch seg {
		case bus:
			return true
		case "ip", "iscsi":
			return false
		}
	}
	return false
}

// underUSBBus reports whether the sysfs device path dev goes through a
// USB bus: a component usbN, the kernel's name for a USB root hub
// (".../0000:00:14.0/usb2/2-1/2-1:1.0/host6/...").
func underUSBBus(dev string) bool {
	for _, c := range strings.Split(dev, "/") {
		if n, ok := strings.CutPrefix(c, "usb"); ok && n != "" && strings.Trim(n, "0123456789") == "" {
			return true
		}
	}
	return false
}
