package udev

import (
	"strings"
	"testing"
)

// FuzzParseMessage feeds arbitrary netlink datagrams (udev's libudev
// framing or the kernel's ACTION@DEVPATH form) to the parser: it never
// panics, and an event it accepts is a block add/change/remove with an
// absolute device path.
func FuzzParseMessage(f *testing.F) {
	f.Add(udevMessage("ACTION=change", "DEVPATH=/devices/virtual/block/loop3", "SUBSYSTEM=block",
		"DEVNAME=/dev/loop3", "DEVTYPE=disk", "DISKSEQ=11", "MAJOR=7", "MINOR=3",
		"ID_FS_TYPE=vfat", "ID_FS_LABEL=STICK", "SEQNUM=840"))
	f.Add(udevMessage("ACTION=add", "DEVPATH=/devices/pci/usb/block/sdb/sdb1", "SUBSYSTEM=block",
		"DEVNAME=sdb1", "DEVTYPE=partition", "ID_FS_LABEL=a=b", "MAJOR=8", "MINOR=17"))
	f.Add(udevMessage("ACTION=remove", "SUBSYSTEM=block", "DEVNAME=/dev/sdb"))
	f.Add(udevMessage("ACTION=add", "SUBSYSTEM=usb", "DEVNAME=bus/usb/001/002"))
	f.Add([]byte("add@/devices/virtual/block/loop0\x00ACTION=add\x00DEVPATH=/devices/virtual/block/loop0\x00SUBSYSTEM=block\x00DEVNAME=loop0\x00DISKSEQ=x\x00"))
	f.Add([]byte("libudev\x00abc"))
	f.Add([]byte("libudev\x00\xfe\xed\xca\xfe\x28\x00\x00\x00\xff\xff\xff\xff"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, msg []byte) {
		sys := t.TempDir()
		ev, ok, err := parseMessage(msg, sys)
		if err != nil || !ok {
			if ok {
				t.Fatalf("ok with error %v", err)
			}
			return
		}
		switch ev.Action {
		case Add, Change, Remove:
		default:
			t.Fatalf("accepted action %q", ev.Action)
		}
		if !strings.HasPrefix(ev.DevPath, "/") {
			t.Fatalf("device path %q is not absolute", ev.DevPath)
		}
		if ev.Size < 0 {
			t.Fatalf("negative size %d", ev.Size)
		}
	})
}
