package systemd

import (
	"context"
	"errors"
	"fmt"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
)

// ErrReload marks a unit reload that systemd did not complete.
var ErrReload = errors.New("unit reload failed")

// unitConn is the part of go-systemd's D-Bus connection a reload uses.
type unitConn interface {
	ReloadUnitContext(ctx context.Context, name, mode string, ch chan<- string) (int, error)
	Close()
}

// UnitReloader reloads a unit over D-Bus (`systemctl reload UNIT`) and
// waits for systemd's job to finish. For crio.service that runs its
// ExecReload (SIGHUP); CRI-O then applies the new configuration
// asynchronously, so callers poll for its effect afterwards.
type UnitReloader struct {
	Unit string
	// dial opens a private connection to systemd; tests replace it.
	dial func(ctx context.Context) (unitConn, error)
}

// NewUnitReloader reloads unit ("crio.service") over a private connection
// to systemd (/run/systemd/private), opened for each reload.
func NewUnitReloader(unit string) *UnitReloader {
	return &UnitReloader{Unit: unit, dial: func(ctx context.Context) (unitConn, error) {
		return sddbus.NewSystemdConnectionContext(ctx)
	}}
}

// Reload asks systemd to reload the unit and waits for the job's result:
// nil for "done", ErrReload for any other result ("failed" when the unit
// is not running or its ExecReload failed, "canceled", "timeout", …), or
// the context's error.
func (r *UnitReloader) Reload(ctx context.Context) error {
	conn, err := r.dial(ctx)
	if err != nil {
		return fmt.Errorf("reload %s: cannot talk to systemd over D-Bus (is this a systemd host? set crio.reload = \"signal\" otherwise): %w", r.Unit, err)
	}
	defer conn.Close()
	ch := make(chan string, 1) // buffered: go-systemd must not block if we have given up
	if _, err := conn.ReloadUnitContext(ctx, r.Unit, "replace", ch); err != nil {
		return fmt.Errorf("%w: %s: %v (is the unit running? systemctl status %s)", ErrReload, r.Unit, err, r.Unit)
	}
	select {
	case res := <-ch:
		if res != "done" {
			return fmt.Errorf("%w: %s: job %s (see systemctl status %s and journalctl -u %s)", ErrReload, r.Unit, res, r.Unit, r.Unit)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("reload %s: %w", r.Unit, ctx.Err())
	}
}
