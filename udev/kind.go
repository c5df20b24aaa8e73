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
// "nvme", "scsi", "ata", "network"; several may hold (a USB disk is scsi
// too), none for an unknown device. A network LUN (iSCSI, Fibre Channel,
// NVMe over fabrics, nbd/rbd) is "network" and never "removable", "usb"
// or "mmc", whatever its target sets or names itself. Which kinds count as
// sticks is package media's decision.
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
	// A SCSI target sets the removable flag and its inquiry data as it
	// likes, and a udev rule may set ID_BUS from them: on a network
	// transport none of that says what the device is.
	network := overNetwork(idPath, dev, name)
	add("network", network)
	add("removable", !network && readUint(filepath.Join(disk, "removable")) == 1)
	add("usb", !network && (props["ID_BUS"] == "usb" || props["ID_USB_DRIVER"] != "" ||
		pathThrough(idPath, "usb") || underUSBBus(dev)))
	add("mmc", !network && (strings.HasPrefix(name, "mmcblk") || props["ID_DRIVE_FLASH_SD"] == "1" ||
		props["ID_DRIVE_MEDIA_FLASH_SD"] == "1" || has("/mmc_host/")))
	add("loop", strings.HasPrefix(name, "loop"))
	add("virtio", strings.HasPrefix(name, "vd") || has("/virtio") || pathThrough(idPath, "virtio"))
	add("nvme", strings.HasPrefix(name, "nvme") || has("/nvme"))
	add("ata", props["ID_BUS"] == "ata" || has("/ata"))
	add("scsi", props["ID_BUS"] == "scsi" || strings.HasPrefix(name, "sd") || strings.HasPrefix(name, "sr"))
	return out
}

// networkSegments are ID_PATH segments of network transports, as
// path_id writes them: iSCSI ("ip-10.0.0.1:3260-iscsi-iqn…-lun-1"),
// Fibre Channel and FCoE ("pci-0000:05:00.0-fc-0x5006…-lun-0"), SRP.
var networkSegments = []string{"ip", "iscsi", "fc", "fcoe", "srp"}

// overNetwork reports whether the device at sysfs path dev (named name,
// with udev's ID_PATH idPath) is reached over a network: a network
// segment in ID_PATH, an iSCSI session, a Fibre Channel remote port or an
// NVMe-over-fabrics controller on its sysfs path, or a network block
// device (nbd, rbd).
func overNetwork(idPath, dev, name string) bool {
	for _, seg := range strings.Split(idPath, "-") {
		if slices.Contains(networkSegments, seg) {
			return true
		}
	}
	if strings.Contains(idPath, "nvme-tcp") || strings.Contains(idPath, "nvme-rdma") || strings.Contains(idPath, "nvme-fc") {
		return true
	}
	for _, c := range strings.Split(dev, "/") {
		if n, ok := strings.CutPrefix(c, "session"); ok && n != "" && strings.Trim(n, "0123456789") == "" ||
			strings.HasPrefix(c, "rport-") || c == "nvme-fabrics" {
			return true
		}
	}
	return strings.HasPrefix(name, "nbd") || strings.HasPrefix(name, "rbd")
}

// pathThrough reports whether udev's ID_PATH goes through bus: a segment
// of its own, as path_id writes them ("pci-0000:00:14.0-usb-0:1:1.0-scsi-0:0:0:0"),
// before any network transport. An iSCSI LUN's path carries its target's
// name, which its remote owner chooses
// ("ip-10.0.0.1:3260-iscsi-iqn.2001-04.com.example:usb-lun-1"): nothing
// from there on tells what the device is.
func pathThrough(idPath, bus string) bool {
	for _, seg := range strings.Split(idPath, "-") {
		switch {
		case seg == bus:
			return true
		case slices.Contains(networkSegments, seg):
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
