// Package systemd is ferry's side of systemd: unit reloads over D-Bus
// (reload.go), sd_notify (READY=1, STATUS=, the watchdog) and logging to
// the journal with fields. Everything here is a no-op, or falls back to
// stderr, when ferry does not run under systemd.
package systemd

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Notify sends one sd_notify state ("READY=1", "STATUS=…") to the socket
// named by NOTIFY_SOCKET. Off systemd (no NOTIFY_SOCKET) it does nothing
// and returns nil.
func Notify(state string) error {
	if _, err := daemon.SdNotify(false, state); err != nil {
		return fmt.Errorf("sd_notify %s: %w", firstLine(state), err)
	}
	return nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// Ready tells systemd that ferry is up (READY=1): for a Type=notify unit,
// `systemctl start` returns then. A no-op off systemd.
func Ready() { _ = Notify(daemon.SdNotifyReady) }

// Stopping tells systemd that ferry is shutting down (STOPPING=1).
func Stopping() { _ = Notify(daemon.SdNotifyStopping) }

// Status sets the one line `systemctl status ferry` shows (STATUS=…). A
// no-op off systemd. Newlines become spaces: sd_notify is line-based.
func Status(format string, args ...any) {
	_ = Notify("STATUS=" + statusText(format, args...))
}

func statusText(format string, args ...any) string {
	s := format
	if len(args) > 0 {
		s = fmt.Sprintf(format, args...)
	}
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
}

// Notifier is Ready, Status and Stopping as methods, for code that takes
// them through an interface of its own.
type Notifier struct{}

func (Notifier) Ready()                            { Ready() }
func (Notifier) Stopping()                         { Stopping() }
func (Notifier) Status(format string, args ...any) { Status(format, args...) }

// Watchdog pings systemd's watchdog (WATCHDOG=1) every half of
// WATCHDOG_USEC, but only while healthy returns true, so that systemd
// restarts an agent that is stuck rather than one that is merely alive. It
// returns nil when ctx ends, and at once when the unit has no watchdog
// (WatchdogSec unset, or WATCHDOG_PID naming another process). Run it
// beside the agent in its errgroup.
func Watchdog(ctx context.Context, healthy func() bool, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timeout, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("systemd watchdog disabled: bad WATCHDOG_USEC from systemd", "err", err)
		return nil
	}
	if timeout <= 0 {
		return nil
	}
	every := timeout / 2
	log.Debug("pinging the systemd watchdog", "every", every)
	tick := time.NewTicker(every)
	defer tick.Stop()
	wasHealthy, failing := true, false
	for {
		if healthy() {
			if !wasHealthy {
				log.Info("healthy again: pinging the systemd watchdog")
			}
			wasHealthy = true
			if err := Notify(daemon.SdNotifyWatchdog); err != nil {
				if !failing {
					log.Warn("cannot ping the systemd watchdog", "err", err)
				}
				failing = true
			} else {
				failing = false
			}
		} else if wasHealthy {
			wasHealthy = false
			log.Warn("unhealthy: not pinging the systemd watchdog; systemd restarts ferry if this lasts", "timeout", timeout)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
