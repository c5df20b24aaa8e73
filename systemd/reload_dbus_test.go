package systemd

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

// fakeManager is org.freedesktop.systemd1.Manager's ReloadUnit on a real
// bus: it answers with a job path and then signals JobRemoved, as systemd
// does.
type fakeManager struct {
	conn    *dbus.Conn
	result  string
	reloads atomic.Int32
	jobs    atomic.Uint32
}

func (m *fakeManager) ReloadUnit(name, mode string) (dbus.ObjectPath, *dbus.Error) {
	if name != "crio.service" {
		return "", dbus.NewError("org.freedesktop.systemd1.NoSuchUnit", []any{"Unit " + name + " not loaded."})
	}
	m.reloads.Add(1)
	id := m.jobs.Add(1)
	job := dbus.ObjectPath("/org/freedesktop/systemd1/job/" + strconv.Itoa(int(id)))
	go m.conn.Emit("/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager.JobRemoved", id, job, name, m.result)
	return job, nil
}

// startBus runs a private dbus-daemon and returns its address.
func startBus(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("dbus-daemon")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI: dbus-daemon missing: run bash test/setup/install-deps.sh")
		}
		t.Skip("skipped: dbus-daemon missing (apt-get install dbus)")
	}
	cmd := exec.Command(bin, "--session", "--nofork", "--nopidfile", "--print-address=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("dbus-daemon address: %v", err)
	}
	return strings.TrimSpace(line)
}

func serveManager(t *testing.T, addr, result string) *fakeManager {
	t.Helper()
	conn, err := dbus.Connect(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	m := &fakeManager{conn: conn, result: result}
	if err := conn.Export(m, "/org/freedesktop/systemd1", "org.freedesktop.systemd1.Manager"); err != nil {
		t.Fatal(err)
	}
	if r, err := conn.RequestName("org.freedesktop.systemd1", dbus.NameFlagDoNotQueue); err != nil || r != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("request name: %v %v", r, err)
	}
	return m
}

func busReloader(addr, unit string) *UnitReloader {
	return &UnitReloader{Unit: unit, dial: func(ctx context.Context) (unitConn, error) {
		return sddbus.NewConnection(func() (*dbus.Conn, error) { return dbus.Connect(addr, dbus.WithContext(ctx)) })
	}}
}

func TestUnitReloader_OverRealDBus(t *testing.T) {
	addr := startBus(t)
	t.Run("DoneJobIsSuccess", func(t *testing.T) {
		m := serveManager(t, addr, "done")
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		for range 3 {
			if err := busReloader(addr, "crio.service").Reload(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if n := m.reloads.Load(); n != 3 {
			t.Errorf("%d reloads reached the manager, want 3", n)
		}
	})
}

func TestUnitReloader_OverRealDBusFailures(t *testing.T) {
	addr := startBus(t)
	serveManager(t, addr, "failed")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := busReloader(addr, "crio.service").Reload(ctx); !errors.Is(err, ErrReload) || !strings.Contains(err.Error(), "job failed") {
		t.Errorf("failed job: got %v", err)
	}
	if err := busReloader(addr, "nope.service").Reload(ctx); !errors.Is(err, ErrReload) || !strings.Contains(err.Error(), "not loaded") {
		t.Errorf("unknown unit: got %v", err)
	}
}
