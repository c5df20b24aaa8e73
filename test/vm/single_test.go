package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// loadTimeout bounds one bundle's load (FERRY_VM_LOAD_TIMEOUT overrides):
// generous, as TCG's speed varies by ±50% with the host's load.
var loadTimeout = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("FERRY_VM_LOAD_TIMEOUT")); err == nil {
		return d
	}
	return 15 * time.Minute
}()

// TestSingleNode_VFATStickLoadsAndPinsEveryImage: a node with real systemd,
// udev, D-Bus and CRI-O gets a FAT32 stick holding upgrade-*.tar and its
// .sha256; ferry loads the bundle, every image ends present and pinned in
// CRI-O, systemd and the journal say so, CRI-O was reloaded through
// systemd, and pulling the stick afterwards breaks nothing.
func TestSingleNode_VFATStickLoadsAndPinsEveryImage(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	n, size := bundleImages()
	b := makeBundle(t, ctx, e, "4.13.7", n, size)
	stick := filepath.Join(t.TempDir(), "stick-vfat.img")
	if err := MakeVFATStick(ctx, stick, b.Tar, b.SHA); err != nil {
		t.Fatal(err)
	}
	v := e.boot(t, ctx, "node1", Node{Name: "node1", Config: nodeConfig("node1", nil, "", nil)}, 2, nil)
	e.waitReady(t, ctx, v)
	requireActive(t, ctx, v)

	fl, haveFloor := measureFloor(t, ctx, v, b, stick, false)
	requireActive(t, ctx, v)

	took := plugAndLoad(t, ctx, v, "stick", stick, b)
	checkLoadedNode(t, ctx, v, b)
	report(t, "single node, vfat stick", b, took, fl, haveFloor)

	if err := v.UnplugUSB(ctx, "stick"); err != nil {
		t.Fatal(err)
	}
	checkAfterUnplug(t, ctx, v, b)
}

// TestSingleNode_ISOOnAUSBCDROMLoads (issue 33, item 4): BMC virtual media
// as a remote server gets it, a bundle on an ISO 9660 disc in a USB CD-ROM
// drive (/dev/sr0), is read through the packaged unit (DeviceAllow
// block-sr) like a stick: loaded, every image pinned.
func TestSingleNode_ISOOnAUSBCDROMLoads(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	n, size := bundleImages()
	b := makeBundle(t, ctx, e, "4.13.10", n, size)
	iso := filepath.Join(t.TempDir(), "virtual-media.iso")
	if err := MakeISO(ctx, iso, b.Tar, b.SHA); err != nil {
		t.Fatal(err)
	}
	v := e.boot(t, ctx, "node1", Node{Name: "node1", Config: nodeConfig("node1", nil, "", nil)}, 2, nil)
	e.waitReady(t, ctx, v)
	requireActive(t, ctx, v)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the guest's view of the drive:\n%s", sh(t, context.Background(), v,
				"ls -l /dev/sr* 2>&1; udevadm info /dev/sr0 2>&1 | grep -E 'ID_(CDROM|FS|BUS)|DEVTYPE' ; dmesg | grep -iE 'sr0|cdrom|scsi|usb-storage|uas' | tail -20; journalctl -u ferry --no-pager | tail -20"))
		}
	})
	took := loadFrom(t, ctx, v, b, func() error { return v.PlugCDROM(ctx, "cd", iso) })
	t.Logf("virtual media plugged -> loaded in %.1fs", took.Seconds())
	requireAllPinned(t, ctx, v, b.Refs)
	if out := sh(t, ctx, v, "journalctl -u ferry --no-pager | grep -c /dev/sr0 || true"); strings.TrimSpace(out) == "0" {
		t.Error("the journal never names /dev/sr0: the bundle did not come from the CD-ROM")
	}
}

// TestSingleNode_RawStickAndTamperedStick: a stick with one flipped byte is
// refused with the reason in `systemctl status ferry` and nothing pinned;
// then the raw tar dd'd onto a stick (no filesystem, no .sha256: trusted
// through approved_digests) loads.
func TestSingleNode_RawStickAndTamperedStick(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	n, size := bundleImages()
	b := makeBundle(t, ctx, e, "4.13.8", n, size)
	dir := t.TempDir()
	badTar, badSHA := b.tampered(t)
	bad := filepath.Join(dir, "stick-tampered.img")
	if err := MakeVFATStick(ctx, bad, badTar, badSHA); err != nil {
		t.Fatal(err)
	}
	raw := filepath.Join(dir, "stick-raw.img")
	if err := MakeRawStick(raw, b.Tar); err != nil {
		t.Fatal(err)
	}
	v := e.boot(t, ctx, "node1", Node{Name: "node1", Config: nodeConfig("node1", []string{b.Digest}, "", nil)}, 2, nil)
	e.waitReady(t, ctx, v)
	requireActive(t, ctx, v)

	// tampered: refused, nothing pinned, the reason where a technician looks
	if err := v.PlugUSB(ctx, "bad", bad, true); err != nil {
		t.Fatal(err)
	}
	st := waitStatus(t, ctx, v, loadTimeout, func(s ferryStatus) bool {
		_, ok := s.rejected(b.Digest)
		return ok || s.Error != ""
	}, func(s ferryStatus) bool { return s.loadedWith(b.Digest) })
	t.Logf("tampered stick: %s", st)
	status := sh(t, ctx, v, "systemctl status ferry --no-pager -l -n 0 || true")
	t.Logf("systemctl status ferry:\n%s", status)
	if !regexpAny(status, "(?i)sha256|digest|mismatch|damaged|corrupt") {
		t.Errorf("systemctl status ferry does not say why the tampered bundle was refused:\n%s", status)
	}
	for ref, s := range pinnedState(t, ctx, v, b.Refs) {
		if s != "missing" {
			t.Errorf("after the tampered stick, %s is %s in CRI-O; want nothing loaded", ref, s)
		}
	}
	if out := sh(t, ctx, v, "ls /etc/crio/crio.conf.d/"); strings.Contains(out, "pin-upgrade") {
		t.Errorf("after the tampered stick, crio.conf.d holds a pin file: %s", out)
	}
	if err := v.UnplugUSB(ctx, "bad"); err != nil {
		t.Fatal(err)
	}
	requireActive(t, ctx, v)

	fl, haveFloor := measureFloor(t, ctx, v, b, raw, true)
	requireActive(t, ctx, v)
	took := plugAndLoad(t, ctx, v, "raw", raw, b)
	checkLoadedNode(t, ctx, v, b)
	report(t, "single node, raw tar on the device", b, took, fl, haveFloor)
	if err := v.UnplugUSB(ctx, "raw"); err != nil {
		t.Fatal(err)
	}
	checkAfterUnplug(t, ctx, v, b)
}

func requireActive(t *testing.T, ctx context.Context, v *VM) {
	t.Helper()
	r := try(t, ctx, v, "systemctl is-active crio ferry")
	if r.Code != 0 || r.Stdout != "active\nactive\n" {
		t.Fatalf("%s: systemctl is-active crio ferry: %q\n%s", v.Name(), r.Stdout, diag(ctx, v))
	}
}

// plugAndLoad plugs the stick and waits until ferry reports b loaded; it
// returns the plug-to-loaded time on the host's clock.
func plugAndLoad(t *testing.T, ctx context.Context, v *VM, id, img string, b *testBundle) time.Duration {
	t.Helper()
	return loadFrom(t, ctx, v, b, func() error { return v.PlugUSB(ctx, id, img, true) })
}

// loadFrom runs plug (a stick, a CD-ROM) and waits until the node has
// loaded b from it.
func loadFrom(t *testing.T, ctx context.Context, v *VM, b *testBundle, plug func() error) time.Duration {
	t.Helper()
	// refusals already on record (an earlier, tampered stick) are not this one's
	before, _, err := readStatus(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := plug(); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, ctx, v, loadTimeout, func(s ferryStatus) bool { return s.loadedWith(b.Digest) },
		func(s ferryStatus) bool {
			return (s.Error != "" && s.Error != before.Error) ||
				(s.Phase != before.Phase && (s.Phase == "rejected" || s.Phase == "failed" || s.Phase == "conflict"))
		})
	took := time.Since(start)
	t.Logf("%s: stick plugged -> loaded in %.1fs", v.Name(), took.Seconds())
	return took
}

// checkLoadedNode checks everything a loaded node must show besides its
// status: pins in CRI-O, the STATUS= line, journal fields, crio's reload.
func checkLoadedNode(t *testing.T, ctx context.Context, v *VM, b *testBundle) {
	t.Helper()
	requireAllPinned(t, ctx, v, b.Refs)

	statusText := strings.TrimSpace(sh(t, ctx, v, "systemctl show -p StatusText --value ferry"))
	status := sh(t, ctx, v, "systemctl status ferry --no-pager -l -n 0 || true")
	t.Logf("systemctl status ferry:\n%s", status)
	if statusText == "" || !strings.Contains(status, "Status: \""+statusText) {
		t.Errorf("systemctl status ferry shows no STATUS= line (StatusText=%q)", statusText)
	}
	if !strings.Contains(statusText, b.Meta.Version) && !strings.Contains(statusText, filepath.Base(b.Tar)) {
		t.Errorf("ferry's STATUS= line %q names neither the bundle nor its version %s", statusText, b.Meta.Version)
	}

	// journald fields: PHASE, BUNDLE, DIGEST on ferry's own entries
	out := sh(t, ctx, v, "journalctl -u ferry -o json --no-pager")
	phases := map[string]bool{}
	withFields := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var ent map[string]any
		if json.Unmarshal([]byte(line), &ent) != nil {
			continue
		}
		p, _ := ent["PHASE"].(string)
		d, _ := ent["DIGEST"].(string)
		_, hasBundle := ent["BUNDLE"]
		if p != "" && hasBundle && d != "" {
			withFields++
			if d == b.Digest || "sha256:"+d == b.Digest {
				phases[p] = true
			}
		}
	}
	if !phases["loaded"] {
		t.Errorf("journalctl -u ferry -o json: no entry with PHASE=loaded, BUNDLE and DIGEST=%s (%d entries carry the fields; phases seen for this digest: %v)",
			b.Digest, withFields, sortedKeys(phases))
	} else {
		t.Logf("journal: %d ferry entries carry PHASE/BUNDLE/DIGEST; phases for this bundle: %v", withFields, sortedKeys(phases))
	}

	// crio reloaded through systemd (ExecReload) and applied it
	crioLog := sh(t, ctx, v, "journalctl -u crio -o cat --no-pager | grep -E 'Reload|reload' || true")
	if !strings.Contains(crioLog, "Reloaded") && !strings.Contains(crioLog, "reload completed") {
		t.Errorf("crio's journal shows no reload:\n%s", crioLog)
	}
	if !strings.Contains(crioLog, "reload completed") {
		t.Errorf("crio's journal shows systemd's reload but not crio's \"Configuration reload completed\":\n%s", crioLog)
	}
}

func checkAfterUnplug(t *testing.T, ctx context.Context, v *VM, b *testBundle) {
	t.Helper()
	sh(t, ctx, v, "for i in $(seq 300); do ls /dev/disk/by-id/usb-* >/dev/null 2>&1 || exit 0; sleep 0.1; done; exit 1")
	requireActive(t, ctx, v)
	s, raw, err := readStatus(ctx, v)
	if err != nil {
		t.Fatal(err)
	}
	if !s.loadedWith(b.Digest) {
		t.Errorf("after the stick was pulled, ferry status: %s\n%s", s, raw)
	}
	requireAllPinned(t, ctx, v, b.Refs)
}

// report prints the scenario's timing against its floor.
func report(t *testing.T, what string, b *testBundle, took time.Duration, fl floor, haveFloor bool) {
	t.Helper()
	msg := fmt.Sprintf("TIMING %s: %d images, %.1f MiB: plug-to-loaded %.1fs", what, len(b.Refs), float64(b.Bytes)/(1<<20), took.Seconds())
	if haveFloor {
		msg += fmt.Sprintf("; floor %.1fs (read %.1fs + crictl pull x4 %.1fs); ratio %.2f (goal <= 1.3)",
			fl.Total(), fl.ReadSeconds, fl.PullSeconds, took.Seconds()/fl.Total())
	}
	t.Log(msg)
	fmt.Println(msg)
}

// TestSingleNode_FerryLoadOfAFileInRootUnderThePackagedUnit: the packaged
// unit hides /root from ferry (ProtectHome=yes) and gives it its own /tmp
// (PrivateTmp=yes); `ferry load /root/upgrade-….tar` still loads and pins
// every image, because the command opens the file as the caller and hands
// the agent the open descriptor.
func TestSingleNode_FerryLoadOfAFileInRootUnderThePackagedUnit(t *testing.T) {
	e := setup(t)
	ctx := t.Context()
	n, size := bundleImages()
	b := makeBundle(t, ctx, e, "4.13.9", n, size)
	tarData, err := os.ReadFile(b.Tar)
	if err != nil {
		t.Fatal(err)
	}
	shaData, err := os.ReadFile(b.SHA)
	if err != nil {
		t.Fatal(err)
	}
	inRoot := "/root/" + filepath.Base(b.Tar)
	node := Node{Name: "node1", Config: nodeConfig("node1", nil, "", nil), Extra: Layer{
		inRoot:                          {Data: tarData, Mode: 0o600},
		"/root/" + filepath.Base(b.SHA): {Data: shaData, Mode: 0o600},
	}}
	v := e.boot(t, ctx, "node1", node, 2, nil)
	e.waitReady(t, ctx, v)
	requireActive(t, ctx, v)
	if got := strings.TrimSpace(sh(t, ctx, v, "systemctl show -p ProtectHome --value ferry")); got != "yes" {
		t.Fatalf("the unit's ProtectHome is %q: this test needs the packaged unit's sandbox", got)
	}

	start := time.Now()
	out := sh(t, ctx, v, "ferry load "+inRoot)
	t.Logf("ferry load %s: %s", inRoot, strings.TrimSpace(out))
	waitStatus(t, ctx, v, loadTimeout, func(s ferryStatus) bool { return s.loadedWith(b.Digest) },
		func(s ferryStatus) bool { return s.Phase == "rejected" || s.Phase == "failed" })
	t.Logf("ferry load of a file in /root to loaded: %s", time.Since(start).Round(time.Second))
	checkLoadedNode(t, ctx, v, b)
	checkInSlice(t, ctx, v, e.bins.FerrySlice)
}

// checkInSlice checks the packaged unit's good-neighbour setup on a real
// systemd: ferry runs in ferry.slice, at the CPU weight slice (the node's
// packaging/ferry.slice) gives it.
func checkInSlice(t *testing.T, ctx context.Context, v *VM, slice []byte) {
	t.Helper()
	weight := regexp.MustCompile(`(?m)^CPUWeight=(\d+)$`).FindSubmatch(slice)
	if weight == nil {
		t.Fatal("packaging/ferry.slice sets no CPUWeight")
	}
	if got := strings.TrimSpace(sh(t, ctx, v, "systemctl show -p Slice --value ferry")); got != "ferry.slice" {
		t.Errorf("ferry.service runs in %q, want ferry.slice", got)
	}
	if got := strings.TrimSpace(sh(t, ctx, v, "cat /proc/$(systemctl show -p MainPID --value ferry)/cgroup")); got != "0::/ferry.slice/ferry.service" {
		t.Errorf("ferry's process is in cgroup %q, want 0::/ferry.slice/ferry.service", got)
	}
	if got := strings.TrimSpace(sh(t, ctx, v, "cat /sys/fs/cgroup/ferry.slice/cpu.weight")); got != string(weight[1]) {
		t.Errorf("ferry.slice's cpu.weight is %s, packaging/ferry.slice says %s", got, weight[1])
	}
}
