package vm

import (
	"archive/tar"
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/test/vm/ctl"
)

// These tests need no qemu and no root: they pin down the harness's own
// logic against fakes.

func TestModuleClosure_BringsDependenciesAndNothingElse(t *testing.T) {
	dir := t.TempDir()
	dep := "kernel/drivers/usb/storage/usb-storage.ko: kernel/drivers/usb/core/usbcore.ko kernel/drivers/scsi/scsi_mod.ko\n" +
		"kernel/drivers/usb/core/usbcore.ko: kernel/drivers/usb/common/usb-common.ko\n" +
		"kernel/drivers/usb/common/usb-common.ko:\n" +
		"kernel/drivers/scsi/scsi_mod.ko: kernel/drivers/scsi/scsi_common.ko\n" +
		"kernel/drivers/scsi/scsi_common.ko:\n" +
		"kernel/sound/core/snd.ko:\n"
	p := filepath.Join(dir, "modules.dep")
	if err := os.WriteFile(p, []byte(dep), 0o644); err != nil {
		t.Fatal(err)
	}
	deps, err := readModulesDep(p)
	if err != nil {
		t.Fatal(err)
	}
	got := moduleClosure(deps, regexp.MustCompile(`^kernel/drivers/usb/storage/`))
	want := []string{
		"kernel/drivers/scsi/scsi_common.ko", "kernel/drivers/scsi/scsi_mod.ko",
		"kernel/drivers/usb/common/usb-common.ko", "kernel/drivers/usb/core/usbcore.ko",
		"kernel/drivers/usb/storage/usb-storage.ko",
	}
	if !slices.Equal(got, want) {
		t.Errorf("closure = %v, want %v", got, want)
	}
}

func TestGuestModules_CoverWhatTheScenariosNeed(t *testing.T) {
	for _, m := range []string{
		"kernel/drivers/usb/storage/usb-storage.ko", "kernel/drivers/usb/host/xhci-pci.ko",
		"kernel/fs/overlayfs/overlay.ko", "kernel/fs/fat/vfat.ko", "kernel/fs/nls/nls_cp437.ko",
		"kernel/fs/ext4/ext4.ko", "kernel/drivers/char/virtio_console.ko", "kernel/drivers/net/virtio_net.ko",
		"kernel/fs/isofs/isofs.ko", "kernel/fs/exfat/exfat.ko", "kernel/drivers/block/loop.ko",
	} {
		if !guestModules.MatchString(m) {
			t.Errorf("guest image would lack %s", m)
		}
	}
	if guestModules.MatchString("kernel/sound/core/snd.ko") {
		t.Error("guest image would carry sound drivers")
	}
}

func TestLayer_TarHasParentDirectoriesFirstModesAndLinks(t *testing.T) {
	p := filepath.Join(t.TempDir(), "layer.tar")
	l := Layer{
		"/usr/bin/ferry":    {Data: []byte("#!bin"), Mode: 0o755},
		"/etc/ferry/a.toml": {Data: []byte("x = 1\n"), Mode: 0o600},
		"/etc/systemd/system/multi-user.target.wants/ferry.service": {Link: "/etc/systemd/system/ferry.service"},
	}
	if err := l.writeTar(p); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(data)%512 != 0 {
		t.Errorf("layer is %d bytes, not whole sectors", len(data))
	}
	tr := tar.NewReader(bytes.NewReader(data))
	seen := map[string]*tar.Header{}
	var order []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seen[h.Name] = h
		order = append(order, h.Name)
	}
	for _, d := range []string{"./etc/", "./etc/ferry/", "./usr/", "./usr/bin/", "./etc/systemd/system/multi-user.target.wants/"} {
		h := seen[d]
		if h == nil || h.Typeflag != tar.TypeDir {
			t.Errorf("no directory entry %s (entries %v)", d, order)
		}
	}
	if i, j := slices.Index(order, "./etc/ferry/"), slices.Index(order, "./etc/ferry/a.toml"); i < 0 || i > j {
		t.Errorf("directory after its file: %v", order)
	}
	if h := seen["./usr/bin/ferry"]; h == nil || h.Mode != 0o755 {
		t.Errorf("ferry binary header %+v, want mode 0755", h)
	}
	if h := seen["./etc/ferry/a.toml"]; h == nil || h.Mode != 0o600 {
		t.Errorf("config header %+v, want mode 0600", h)
	}
	if h := seen["./etc/systemd/system/multi-user.target.wants/ferry.service"]; h == nil ||
		h.Typeflag != tar.TypeSymlink || h.Linkname != "/etc/systemd/system/ferry.service" {
		t.Errorf("wants link header %+v", h)
	}
}

func TestLayer_RefusesRelativePaths(t *testing.T) {
	if err := (Layer{"etc/x": {}}).writeTar(filepath.Join(t.TempDir(), "l.tar")); err == nil {
		t.Error("a relative layer path was accepted")
	}
}

func TestHub_RepeatsEachFrameToEveryOtherGuestOnly(t *testing.T) {
	h, err := NewHub()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	conns := make([]net.Conn, 3)
	for i := range conns {
		c, err := net.Dial("unix", h.Path())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	// wait until the hub has all three ports
	for deadline := time.Now().Add(5 * time.Second); ; {
		h.mu.Lock()
		n := len(h.ports)
		h.mu.Unlock()
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hub has %d ports", n)
		}
		time.Sleep(time.Millisecond)
	}
	frame := []byte("ethernet frame from guest 0")
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(frame)))
	if _, err := conns[0].Write(append(hdr[:], frame...)); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns[1:] {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got := make([]byte, 4+len(frame))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[4:], frame) || binary.BigEndian.Uint32(got[:4]) != uint32(len(frame)) {
			t.Errorf("received %q", got)
		}
	}
	conns[0].SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := conns[0].Read(make([]byte, 64)); err == nil {
		t.Errorf("the sender got its own frame back (%d bytes)", n)
	}
}

// fakeQEMU answers QMP on a unix socket: the greeting, a reply per command
// (an error for "device_del"), and an event after "device_add".
func fakeQEMU(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.Listen("unix", p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			var m struct {
				Execute string `json:"execute"`
				ID      string `json:"id"`
			}
			json.Unmarshal(sc.Bytes(), &m)
			switch m.Execute {
			case "device_del":
				c.Write([]byte(`{"error": {"class": "DeviceNotFound", "desc": "Device 'x' not found"}, "id": "` + m.ID + `"}` + "\n"))
			case "device_add":
				c.Write([]byte(`{"event": "DEVICE_DELETED", "data": {"device": "other"}}` + "\n"))
				c.Write([]byte(`{"event": "DEVICE_DELETED", "data": {"device": "usb-s1"}}` + "\n"))
				c.Write([]byte(`{"return": {}, "id": "` + m.ID + `"}` + "\n"))
			default:
				c.Write([]byte(`{"return": {}, "id": "` + m.ID + `"}` + "\n"))
			}
		}
	}()
	return p
}

func TestQMP_RepliesErrorsAndEvents(t *testing.T) {
	ctx := t.Context()
	q, err := dialQMP(ctx, fakeQEMU(t))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if _, err := q.Execute(ctx, "device_del", map[string]any{"id": "x"}); !errors.Is(err, ErrQMP) || !strings.Contains(err.Error(), "DeviceNotFound") {
		t.Errorf("device_del error = %v, want ErrQMP naming DeviceNotFound", err)
	}
	if _, err := q.Execute(ctx, "device_add", nil); err != nil {
		t.Fatal(err)
	}
	ev, err := q.WaitEvent(ctx, "DEVICE_DELETED", func(d json.RawMessage) bool { return strings.Contains(string(d), "usb-s1") })
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ev.Data), "usb-s1") {
		t.Errorf("event %s", ev.Data)
	}
	// the non-matching event is still there for whoever wants it
	if _, err := q.WaitEvent(ctx, "DEVICE_DELETED", nil); err != nil {
		t.Error(err)
	}
}

func TestChannel_MatchesResponsesByIDAndKeepsEvents(t *testing.T) {
	host, guest := net.Pipe()
	defer host.Close()
	c := newChannel(host, io.Discard)
	go func() { // a guest that answers in reverse order, after an event
		r := bufio.NewScanner(guest)
		var reqs []ctl.Request
		for len(reqs) < 2 && r.Scan() {
			var q ctl.Request
			json.Unmarshal(r.Bytes(), &q)
			reqs = append(reqs, q)
		}
		enc := json.NewEncoder(guest)
		enc.Encode(ctl.Response{Event: "ready", State: "running"})
		for i := len(reqs) - 1; i >= 0; i-- {
			enc.Encode(ctl.Response{ID: reqs[i].ID, Stdout: reqs[i].Cmd, Code: i})
		}
		guest.Close()
	}()
	type res struct {
		r   ctl.Response
		err error
	}
	out := make(chan res, 2)
	for _, cmd := range []string{"first", "second"} {
		go func() {
			r, err := c.do(t.Context(), ctl.Request{Cmd: cmd})
			out <- res{r, err}
		}()
	}
	for range 2 {
		x := <-out
		if x.err != nil {
			t.Fatal(x.err)
		}
		if x.r.Stdout != "first" && x.r.Stdout != "second" {
			t.Errorf("response %+v", x.r)
		}
	}
	ev, err := c.waitEvent(t.Context(), "ready")
	if err != nil || ev.State != "running" {
		t.Errorf("ready event %+v, %v", ev, err)
	}
	// the guest went away: a new request fails instead of hanging
	if _, err := c.waitEvent(t.Context(), "never"); err == nil {
		t.Error("waiting on a closed channel did not fail")
	}
}

func TestMakeRawStick_TarAtZeroThenZerosToWholeMiB(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "b.tar")
	payload := bytes.Repeat([]byte{0xab}, 3*512)
	if err := os.WriteFile(src, payload, 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "stick.img")
	if err := MakeRawStick(img, src); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if len(data)%(1<<20) != 0 || len(data) < len(payload) {
		t.Errorf("stick is %d bytes, want whole MiB", len(data))
	}
	if !bytes.Equal(data[:len(payload)], payload) || bytes.ContainsFunc(data[len(payload):], func(r rune) bool { return r != 0 }) {
		t.Error("stick is not the tar followed by zeros")
	}
}

func TestMirrorsConf_MapsEachRepositoryToItsBundlePath(t *testing.T) {
	got := mirrorsConf([]string{
		"quay.io/openshift-release-dev/ocp-release@sha256:" + strings.Repeat("a", 64),
		"quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + strings.Repeat("b", 64),
	}, "127.0.0.1:5999")
	for _, want := range []string{
		`prefix = "quay.io/openshift-release-dev/ocp-release"`,
		`location = "127.0.0.1:5999/openshift-release-dev/ocp-v4.0-art-dev"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("registries.conf lacks %s:\n%s", want, got)
		}
	}
}
