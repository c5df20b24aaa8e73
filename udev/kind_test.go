package udev

import "testing"

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
