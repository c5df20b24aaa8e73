// Package vm runs ferry end to end in QEMU guests with real systemd, udev,
// D-Bus and CRI-O, and holds the harness that makes that possible.
//
// The harness:
//
//   - BuildImage builds (once, cached in /var/cache/ferry-test/vm keyed on
//     its inputs) a Debian 12 guest: mmdebstrap --variant=essential with
//     systemd, udev, D-Bus, conmon, runc and containers-common; Debian's
//     kernel package unpacked, not installed, with only the modules the
//     tests need; a busybox initramfs; CRI-O (test/setup/build-crio.sh) as
//     a systemd service; an ext4 root made with mkfs.ext4 -d. A warm cache
//     answers in about a second.
//   - Start boots a guest from that image with snapshot=on, plus a per-boot
//     layer (a tar the initramfs unpacks over the root): ferry, its unit
//     (packaging/ferry.service), its config and the control channel's
//     guest end. KVM is used when ProbeAccel can boot the kernel with it,
//     TCG otherwise. qemu dies with the test process (PR_SET_PDEATHSIG) and
//     runs in an empty network namespace.
//   - QMP (a unix socket) hot-plugs USB sticks on a qemu-xhci bus; the
//     control channel (JSON lines on a virtio-serial port, served in the
//     guest by test/vm/guestagent) runs commands and returns their output
//     and exit code; a Hub is a private Ethernet segment between guests.
//
// The tests (go test ./test/vm, as root; `make e2e`) boot guests and plug
// bundles made by `ferry bundle create` into them: a FAT32 stick, a raw tar
// on the device, a tampered stick, and three nodes sharing one stick. With
// CI=true a missing prerequisite fails them; elsewhere they skip and say
// what to run. `make demo` runs TestDemo, the narrated single-node story.
// Environment knobs are listed in env_test.go.
package vm
