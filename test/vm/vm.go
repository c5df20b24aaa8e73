package vm

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ferry-edge/ferry/test/vm/ctl"
)

// Config describes one guest.
type Config struct {
	Name  string
	Image *Image
	// Dir receives console.log, qemu.log, channel.log and the layer tar.
	Dir string
	// Accel is "kvm" or "tcg" (see ProbeAccel).
	Accel    string
	CPUs     int // default 1
	MemoryMB int // default 1536
	// Layer is unpacked over the root image by the initramfs at boot.
	Layer Layer
	// Net, if set, gives the guest one NIC (eth0) on a Hub.
	Net *NetConfig
	// API, if set, is a unix socket each of the guest's connections to
	// APIAddr is handed to (the host's Kubernetes API, forwarded): a NIC
	// on QEMU's user network, restricted so that it reaches nothing else.
	// It is eth0 without Net, eth1 with it; its address is 10.0.2.15/24.
	API string
	Log *slog.Logger
}

// APIAddr is where a guest with Config.API reaches the host's API.
const APIAddr = "10.0.2.100:6443"

// NetConfig attaches the guest to a Hub.
type NetConfig struct {
	Hub *Hub
	MAC string // 52:54:00:...
}

// VM is a running guest.
type VM struct {
	cfg     Config
	sockDir string
	cmd     *exec.Cmd
	started time.Time
	exited  chan struct{}
	exitErr error
	qmp     *QMP
	ch      *channel
	logf    *os.File

	killOnce sync.Once
}

// Layer is a set of files put over the guest's root at boot, by path.
type Layer map[string]File

// File is one entry of a Layer: a regular file, or a symlink when Link is set.
type File struct {
	Data []byte
	Mode os.FileMode // default 0644
	Link string
}

// Start boots a guest and connects to its QMP socket and control channel.
// The qemu process gets SIGKILL if the test process dies (PR_SET_PDEATHSIG);
// Kill ends it by its PID.
func Start(ctx context.Context, cfg Config) (*VM, error) {
	if cfg.CPUs == 0 {
		cfg.CPUs = 1
	}
	if cfg.MemoryMB == 0 {
		cfg.MemoryMB = 1536
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	// unix socket paths are limited to 108 bytes: keep them short
	sockDir, err := os.MkdirTemp("", "fvm-")
	if err != nil {
		return nil, err
	}
	v := &VM{cfg: cfg, sockDir: sockDir, exited: make(chan struct{})}
	layerPath := filepath.Join(cfg.Dir, "layer.tar")
	if err := cfg.Layer.writeTar(layerPath); err != nil {
		os.RemoveAll(sockDir)
		return nil, fmt.Errorf("layer: %w", err)
	}
	args := v.qemuArgs(layerPath)
	if err := os.WriteFile(filepath.Join(cfg.Dir, "qemu.args"), []byte(strings.Join(args, " ")+"\n"), 0o644); err != nil {
		os.RemoveAll(sockDir)
		return nil, err
	}
	if _, err := exec.LookPath("unshare"); err == nil {
		// an empty network namespace: no frame of the guest reaches a host
		// interface. Its loopback is up: the API forward's program talks
		// to QEMU's user network over a socket pair that libslirp makes
		// on 127.0.0.1.
		args = append([]string{"unshare", "--net", "--", "sh", "-c", `ip link set lo up && exec "$@"`, "qemu"}, args...)
	}
	v.logf, err = os.Create(filepath.Join(cfg.Dir, "qemu.log"))
	if err != nil {
		os.RemoveAll(sockDir)
		return nil, err
	}
	v.cmd = exec.Command(args[0], args[1:]...)
	v.cmd.Stdout, v.cmd.Stderr = v.logf, v.logf
	v.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	v.started = time.Now()
	if err := v.cmd.Start(); err != nil {
		v.logf.Close()
		os.RemoveAll(sockDir)
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	cfg.Log.Info("qemu started", "vm", cfg.Name, "pid", v.cmd.Process.Pid, "accel", cfg.Accel, "cpus", cfg.CPUs)
	go func() {
		v.exitErr = v.cmd.Wait()
		close(v.exited)
	}()
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	dctx, stop := v.cancelOnExit(dctx)
	defer stop()
	v.qmp, err = dialQMP(dctx, filepath.Join(sockDir, "qmp.sock"))
	if err != nil {
		v.Kill()
		return nil, v.withConsole(err)
	}
	conn, err := dialUnix(dctx, filepath.Join(sockDir, "ctl.sock"))
	if err != nil {
		v.Kill()
		return nil, v.withConsole(fmt.Errorf("control socket: %w", err))
	}
	chanLog, err := os.Create(filepath.Join(cfg.Dir, "channel.log"))
	if err != nil {
		v.Kill()
		return nil, err
	}
	v.ch = newChannel(conn, chanLog)
	return v, nil
}

func (v *VM) qemuArgs(layer string) []string {
	c := v.cfg
	accel, cpu := "tcg,thread=multi", "qemu64"
	if c.Accel == "kvm" {
		accel, cpu = "kvm", "host"
	}
	// qemu64 under TCG: with "max", Go code in the guest takes AVX2 paths
	// that TCG emulates slowly (a 20 MiB crio pull is 1.8× slower).
	cmdline := []string{"console=ttyS0", "root=/dev/vda", "rw", "loglevel=4", "panic=-1",
		"net.ifnames=0", "usb-storage.delay_use=0", "ferry.layer=/dev/vdb",
		"systemd.show_status=1", "systemd.journald.forward_to_console=0"}
	a := []string{"qemu-system-x86_64", "-name", c.Name, "-machine", "q35", "-accel", accel,
		"-cpu", cpu, "-smp", fmt.Sprint(c.CPUs), "-m", fmt.Sprint(c.MemoryMB),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", c.Image.Kernel, "-initrd", c.Image.Initrd,
		"-append", strings.Join(cmdline, " "),
		"-chardev", "file,id=con,path=" + filepath.Join(c.Dir, "console.log"), "-serial", "chardev:con",
		"-qmp", "unix:" + filepath.Join(v.sockDir, "qmp.sock") + ",server=on,wait=off",
		"-device", "virtio-serial-pci,id=vser",
		"-chardev", "socket,id=ctl,path=" + filepath.Join(v.sockDir, "ctl.sock") + ",server=on,wait=off",
		"-device", "virtserialport,bus=vser.0,chardev=ctl,name=" + ctl.PortName,
		"-device", "virtio-rng-pci",
		"-device", "qemu-xhci,id=xhci",
		"-drive", "file=" + c.Image.Rootfs + ",format=raw,if=virtio,snapshot=on,cache=unsafe",
		"-drive", "file=" + layer + ",format=raw,if=virtio,readonly=on",
	}
	if c.Net != nil {
		a = append(a, "-netdev", "stream,id=n0,server=off,addr.type=unix,addr.path="+c.Net.Hub.Path(),
			"-device", "virtio-net-pci,netdev=n0,mac="+c.Net.MAC)
	} else if c.API == "" {
		a = append(a, "-nic", "none")
	}
	if c.API != "" {
		host, port, _ := strings.Cut(APIAddr, ":")
		a = append(a, "-netdev", "user,id=api,restrict=on,ipv6=off,net=10.0.2.0/24,guestfwd=tcp:"+host+":"+port+"-cmd:socat STDIO UNIX-CONNECT:"+c.API,
			"-device", "virtio-net-pci,netdev=api")
	}
	return a
}

// cancelOnExit derives a context that ends when qemu exits.
func (v *VM) cancelOnExit(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		select {
		case <-v.exited:
			cancel(fmt.Errorf("qemu exited: %v", v.exitErr))
		case <-done:
		}
	}()
	return ctx, func() { close(done); cancel(nil) }
}

// BootInfo is how long a boot took.
type BootInfo struct {
	HostSeconds  float64 // qemu start to "ready" on the host's clock
	GuestUptime  float64 // guest uptime at "ready"
	SystemState  string  // systemctl is-system-running
	AgentSeconds float64 // qemu start to the control channel's first line
}

// WaitReady waits until systemd has finished booting the guest.
func (v *VM) WaitReady(ctx context.Context) (BootInfo, error) {
	ctx, stop := v.cancelOnExit(ctx)
	defer stop()
	up, err := v.ch.waitEvent(ctx, "up")
	if err != nil {
		return BootInfo{}, v.withConsole(fmt.Errorf("guest %s: control channel never came up: %w", v.cfg.Name, errors.Join(err, context.Cause(ctx))))
	}
	agent := time.Since(v.started).Seconds()
	_ = up
	r, err := v.ch.waitEvent(ctx, "ready")
	if err != nil {
		return BootInfo{}, v.withConsole(fmt.Errorf("guest %s: boot did not finish: %w", v.cfg.Name, errors.Join(err, context.Cause(ctx))))
	}
	return BootInfo{HostSeconds: time.Since(v.started).Seconds(), GuestUptime: r.Uptime,
		SystemState: r.State, AgentSeconds: agent}, nil
}

// Result is a guest command's outcome.
type Result = ctl.Response

// Run runs a shell command in the guest and returns its output and exit
// code; err is set only when the command could not be run or waited for.
func (v *VM) Run(ctx context.Context, cmd string) (Result, error) {
	ctx, stop := v.cancelOnExit(ctx)
	defer stop()
	timeout := 0
	if d, ok := ctx.Deadline(); ok {
		timeout = int(time.Until(d).Seconds()) + 1
	}
	r, err := v.ch.do(ctx, ctl.Request{Cmd: cmd, Timeout: timeout})
	if err != nil {
		return r, fmt.Errorf("guest %s: %q: %w", v.cfg.Name, cmd, errors.Join(err, context.Cause(ctx)))
	}
	if r.Err != "" && r.Code == -1 {
		return r, fmt.Errorf("guest %s: %q: %s", v.cfg.Name, cmd, r.Err)
	}
	return r, nil
}

// WriteFile writes a file in the guest (atomically, by rename).
func (v *VM) WriteFile(ctx context.Context, p string, data []byte, mode os.FileMode) error {
	r, err := v.ch.do(ctx, ctl.Request{Path: p, Data: data, Mode: uint32(mode)})
	if err == nil && r.Err != "" {
		err = errors.New(r.Err)
	}
	if err != nil {
		return fmt.Errorf("guest %s: write %s: %w", v.cfg.Name, p, err)
	}
	return nil
}

// PlugUSB hot-plugs a disk image as a USB stick on the xhci bus.
func (v *VM) PlugUSB(ctx context.Context, id, image string, readOnly bool) error {
	abs, err := filepath.Abs(image)
	if err != nil {
		return err
	}
	_, err = v.qmp.Execute(ctx, "blockdev-add", map[string]any{
		"node-name": "blk-" + id, "driver": "raw", "read-only": readOnly,
		"file": map[string]any{"driver": "file", "filename": abs, "read-only": readOnly},
	})
	if err != nil {
		return fmt.Errorf("plug %s: %w", id, err)
	}
	_, err = v.qmp.Execute(ctx, "device_add", map[string]any{
		"driver": "usb-storage", "id": "usb-" + id, "bus": "xhci.0", "drive": "blk-" + id, "removable": true,
	})
	if err != nil {
		return fmt.Errorf("plug %s: %w", id, err)
	}
	return nil
}

// PlugCDROM attaches image as a USB CD-ROM drive with the disc in it
// (usb-bot with a scsi-cd: /dev/srN in the guest), the way a server's BMC
// presents virtual media.
func (v *VM) PlugCDROM(ctx context.Context, id, image string) error {
	abs, err := filepath.Abs(image)
	if err != nil {
		return err
	}
	steps := []struct {
		cmd  string
		args map[string]any
	}{
		{"blockdev-add", map[string]any{"node-name": "blk-" + id, "driver": "raw", "read-only": true,
			"file": map[string]any{"driver": "file", "filename": abs, "read-only": true}}},
		// Hot-plugged detached, its drive added, then attached: a usb-bot
		// the guest enumerates before its drive exists shows no LUN.
		{"device_add", map[string]any{"driver": "usb-bot", "id": "usb-" + id, "bus": "xhci.0", "attached": false}},
		{"device_add", map[string]any{"driver": "scsi-cd", "id": "cd-" + id, "bus": "usb-" + id + ".0", "drive": "blk-" + id}},
		{"qom-set", map[string]any{"path": "usb-" + id, "property": "attached", "value": true}},
	}
	for _, s := range steps {
		if _, err := v.qmp.Execute(ctx, s.cmd, s.args); err != nil {
			return fmt.Errorf("plug %s: %s: %w", id, s.cmd, err)
		}
	}
	return nil
}

// UnplugUSB removes a stick plugged by PlugUSB and waits until QEMU has
// deleted the device.
func (v *VM) UnplugUSB(ctx context.Context, id string) error {
	dev := "usb-" + id
	if _, err := v.qmp.Execute(ctx, "device_del", map[string]any{"id": dev}); err != nil {
		return fmt.Errorf("unplug %s: %w", id, err)
	}
	_, err := v.qmp.WaitEvent(ctx, "DEVICE_DELETED", func(d json.RawMessage) bool {
		var e struct {
			Device string `json:"device"`
		}
		return json.Unmarshal(d, &e) == nil && e.Device == dev
	})
	if err != nil {
		return fmt.Errorf("unplug %s: %w", id, err)
	}
	if _, err := v.qmp.Execute(ctx, "blockdev-del", map[string]any{"node-name": "blk-" + id}); err != nil {
		return fmt.Errorf("unplug %s: %w", id, err)
	}
	return nil
}

// Name is the guest's name.
func (v *VM) Name() string { return v.cfg.Name }

// Kill ends qemu by its PID (SIGKILL) and waits for it. The root image is
// a snapshot, so nothing needs a clean shutdown.
func (v *VM) Kill() {
	v.killOnce.Do(func() {
		if v.cmd != nil && v.cmd.Process != nil {
			_ = v.cmd.Process.Signal(syscall.SIGKILL)
			<-v.exited
		}
		if v.qmp != nil {
			v.qmp.Close()
		}
		if v.ch != nil {
			v.ch.conn.Close()
		}
		if v.logf != nil {
			v.logf.Close()
		}
		os.RemoveAll(v.sockDir)
	})
}

// Console is the last n bytes of the guest's console (ttyS0).
func (v *VM) Console(n int) string {
	b, _ := os.ReadFile(filepath.Join(v.cfg.Dir, "console.log"))
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func (v *VM) withConsole(err error) error {
	q, _ := os.ReadFile(filepath.Join(v.cfg.Dir, "qemu.log"))
	return fmt.Errorf("%w\n--- qemu output:\n%s\n--- console tail (%s):\n%s", err, tail(q),
		filepath.Join(v.cfg.Dir, "console.log"), v.Console(3000))
}

// writeTar writes the layer as a tar for busybox tar in the initramfs,
// with parent directories first.
func (l Layer) writeTar(p string) error {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for name := range l {
		for d := path.Dir(name); d != "/" && d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var names []string
	for d := range dirs {
		names = append(names, d)
	}
	sort.Strings(names)
	mtime := time.Now()
	for _, d := range names {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "." + d + "/", Mode: 0o755, ModTime: mtime, Format: tar.FormatUSTAR}); err != nil {
			return err
		}
	}
	for _, name := range sortedKeys(l) {
		f := l[name]
		if !strings.HasPrefix(name, "/") {
			return fmt.Errorf("layer path %q is not absolute", name)
		}
		h := &tar.Header{Name: "." + name, ModTime: mtime, Mode: int64(f.Mode), Format: tar.FormatUSTAR}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if f.Link != "" {
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.Link, 0o777
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if _, err := tw.Write(f.Data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	// a whole number of 512-byte sectors plus room: the guest reads a block device
	for buf.Len()%(64<<10) != 0 {
		buf.WriteByte(0)
	}
	return os.WriteFile(p, buf.Bytes(), 0o644)
}
