package udev

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/pilebones/go-udev/netlink"
	"golang.org/x/sys/unix"
)

// ErrMonitor marks a failure to listen to udev.
var ErrMonitor = errors.New("cannot watch block devices")

// Monitor is the real Source: udev's processed events (those that carry
// ID_FS_TYPE) from the udev netlink group, after a scan of the devices
// already present. It needs systemd-udevd running; without it, it still
// scans but hears nothing.
type Monitor struct {
	Log *slog.Logger
	// Sys is where sysfs is mounted ("/sys"); UdevData is udev's database
	// ("/run/udev/data"). Tests point them elsewhere.
	Sys      string
	UdevData string
	// NoScan skips the startup scan.
	NoScan bool

	mu  sync.Mutex
	err error
}

// NewMonitor returns a Monitor on the host's sysfs and udev database.
func NewMonitor(log *slog.Logger) *Monitor {
	return &Monitor{Log: log, Sys: "/sys", UdevData: "/run/udev/data"}
}

// Err is the error that closed the last Events channel before its context
// ended, or nil.
func (m *Monitor) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

func (m *Monitor) setErr(err error) {
	m.mu.Lock()
	m.err = err
	m.mu.Unlock()
}

func (m *Monitor) log() *slog.Logger {
	if m.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return m.Log
}

// Events subscribes to udev, then (unless NoScan) emits an Add for every
// block device present with a non-zero size, then every block add, change
// and remove udev reports. Subscribing before scanning means nothing that
// happens during the scan is missed (it may be reported twice). If the
// kernel drops events (receive buffer full) the scan runs again: present
// devices are reported again, removals in the gap are not (a reader of a
// pulled stick sees its reads fail). The channel closes when ctx ends, or
// on a read error (see Err), which is logged.
func (m *Monitor) Events(ctx context.Context) (<-chan Event, error) {
	conn := &netlink.UEventConn{}
	if err := conn.Connect(netlink.UdevEvent); err != nil {
		return nil, fmt.Errorf("%w: udev netlink socket: %w (ferry must run as root)", ErrMonitor, err)
	}
	fd := conn.Fd
	// A big receive buffer rides out event storms (a hub with many
	// partitions); SO_RCVBUFFORCE needs root and is best effort.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	if err := unix.SetNonblock(fd, true); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%w: %w", ErrMonitor, err)
	}
	// A non-blocking fd becomes pollable: closing the File wakes a read
	// blocked in the runtime poller, which is how the loop stops on ctx.
	f := os.NewFile(uintptr(fd), "udev-netlink")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: %w", ErrMonitor, err)
	}
	m.setErr(nil)
	out := make(chan Event)
	stop := context.AfterFunc(ctx, func() { f.Close() })
	go func() {
		defer close(out)
		defer stop()
		defer f.Close()
		send := func(ev Event) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		scan := !m.NoScan
		buf := make([]byte, 64<<10)
		for {
			if scan {
				scan = false
				evs, err := Scan(m.Sys, m.UdevData)
				if err != nil {
					m.log().Warn("block device scan incomplete", "err", err)
				}
				for _, ev := range evs {
					if !send(ev) {
						return
					}
				}
			}
			n, err := recv(rc, buf)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				if errors.Is(err, unix.ENOBUFS) {
					// The kernel dropped events: rescan so none is lost.
					m.log().Warn("udev events were lost (receive buffer full); rescanning block devices")
					scan = true
					continue
				}
				err = fmt.Errorf("%w: reading udev events: %w", ErrMonitor, err)
				m.setErr(err)
				m.log().Error("stopped watching block devices", "err", err)
				return
			}
			ev, ok, err := parseMessage(buf[:n], m.Sys)
			if err != nil {
				m.log().Debug("ignoring malformed udev message", "err", err)
				continue
			}
			if ok && !send(ev) {
				return
			}
		}
	}()
	return out, nil
}

// recv reads one datagram through the runtime poller.
func recv(rc interface {
	Read(func(fd uintptr) bool) error
}, buf []byte) (int, error) {
	var n int
	var rerr error
	err := rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), buf, 0)
		return rerr != unix.EAGAIN && rerr != unix.EWOULDBLOCK
	})
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, rerr
	}
	return n, nil
}

// parseMessage turns one netlink message into an Event; ok is false for
// messages that are not block add/change/remove.
func parseMessage(msg []byte, sys string) (ev Event, ok bool, err error) {
	env, err := parseEnv(msg)
	if err != nil {
		return Event{}, false, err
	}
	return eventFromEnv(env, sys)
}

// parseEnv returns the properties of a udev (or kernel) uevent message.
// go-udev's parser rejects values holding '=', so fall back to a lenient
// one for those.
func parseEnv(msg []byte) (map[string]string, error) {
	// go-udev v0.9.0's parser panics on a message without a NUL
	// (netlink/uevent.go:170, e.g. "add@"): such a message is no uevent.
	if bytes.IndexByte(msg, 0) < 0 {
		return nil, errors.New("not a uevent: no NUL-terminated header")
	}
	if ue, err := netlink.ParseUEvent(msg); err == nil {
		if ue.Env["ACTION"] == "" {
			ue.Env["ACTION"] = string(ue.Action)
		}
		return ue.Env, nil
	}
	return parseLenient(msg)
}

const libudevMagic = 0xfeedcafe

func parseLenient(msg []byte) (map[string]string, error) {
	var payload []byte
	if bytes.HasPrefix(msg, []byte("libudev\x00")) {
		// struct udev_monitor_netlink_header: prefix[8], magic (BE) u32,
		// header_size u32, properties_off u32, properties_len u32, …
		if len(msg) < 40 {
			return nil, errors.New("short libudev message")
		}
		if binary.BigEndian.Uint32(msg[8:12]) != libudevMagic {
			return nil, errors.New("libudev message with a bad magic number")
		}
		off := binary.NativeEndian.Uint32(msg[16:20])
		if int(off) >= len(msg) {
			return nil, errors.New("libudev message with a bad properties offset")
		}
		payload = msg[off:]
	} else {
		i := bytes.IndexByte(msg, 0)
		if i < 0 || !bytes.Contains(msg[:i], []byte("@")) {
			return nil, errors.New("not a uevent")
		}
		payload = msg[i+1:]
	}
	env := map[string]string{}
	for _, f := range bytes.Split(payload, []byte{0}) {
		k, v, found := bytes.Cut(f, []byte("="))
		if !found || len(k) == 0 {
			continue
		}
		env[string(k)] = string(v)
	}
	if env["ACTION"] == "" {
		return nil, errors.New("uevent without ACTION")
	}
	return env, nil
}

func eventFromEnv(env map[string]string, sys string) (Event, bool, error) {
	if env["SUBSYSTEM"] != "block" {
		return Event{}, false, nil
	}
	a := Action(strings.ToLower(env["ACTION"]))
	switch a {
	case Add, Change, Remove:
	default:
		return Event{}, false, nil
	}
	name := env["DEVNAME"]
	if name == "" {
		return Event{}, false, errors.New("block uevent without DEVNAME")
	}
	if !strings.HasPrefix(name, "/") {
		name = "/dev/" + name
	}
	ev := Event{
		Action:  a,
		DevPath: name,
		DevType: env["DEVTYPE"],
		FSType:  env["ID_FS_TYPE"],
		Label:   env["ID_FS_LABEL"],
		Major:   parseUint32(env["MAJOR"]),
		Minor:   parseUint32(env["MINOR"]),
	}
	ev.DiskSeq, _ = strconv.ParseUint(env["DISKSEQ"], 10, 64)
	if a != Remove && env["DEVPATH"] != "" {
		dir := filepath.Join(sys, env["DEVPATH"])
		ev.Size = Size(dir)
		// The size is read now, not when the event was made: if the
		// device already holds another medium (a loop device detached and
		// reused), this event's medium is gone.
		if ev.DiskSeq != 0 {
			if now := readUint(filepath.Join(dir, "diskseq")); now != 0 && now != ev.DiskSeq {
				ev.Size = 0
			}
		}
	}
	return ev, true, nil
}

func parseUint32(s string) uint32 {
	v, _ := strconv.ParseUint(s, 10, 32)
	return uint32(v)
}

func readUint(path string) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return v
}

// Size is the size in bytes of the block device whose sysfs directory
// is dir (0 when unknown or empty).
func Size(dir string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, "size"))
	if err != nil {
		return 0
	}
	sectors, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0
	}
	return sectors * 512
}
