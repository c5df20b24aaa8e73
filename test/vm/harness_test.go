package vm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHarness_GuestBootsWithCRIOAndSeesUSBStick proves the parts the
// ferry scenarios stand on: the guest boots from the cached image with
// its per-boot layer, CRI-O runs as a systemd service and answers CRI, a
// stick hot-plugged over QMP reaches the guest's udev as a USB disk with
// its filesystem, and unplugging it removes it.
func TestHarness_GuestBootsWithCRIOAndSeesUSBStick(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	v := e.boot(t, ctx, "harness", Node{Name: "harness", Config: "node_name = \"harness\"\n"}, 2, nil)
	e.waitReady(t, ctx, v)
	t.Logf("boot:\n%s", try(t, ctx, v, "systemd-analyze time; systemd-analyze blame | head -12; systemctl --failed --no-legend").Stdout)

	if got := strings.TrimSpace(sh(t, ctx, v, "cat /etc/hostname")); got != "harness" {
		t.Errorf("hostname from the layer = %q, want harness", got)
	}
	if got := strings.TrimSpace(sh(t, ctx, v, "systemctl is-active crio")); got != "active" {
		t.Fatalf("crio.service is %q", got)
	}
	if out := sh(t, ctx, v, crictl+" version"); !strings.Contains(out, "RuntimeName:  cri-o") {
		t.Errorf("crictl version: %s", out)
	}
	if r := try(t, ctx, v, "test -x /usr/bin/ferry && test -f /etc/systemd/system/ferry.service"); r.Code != 0 {
		t.Errorf("ferry binary or unit missing from the guest")
	}

	dir := t.TempDir()
	payload := filepath.Join(dir, "hello.txt")
	if err := os.WriteFile(payload, []byte("hello from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "stick.img")
	if err := MakeVFATStick(ctx, img, payload); err != nil {
		t.Fatal(err)
	}
	plugged := time.Now()
	if err := v.PlugUSB(ctx, "s1", img, true); err != nil {
		t.Fatal(err)
	}
	props := sh(t, ctx, v, `for i in $(seq 600); do
		d=$(ls /dev/disk/by-id/ 2>/dev/null | grep '^usb-' | head -1)
		[ -n "$d" ] && break; sleep 0.1; done
		udevadm settle; dev=$(readlink -f /dev/disk/by-id/$d)
		echo DEV=$dev; udevadm info --query=property "$dev"`)
	t.Logf("stick seen by udev %.1fs after device_add:\n%s", time.Since(plugged).Seconds(), props)
	for _, want := range []string{"ID_BUS=usb", "ID_FS_TYPE=vfat", "ID_FS_LABEL=FERRY", "DEVTYPE=disk"} {
		if !strings.Contains(props, want) {
			t.Errorf("udev properties of the stick lack %s", want)
		}
	}
	dev := ""
	for _, l := range strings.Split(props, "\n") {
		if d, ok := strings.CutPrefix(l, "DEV="); ok {
			dev = d
		}
	}
	if got := sh(t, ctx, v, "mkdir -p /mnt/s && mount -o ro "+dev+" /mnt/s && cat /mnt/s/hello.txt; umount /mnt/s"); got != "hello from the host\n" {
		t.Errorf("file read from the stick in the guest = %q", got)
	}
	if err := v.UnplugUSB(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	sh(t, ctx, v, "for i in $(seq 300); do [ -b "+dev+" ] || exit 0; sleep 0.1; done; echo still there; exit 1")
}
