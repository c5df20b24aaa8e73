package vm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDemo is `make demo` (test/vm/demo.sh): the main job end to end,
// narrated for a person watching — a bundle made with `ferry bundle
// create`, written to a USB stick, plugged into a node VM with real
// systemd, udev, D-Bus and CRI-O, and every image ending pinned. It runs
// only with FERRY_DEMO=1; the scenarios prove the same with assertions.
func TestDemo(t *testing.T) {
	if os.Getenv("FERRY_DEMO") != "1" {
		t.Skip("the narrated demo runs with FERRY_DEMO=1 (make demo)")
	}
	say := func(format string, a ...any) { fmt.Printf("\n==> "+format+"\n", a...) }
	show := func(text string) {
		for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
			fmt.Println("    " + l)
		}
	}
	demoStart := time.Now()
	say("Preparing the node image (Debian 12 + systemd + udev + D-Bus + CRI-O 1.34; cached after the first run)")
	e := setup(t)
	ctx := t.Context()
	fmt.Printf("    accelerator: %s (%s)\n", e.accel, e.why())

	n := 20
	fmt.Sscan(os.Getenv("FERRY_VM_IMAGES"), &n)
	say("Making an upgrade bundle: a synthetic OpenShift release with %d payload images, served by a local registry", n)
	b := makeBundle(t, ctx, e, "4.13.7", n, 1<<20)
	if b.Command != "" {
		fmt.Println("    $ " + b.Command)
		show(b.Output)
	}
	fmt.Printf("    %s  %.1f MiB  %s\n", filepath.Base(b.Tar), float64(b.Bytes)/(1<<20), b.Digest)

	say("Writing it to a USB stick (FAT32): %s and %s", filepath.Base(b.Tar), filepath.Base(b.SHA))
	stick := filepath.Join(t.TempDir(), "stick.img")
	if err := MakeVFATStick(ctx, stick, b.Tar, b.SHA); err != nil {
		t.Fatal(err)
	}

	say("Booting node1 under QEMU; ferry runs as a systemd service with its packaged unit")
	v := e.boot(t, ctx, "node1", Node{Name: "node1", Config: nodeConfig("node1", []string{b.Digest}, "", nil)}, 2, nil)
	bi, err := v.WaitReady(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("    booted in %.0fs; system %s\n", bi.HostSeconds, bi.SystemState)
	fmt.Println("    $ systemctl is-active crio ferry")
	show(try(t, ctx, v, "systemctl is-active crio ferry").Stdout)
	fmt.Println("    $ ferry status")
	show(try(t, ctx, v, "ferry status").Stdout)

	say("Plugging the stick into node1 (QMP: device_add usb-storage on the xhci bus)")
	start := time.Now()
	if err := v.PlugUSB(ctx, "stick", stick, true); err != nil {
		t.Fatal(err)
	}
	last := ""
	waitStatus(t, ctx, v, loadTimeout, func(s ferryStatus) bool {
		if s.Line != last && s.Line != "" {
			fmt.Printf("    %5.1fs  %-13s %s\n", time.Since(start).Seconds(), s.Phase, s.Line)
			last = s.Line
		}
		return s.loadedWith(b.Digest)
	}, func(s ferryStatus) bool { return s.Phase == "rejected" || s.Phase == "failed" || s.Phase == "conflict" })
	took := time.Since(start)
	fmt.Printf("    loaded %.1fs after the plug\n", took.Seconds())

	say("What a technician sees: systemctl status ferry")
	show(try(t, ctx, v, "systemctl status ferry --no-pager -l -n 8").Stdout)

	say("Images in CRI-O (crictl, through the CRI socket)")
	imgs := guestImages(t, ctx, v)
	pinned := 0
	for _, ref := range b.Refs {
		state := "MISSING"
		for _, im := range imgs {
			for _, d := range im.RepoDigests {
				if d == ref {
					state = map[bool]string{true: "pinned", false: "NOT PINNED"}[im.Pinned]
				}
			}
		}
		if state == "pinned" {
			pinned++
		}
		fmt.Printf("    %-10s %s\n", state, ref)
	}
	fmt.Printf("    %d of %d images present and pinned\n", pinned, len(b.Refs))
	if pinned != len(b.Refs) {
		t.Errorf("%d of %d images pinned", pinned, len(b.Refs))
	}

	say("Pulling the stick out: the node keeps its images")
	if err := v.UnplugUSB(ctx, "stick"); err != nil {
		t.Fatal(err)
	}
	fmt.Println("    $ ferry status")
	show(try(t, ctx, v, "sleep 1; ferry status").Stdout)

	say("Done: stick plugged -> %d images pinned in %.1fs (demo took %.0fs)", len(b.Refs), took.Seconds(), time.Since(demoStart).Seconds())
}
