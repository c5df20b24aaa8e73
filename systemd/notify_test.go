package systemd

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// notifySocket listens on a real unixgram socket and points NOTIFY_SOCKET
// at it, as systemd does for a Type=notify unit.
func notifySocket(t *testing.T) *net.UnixConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return conn
}

// next reads one datagram, failing the test if none arrives before ctx
// ends.
func next(t *testing.T, ctx context.Context, conn *net.UnixConn) string {
	t.Helper()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(dl)
	}
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("no sd_notify message: %v", err)
	}
	return string(buf[:n])
}

func TestReadyAndStatus_SendToNotifySocket(t *testing.T) {
	conn := notifySocket(t)
	ctx := t.Context()

	Ready()
	if got := next(t, ctx, conn); got != "READY=1" {
		t.Errorf("Ready sent %q", got)
	}
	Status("verifying %s: %d%% (%s)", "upgrade-4.13.7-x86_64.tar", 42, "6.7/16.0 GiB")
	if got, want := next(t, ctx, conn), "STATUS=verifying upgrade-4.13.7-x86_64.tar: 42% (6.7/16.0 GiB)"; got != want {
		t.Errorf("Status sent %q, want %q", got, want)
	}
	Status("rejected upgrade-4.13.7-x86_64.tar: sha256 mismatch\ncopy the bundle again")
	if got, want := next(t, ctx, conn), "STATUS=rejected upgrade-4.13.7-x86_64.tar: sha256 mismatch copy the bundle again"; got != want {
		t.Errorf("multi-line Status sent %q, want one line %q", got, want)
	}
	Notifier{}.Stopping()
	if got := next(t, ctx, conn); got != "STOPPING=1" {
		t.Errorf("Stopping sent %q", got)
	}
}

func TestNotify_NoOpOffSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	os.Unsetenv("NOTIFY_SOCKET")
	if err := Notify("READY=1"); err != nil {
		t.Fatalf("Notify without NOTIFY_SOCKET: %v", err)
	}
	Ready()
	Status("x")
}

func TestNotify_ReportsAMissingSocket(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "gone.sock"))
	if err := Notify("READY=1"); err == nil {
		t.Fatal("Notify to a missing socket returned nil")
	}
}

func TestWatchdog_PingsOnlyWhileHealthy(t *testing.T) {
	conn := notifySocket(t)
	t.Setenv("WATCHDOG_USEC", "20000") // ping every 10 ms
	t.Setenv("WATCHDOG_PID", "")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	var healthy atomic.Bool
	var unhealthyChecks atomic.Int32
	checked := make(chan struct{}, 100)
	done := make(chan error, 1)
	go func() {
		done <- Watchdog(ctx, func() bool {
			h := healthy.Load()
			if !h {
				unhealthyChecks.Add(1)
			}
			select {
			case checked <- struct{}{}:
			default:
			}
			return h
		}, nil)
	}()

	// Unhealthy for three checks: nothing may be sent.
	for unhealthyChecks.Load() < 3 {
		select {
		case <-checked:
		case <-ctx.Done():
			t.Fatal("watchdog never asked for health")
		}
	}
	conn.SetReadDeadline(time.Now())
	buf := make([]byte, 64)
	if n, err := conn.Read(buf); err == nil {
		t.Fatalf("watchdog pinged while unhealthy: %q", buf[:n])
	} else if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Time{})

	healthy.Store(true)
	for i := 0; i < 2; i++ {
		if got := next(t, t.Context(), conn); got != "WATCHDOG=1" {
			t.Fatalf("watchdog sent %q, want WATCHDOG=1", got)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Watchdog returned %v when its context ended", err)
	}
}

func TestWatchdog_ReturnsAtOnceWithoutWatchdog(t *testing.T) {
	for name, env := range map[string][2]string{
		"no WATCHDOG_USEC":         {"", ""},
		"watchdog for another pid": {"20000", "1"},
		"malformed WATCHDOG_USEC":  {"soon", ""},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("WATCHDOG_USEC", env[0])
			t.Setenv("WATCHDOG_PID", env[1])
			called := false
			// t.Context never ends during the test: returning proves it
			// did not loop.
			if err := Watchdog(t.Context(), func() bool { called = true; return true }, nil); err != nil {
				t.Fatal(err)
			}
			if called {
				t.Error("health was checked although no watchdog is set")
			}
		})
	}
}
