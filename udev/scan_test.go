package udev

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-edge/ferry/internal/fakesys"
)

func TestScan_ReportsPresentDevicesWithUdevProperties(t *testing.T) {
	sys, data := t.TempDir(), t.TempDir()
	dev := func(devpath, uevent, size string) {
		dir := filepath.Join(sys, devpath)
		fakesys.Write(t, dir, map[string]string{"uevent": uevent, "size": size})
		fakesys.Link(t, dir, filepath.Join(sys, "class/block", filepath.Base(devpath)))
	}
	dev("devices/virtual/block/loop3", "MAJOR=7\nMINOR=3\nDEVNAME=loop3\nDEVTYPE=disk\nDISKSEQ=19\n", "16384\n")
	dev("devices/virtual/block/loop4", "MAJOR=7\nMINOR=4\nDEVNAME=loop4\nDEVTYPE=disk\n", "0\n") // detached
	dev("devices/pci/block/sdb", "MAJOR=8\nMINOR=16\nDEVNAME=sdb\nDEVTYPE=disk\n", "4096\n")
	dev("devices/pci/block/sdb/sdb1", "MAJOR=8\nMINOR=17\nDEVNAME=sdb1\nDEVTYPE=partition\n", "2048\n")
	fakesys.Write(t, data, map[string]string{
		"b7:3":  "S:disk/by-label/STICK\nE:ID_FS_TYPE=vfat\nE:ID_FS_LABEL=STICK\nE:ID_FS_USAGE=filesystem\nG:systemd\n",
		"b8:17": "E:ID_FS_TYPE=ext4\nE:ID_FS_LABEL=a=b\n",
		// b8:16: udev has not processed it yet.
	})

	got, err := Scan(sys, data)
	if err != nil {
		t.Fatal(err)
	}
	want := []Event{
		{Action: Add, DevPath: "/dev/loop3", DevType: "disk", FSType: "vfat", Label: "STICK", Size: 16384 * 512, Major: 7, Minor: 3, DiskSeq: 19, Scanned: true},
		{Action: Add, DevPath: "/dev/sdb", DevType: "disk", Size: 4096 * 512, Major: 8, Minor: 16, Scanned: true},
		{Action: Add, DevPath: "/dev/sdb1", DevType: "partition", FSType: "ext4", Label: "a=b", Size: 2048 * 512, Major: 8, Minor: 17, Scanned: true},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d events %+v, want %d (empty devices left out)", len(got), got, len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d:\n got  %+v\n want %+v", i, got[i], want[i])
		}
	}
}

func TestScan_FailsWithoutSysfs(t *testing.T) {
	if _, err := Scan(filepath.Join(t.TempDir(), "nosys"), t.TempDir()); err == nil {
		t.Fatal("Scan of a missing sysfs returned no error")
	}
}

func TestMonitor_ScansFirst(t *testing.T) {
	sys := t.TempDir()
	dir := filepath.Join(sys, "devices/virtual/block/loop3")
	fakesys.Write(t, dir, map[string]string{"uevent": "MAJOR=7\nMINOR=3\nDEVNAME=loop3\n", "size": "8\n"})
	fakesys.Link(t, dir, filepath.Join(sys, "class/block/loop3"))
	if err := os.MkdirAll(filepath.Join(sys, "class/block"), 0o755); err != nil {
		t.Fatal(err)
	}
	m := &Monitor{Sys: sys, UdevData: t.TempDir()}
	ch, err := m.Events(t.Context())
	if err != nil {
		t.Skipf("no netlink socket here: %v", err)
	}
	ev := <-ch
	if ev.DevPath != "/dev/loop3" || !ev.Scanned || ev.Action != Add {
		t.Fatalf("first event %+v, want the scanned loop3", ev)
	}
}
