// Package media opens what a plugged device holds: it decides which block
// devices count as sticks (USB, MMC, or a kind the config allows; never a
// network LUN by default, never a disk this node uses), mounts a stick's filesystem
// read-only in a private directory (or reads a raw tar on the bare
// device), and opens each bundle's files on it without following a link.
// The devices themselves are found by udev (package udev).
package media

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/ferry-edge/ferry/udev"
)

var (
	// ErrNotBundle: the device holds no upgrade bundle (no upgrade-*.tar at
	// the root of its filesystem, or no raw tar starting with metadata.json).
	ErrNotBundle = errors.New("no upgrade bundle on this device")
	// ErrSystemDevice: the device belongs to this node (it, or another
	// partition of its disk, is mounted, used as swap or held by LVM/RAID).
	ErrSystemDevice = errors.New("device is in use by this node")
	// ErrNoMedium: the device is empty or gone (zero size, pulled).
	ErrNoMedium = errors.New("device has no medium")
	// ErrUnsupportedFS: a filesystem ferry does not read, or one the
	// kernel has no driver for.
	ErrUnsupportedFS = errors.New("unsupported filesystem")
	// ErrMount: mounting failed for another reason.
	ErrMount = errors.New("cannot mount device")
	// ErrUnsafeFile: a file on the stick that ferry does not read: a
	// symbolic link, a FIFO, a device, a directory where a bundle file
	// is named, or a sidecar over MaxSidecar.
	ErrUnsafeFile = errors.New("unsafe file on the stick")
)

// Medium is an opened device: mounted (Dir set) or raw. Close it when done
// or when the device goes away.
type Medium struct {
	Device     string
	FSType     string
	Dir        string // mount point; "" for a raw medium
	Candidates []Candidate

	once     sync.Once
	closeErr error
}

// Close unmounts the medium (lazily if it is busy or its device is gone)
// and removes its mount point. It is safe to call more than once.
func (m *Medium) Close() error {
	m.once.Do(func() {
		for _, c := range m.Candidates {
			for _, f := range []*os.File{c.Tar, c.SHA256, c.Sig} {
				if f != nil {
					f.Close()
				}
			}
		}
		if m.Dir == "" {
			return
		}
		m.closeErr = unmount(m.Dir)
	})
	return m.closeErr
}

func unmount(dir string) error {
	err := unix.Unmount(dir, 0)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		// Busy (a reader still holds a file) or the device is gone: detach
		// now, the kernel finishes when the last file closes.
		if derr := unix.Unmount(dir, unix.MNT_DETACH); derr != nil && !errors.Is(derr, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w (unmount it by hand: umount -l %s)", dir, derr, dir)
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove mount point: %w", err)
	}
	return nil
}

// Media opens devices. The zero value of the path fields means the host's.
type Media struct {
	MountDir  string // private mount points are made under it
	Sys       string // "/sys"
	MountInfo string // "/proc/self/mountinfo"
	Swaps     string // "/proc/swaps"
	UdevData  string // "/run/udev/data"
	// AllowDevices are the kinds of device read besides USB and MMC ones
	// (see DeviceKinds): "loop", "virtio", "nvme", "scsi", "ata",
	// "removable", or "any".
	AllowDevices []string
	// ExtraFilesystems are filesystems mounted besides DefaultFilesystems:
	// some of ExtraFilesystems. Empty by default.
	ExtraFilesystems []string
	// Log is told what the kernel refuses (nosymfollow) and which sticks
	// are left unmounted for their filesystem; nil discards.
	Log *slog.Logger

	noSymfollow sync.Once // logs once that the kernel lacks nosymfollow
}

// Open opens the device of ev with the host's defaults; see Media.Open.
func Open(ctx context.Context, ev udev.Event, mountDir string) (*Medium, error) {
	return (&Media{MountDir: mountDir}).Open(ctx, ev)
}

func (m *Media) sys() string       { return cmp.Or(m.Sys, "/sys") }
func (m *Media) mountInfo() string { return cmp.Or(m.MountInfo, "/proc/self/mountinfo") }
func (m *Media) swaps() string     { return cmp.Or(m.Swaps, "/proc/swaps") }
func (m *Media) udevData() string  { return cmp.Or(m.UdevData, "/run/udev/data") }

func (m *Media) log() *slog.Logger {
	if m.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return m.Log
}

// Open opens the device of a udev event (see OpenDevice); a device gone
// (remove) is ErrNoMedium.
func (m *Media) Open(ctx context.Context, ev udev.Event) (*Medium, error) {
	if ev.Action == udev.Remove {
		return nil, fmt.Errorf("%s: %w", ev.DevPath, ErrNoMedium)
	}
	return m.OpenDevice(ctx, ev.DevPath, ev.FSType)
}

// OpenDevice looks for bundles on dev, whose filesystem udev names fsType
// ("" none). A device that starts with a tar whose first entry is
// metadata.json is a raw bundle (candidate = the device node). Otherwise
// a device with a filesystem ferry reads is mounted read-only, nodev,
// nosuid, noexec, nosymfollow in a new directory under MountDir, and
// every upgrade-*.tar at its root is a candidate, opened with its
// sidecars (see Candidate). The device is refused (ErrSystemDevice) when
// it is part of a disk this node uses, and (ErrNotRemovable) when it is
// not a USB or MMC device nor of a kind in AllowDevices, before anything
// on it is read. Errors wrap ErrNoMedium, ErrSystemDevice,
// ErrNotRemovable, ErrNotBundle, ErrUnsupportedFS or ErrMount.
func (m *Media) OpenDevice(ctx context.Context, dev, fsType string) (*Medium, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := m.Check(dev); err != nil {
		return nil, err
	}
	if err := m.CheckKind(dev); err != nil {
		return nil, err
	}
	raw, err := startsWithBundle(dev)
	if err != nil {
		return nil, err
	}
	if raw {
		return &Medium{Device: dev, Candidates: []Candidate{{
			Name: filepath.Base(dev), TarPath: dev, Raw: true,
		}}}, nil
	}
	if fsType == "" {
		return nil, fmt.Errorf("%s: %w (no filesystem, and no tar starting with %s)", dev, ErrNotBundle, metadataName)
	}
	return m.mount(dev, fsType)
}
