package udev

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// udevMessage builds what systemd-udevd sends on the netlink group: the
// libudev header then NUL-terminated KEY=VALUE properties.
func udevMessage(props ...string) []byte {
	payload := []byte(strings.Join(props, "\x00") + "\x00")
	hdr := make([]byte, 40)
	copy(hdr, "libudev\x00")
	binary.BigEndian.PutUint32(hdr[8:], libudevMagic)
	binary.NativeEndian.PutUint32(hdr[12:], 40)
	binary.NativeEndian.PutUint32(hdr[16:], 40)
	binary.NativeEndian.PutUint32(hdr[20:], uint32(len(payload)))
	return append(hdr, payload...)
}

func fakeSysDevice(t *testing.T, sys, devpath string, sectors int) {
	t.Helper()
	dir := filepath.Join(sys, devpath)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "size"), []byte(strconv.Itoa(sectors)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestParseMessage_BlockEvents(t *testing.T) {
	sys := t.TempDir()
	fakeSysDevice(t, sys, "/devices/virtual/block/loop3", 16384)
	fakeSysDevice(t, sys, "/devices/pci/usb/block/sdb/sdb1", 2048)
	fakeSysDevice(t, sys, "/devices/virtual/block/loop5", 4096)
	if err := os.WriteFile(filepath.Join(sys, "/devices/virtual/block/loop5/diskseq"), []byte("12\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name   string
		msg    []byte
		want   Event
		wantOK bool
	}{
		{
			name: "loop attach is a change with the filesystem",
			msg: udevMessage("ACTION=change", "DEVPATH=/devices/virtual/block/loop3", "SUBSYSTEM=block",
				"DEVNAME=/dev/loop3", "DEVTYPE=disk", "DISKSEQ=11", "MAJOR=7", "MINOR=3",
				"ID_FS_TYPE=vfat", "ID_FS_LABEL=STICK", "SEQNUM=840"),
			want:   Event{Action: Change, DevPath: "/dev/loop3", DevType: "disk", FSType: "vfat", Label: "STICK", Size: 16384 * 512, Major: 7, Minor: 3, DiskSeq: 11},
			wantOK: true,
		},
		{
			name: "usb partition add",
			msg: udevMessage("ACTION=add", "DEVPATH=/devices/pci/usb/block/sdb/sdb1", "SUBSYSTEM=block",
				"DEVNAME=/dev/sdb1", "DEVTYPE=partition", "MAJOR=8", "MINOR=17", "ID_FS_TYPE=ext4"),
			want:   Event{Action: Add, DevPath: "/dev/sdb1", DevType: "partition", FSType: "ext4", Size: 2048 * 512, Major: 8, Minor: 17},
			wantOK: true,
		},
		{
			name: "remove has no size",
			msg: udevMessage("ACTION=remove", "DEVPATH=/devices/pci/usb/block/sdb/sdb1", "SUBSYSTEM=block",
				"DEVNAME=/dev/sdb1", "DEVTYPE=partition", "MAJOR=8", "MINOR=17"),
			want:   Event{Action: Remove, DevPath: "/dev/sdb1", DevType: "partition", Major: 8, Minor: 17},
			wantOK: true,
		},
		{
			name: "a label holding '=' is kept whole",
			msg: udevMessage("ACTION=change", "DEVPATH=/devices/virtual/block/loop3", "SUBSYSTEM=block",
				"DEVNAME=/dev/loop3", "ID_FS_TYPE=ext4", "ID_FS_LABEL=a=b"),
			want:   Event{Action: Change, DevPath: "/dev/loop3", FSType: "ext4", Label: "a=b", Size: 16384 * 512},
			wantOK: true,
		},
		{
			name: "a stale event for a device that holds a newer medium has no size",
			msg: udevMessage("ACTION=change", "DEVPATH=/devices/virtual/block/loop5", "SUBSYSTEM=block",
				"DEVNAME=/dev/loop5", "DISKSEQ=11", "ID_FS_TYPE=vfat"),
			want:   Event{Action: Change, DevPath: "/dev/loop5", FSType: "vfat", DiskSeq: 11},
			wantOK: true,
		},
		{
			name: "the current medium's event has its size",
			msg: udevMessage("ACTION=change", "DEVPATH=/devices/virtual/block/loop5", "SUBSYSTEM=block",
				"DEVNAME=/dev/loop5", "DISKSEQ=12", "ID_FS_TYPE=ext4"),
			want:   Event{Action: Change, DevPath: "/dev/loop5", FSType: "ext4", DiskSeq: 12, Size: 4096 * 512},
			wantOK: true,
		},
		{
			name: "kernel format with a bare DEVNAME",
			msg:  []byte("change@/devices/virtual/block/loop3\x00ACTION=change\x00DEVPATH=/devices/virtual/block/loop3\x00SUBSYSTEM=block\x00DEVNAME=loop3\x00"),
			want: Event{Action: Change, DevPath: "/dev/loop3", Size: 16384 * 512}, wantOK: true,
		},
		{
			name: "other subsystems are ignored",
			msg:  udevMessage("ACTION=add", "DEVPATH=/devices/pci/net/eth0", "SUBSYSTEM=net", "INTERFACE=eth0"),
		},
		{
			name: "bind actions are ignored",
			msg:  udevMessage("ACTION=bind", "DEVPATH=/devices/pci/usb", "SUBSYSTEM=block", "DEVNAME=/dev/sdb"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok, err := parseMessage(tt.msg, sys)
			if err != nil {
				t.Fatalf("parseMessage: %v", err)
			}
			if ok != tt.wantOK {
				t.Fatalf("ok = %v, want %v (event %+v)", ok, tt.wantOK, got)
			}
			if ok && got != tt.want {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseMessage_RejectsGarbage(t *testing.T) {
	bad := udevMessage("ACTION=add")
	binary.BigEndian.PutUint32(bad[8:], 0xdeadbeef)
	for name, msg := range map[string][]byte{
		"bad magic":  bad,
		"no header":  []byte("hello"),
		"no action":  []byte("x@y\x00SUBSYSTEM=block\x00"),
		"short udev": []byte("libudev\x00abc"),
	} {
		t.Run(name, func(t *testing.T) {
			if _, ok, err := parseMessage(msg, t.TempDir()); err == nil && ok {
				t.Fatal("garbage parsed as an event")
			}
		})
	}
}

func TestEventGone(t *testing.T) {
	for _, tt := range []struct {
		ev   Event
		gone bool
	}{
		{Event{Action: Remove}, true},
		{Event{Action: Change, Size: 0}, true},
		{Event{Action: Change, Size: 512, FSType: "vfat"}, false},
		{Event{Action: Add, Size: 512}, false},
	} {
		if got := tt.ev.Gone(); got != tt.gone {
			t.Errorf("%v.Gone() = %v, want %v", tt.ev, got, tt.gone)
		}
	}
}

// monitorGoroutines counts goroutines whose stack runs this package's
// Monitor code.
func monitorGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("udev.(*Monitor).Events")) {
			n++
		}
	}
	return n
}

func TestMonitor_StopsWhenContextEnds(t *testing.T) {
	sys := t.TempDir()
	if err := os.MkdirAll(filepath.Join(sys, "class", "block"), 0o755); err != nil {
		t.Fatal(err)
	}
	mctx, mcancel := context.WithCancel(t.Context())
	m := &Monitor{Sys: sys, UdevData: t.TempDir()}
	ch, err := m.Events(mctx)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no netlink socket here: %v", err)
		}
		t.Skipf("no netlink socket here: %v", err)
	}
	if monitorGoroutines() == 0 {
		t.Fatal("Events started no goroutine; the leak check below would prove nothing")
	}
	mcancel()
	// The loop is blocked reading the socket; it must return and close the
	// channel without any udev event arriving. (The bound only turns a
	// hang into a failure.)
	bound := time.After(30 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-ch:
		case <-bound:
			t.Fatal("event channel still open after its context ended")
		}
	}
	for monitorGoroutines() > 0 {
		select {
		case <-bound:
			t.Fatal("Monitor goroutine still running after its context ended")
		case <-time.After(time.Millisecond):
		}
	}
	if m.Err() != nil {
		t.Errorf("Err() = %v after a clean stop, want nil", m.Err())
	}
}

func TestFake_ReplaysInitialThenSent(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	f := NewFake(Event{Action: Add, DevPath: "/dev/sdb1", Size: 1, Scanned: true})
	ch, err := f.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-ch; ev.DevPath != "/dev/sdb1" || !ev.Scanned {
		t.Fatalf("first event %v, want the initial one", ev)
	}
	go f.Send(ctx, Event{Action: Remove, DevPath: "/dev/sdb1"})
	if ev := <-ch; ev.Action != Remove {
		t.Fatalf("second event %v, want the sent remove", ev)
	}
	cancel()
	for range ch {
	}
}
