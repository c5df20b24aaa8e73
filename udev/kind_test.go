package udev

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/internal/fakesys"
)

// udev's ID_PATH counts for a bus only as a segment of its own, before
// any network transport; the sysfs path only by a USB root hub (usbN).
func TestPathThrough(t *testing.T) {
	for _, tt := range []struct {
		path, bus string
		want      bool
	}{
		{"pci-0000:00:14.0-usb-0:1:1.0-scsi-0:0:0:0", "usb", true},
		{"platform-xhci-hcd.0.auto-usb-0:1:1.0-scsi-0:0:0:0", "usb", true},
		{"pci-0000:00:14.0-usbv2-0:1:1.0-scsi-0:0:0:0", "usb", false},
		{"ip-10.0.0.1:3260-iscsi-iqn.2001-04.com.example:usb-lun-1", "usb", false},
		{"ip-10.0.0.1:3260-iscsi-iqn.2001-04.com.example:disk-usb-2-lun-2", "usb", false},
		{"pci-0000:00:1f.2-ata-1", "usb", false},
		{"virtio-pci-0000:00:05.0", "virtio", true},
		{"ip-10.0.0.1:3260-iscsi-iqn.2001-04.com.example:a-virtio-lun-1", "virtio", false},
		{"", "usb", false},
	} {
		if got := pathThrough(tt.path, tt.bus); got != tt.want {
			t.Errorf("pathThrough(%q, %q) = %v, want %v", tt.path, tt.bus, got, tt.want)
		}
	}
	for dev, want := range map[string]bool{
		"/sys/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0/block/sdb":   true,
		"/sys/devices/platform/soc/3f980000.usb/usb1/1-1/1-1:1.0/host0/target0:0:0/0:0:0:0/block/sda": true,
		"/sys/devices/platform/host3/session1/target3:0:0/3:0:0:1/block/sdd":                          false,
		"/sys/devices/platform/usbfake/host3/block/sdd":                                               false,
	} {
		if got := underUSBBus(dev); got != want {
			t.Errorf("underUSBBus(%q) = %v, want %v", dev, got, want)
		}
	}
}

// What a device is, from its sysfs path, removable flag and udev record:
// a network LUN is "network" and never removable, usb or mmc, whatever
// its target sets (the removable flag, a usb-looking name) or udev says.
func TestKinds(t *testing.T) {
	for _, tt := range []struct {
		name, devPath, removable string
		props                    []string
		want                     []string
	}{
		{"usb stick", "devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0/host6/target6:0:0/6:0:0:0/block/sdb", "1",
			[]string{"ID_BUS=usb", "ID_USB_DRIVER=usb-storage", "ID_PATH=pci-0000:00:14.0-usb-0:1:1.0-scsi-0:0:0:0"},
			[]string{"removable", "usb", "scsi"}},
		{"iscsi LUN flagged removable", "devices/platform/host3/session1/target3:0:0/3:0:0:1/block/sdd", "1",
			[]string{"ID_BUS=scsi", "ID_PATH=ip-10.0.0.5:3260-iscsi-iqn.2024-01.example:usb-lun-1"},
			[]string{"network", "scsi"}},
		{"iscsi LUN whose record claims usb", "devices/platform/host3/session1/target3:0:0/3:0:0:2/block/sde", "1",
			[]string{"ID_BUS=usb", "ID_USB_DRIVER=usb-storage", "ID_DRIVE_FLASH_SD=1"},
			[]string{"network", "scsi"}},
		{"fibre channel LUN", "devices/pci0000:00/0000:05:00.0/host11/rport-11:0-2/target11:0:0/11:0:0:0/block/sdk", "1",
			[]string{"ID_PATH=pci-0000:05:00.0-fc-0x500601603ce01a2b-lun-0"},
			[]string{"network", "scsi"}},
		{"nvme over fabrics", "devices/virtual/nvme-fabrics/ctl/nvme2/nvme2n1", "0", nil, []string{"network", "nvme"}},
		{"network block device", "devices/virtual/block/nbd0", "1", nil, []string{"network"}},
		{"virtio disk", "devices/pci0000:00/0000:00:05.0/virtio2/block/vdb", "0",
			[]string{"ID_PATH=pci-0000:00:05.0"}, []string{"virtio"}},
		{"bmc virtual media", "devices/pci0000:00/0000:00:14.0/usb1/1-4/1-4:1.0/host12/target12:0:0/12:0:0:0/block/sr1", "1",
			[]string{"ID_BUS=usb", "ID_CDROM=1", "ID_PATH=pci-0000:00:14.0-usb-0:4:1.0-scsi-0:0:0:0"},
			[]string{"removable", "usb", "scsi"}},
		{"sd card", "devices/pci0000:00/0000:00:1c.0/mmc_host/mmc0/mmc0:0001/block/mmcblk0", "0",
			[]string{"ID_DRIVE_FLASH_SD=1"}, []string{"mmc"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sys, data := t.TempDir(), t.TempDir()
			dir := filepath.Join(sys, tt.devPath)
			fakesys.Write(t, dir, map[string]string{"dev": "8:1\n", "removable": tt.removable + "\n"})
			fakesys.Link(t, dir, filepath.Join(sys, "dev/block/8:1"))
			var rec strings.Builder
			for _, p := range tt.props {
				rec.WriteString("E:" + p + "\n")
			}
			fakesys.Write(t, data, map[string]string{"b8:1": rec.String()})
			if got := Kinds(sys, data, "8:1"); !slices.Equal(got, tt.want) {
				t.Errorf("Kinds = %v, want %v", got, tt.want)
			}
		})
	}
}
