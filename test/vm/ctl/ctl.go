// Package ctl is the wire format of the test harness's control channel: JSON
// lines over a virtio-serial port between the host (test/vm) and the guest
// service (test/vm/guestagent). Each request gets exactly one response with
// the same ID; the guest also sends unsolicited events (ID 0).
package ctl

// PortName is the virtio-serial port name; the guest sees it as
// /dev/virtio-ports/ferry.ctl.
const PortName = "ferry.ctl"

// Request asks the guest to run Cmd with /bin/sh -c, or to write a file when
// Path is set.
type Request struct {
	ID      uint64 `json:"id"`
	Cmd     string `json:"cmd,omitempty"`
	Timeout int    `json:"timeout,omitempty"` // seconds; 0 means no limit
	// Path, Data and Mode write a file (created or replaced atomically).
	Path string `json:"path,omitempty"`
	Data []byte `json:"data,omitempty"`
	Mode uint32 `json:"mode,omitempty"`
}

// Response is the outcome of one Request, or an Event when ID is 0.
type Response struct {
	ID     uint64 `json:"id"`
	Code   int    `json:"code"`
	Stdout string `json:"stdout,omitempty"`
	Stderr string `json:"stderr,omitempty"`
	Err    string `json:"err,omitempty"` // the command could not run at all
	// Seconds is how long the command took, measured in the guest.
	Seconds float64 `json:"seconds,omitempty"`

	Event string `json:"event,omitempty"` // "up", "ready"
	// Uptime is the guest's /proc/uptime at the event.
	Uptime float64 `json:"uptime,omitempty"`
	State  string  `json:"state,omitempty"` // systemctl is-system-running
}
