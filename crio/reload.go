package crio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"
)

// Reloader makes CRI-O read its configuration again. systemd.UnitReloader
// (D-Bus) and SignalReloader implement it.
type Reloader interface {
	Reload(ctx context.Context) error
}

// ErrNotRunning means there is no CRI-O process to signal.
var ErrNotRunning = errors.New("CRI-O is not running")

// SignalReloader sends SIGHUP to the CRI-O whose pid is in PidFile, for
// hosts without systemd.
type SignalReloader struct {
	PidFile string
}

// Reload implements Reloader. A missing pid file, a dead pid, or a pid
// that is not a crio process (a stale file) is ErrNotRunning.
func (s SignalReloader) Reload(context.Context) error {
	b, err := os.ReadFile(s.PidFile)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotRunning, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		return fmt.Errorf("%w: %s holds %q, not a pid", ErrNotRunning, s.PidFile, strings.TrimSpace(string(b)))
	}
	// SIGHUP kills a process that does not handle it: make sure the pid
	// is still CRI-O's.
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return fmt.Errorf("%w: pid %d from %s is gone", ErrNotRunning, pid, s.PidFile)
	}
	if c := strings.TrimSpace(string(comm)); !strings.HasPrefix(c, "crio") {
		return fmt.Errorf("%w: pid %d from %s is %q, not crio (stale pid file)", ErrNotRunning, pid, s.PidFile, c)
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("%w: pid %d from %s is gone", ErrNotRunning, pid, s.PidFile)
		}
		return fmt.Errorf("reload CRI-O: SIGHUP to pid %d: %w", pid, err)
	}
	return nil
}

// NoReload is the Reloader for crio.reload = "none": someone else reloads
// CRI-O; the loader still waits for the pins to show.
type NoReload struct{}

// Reload implements Reloader.
func (NoReload) Reload(context.Context) error { return nil }

// PinLister reports the pinned_images CRI-O runs with now. Client
// implements it with CRI-O's inspect endpoint; the loader uses it, when
// the image service has it, to see that a reload took effect.
type PinLister interface {
	PinnedImages(ctx context.Context) ([]string, error)
}

// PinnedImages implements PinLister: it reads the live configuration that
// CRI-O serves at /config on its socket (`crio status config`).
func (c *Client) PinnedImages(ctx context.Context) ([]string, error) {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", c.socket)
	}}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://crio/config", nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("%w: live config on %s: %v", ErrUnavailable, c.socket, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("CRI-O live config: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("CRI-O live config: %s", resp.Status)
	}
	var conf crioConf
	if _, err := toml.Decode(string(b), &conf); err != nil {
		return nil, fmt.Errorf("CRI-O live config: %w", err)
	}
	if conf.Crio.Image.PinnedImages == nil {
		return nil, nil
	}
	return *conf.Crio.Image.PinnedImages, nil
}
