// Package udev watches block devices: udev's events over netlink, a scan
// of the devices present at start, and what kind of device each is
// (Kinds). Opening what a device holds is package media's.
package udev

import (
	"context"
	"fmt"
)

// Action is what happened to a block device.
type Action string

const (
	// Add: a device appeared (a USB stick, its partitions). The startup
	// scan reports every present device as Add too.
	Add Action = "add"
	// Change: a device's medium changed. A loop device reports Change with
	// FSType when an image is attached, and Change with Size 0 when it is
	// detached.
	Change Action = "change"
	// Remove: a device is gone (a USB stick pulled).
	Remove Action = "remove"
)

// Event is one block device event.
type Event struct {
	Action  Action
	DevPath string // device node, "/dev/loop3", "/dev/sdb1"
	DevType string // "disk" or "partition"
	FSType  string // ID_FS_TYPE: "vfat", "ext4", …; "" when udev found none
	Label   string // ID_FS_LABEL
	// Size in bytes, read from sysfs when the event is received; 0 for
	// Remove, for a detached loop device, and when the device already
	// holds a newer medium than the event's (DiskSeq moved on).
	Size  int64
	Major uint32
	Minor uint32
	// DiskSeq is the kernel's diskseq: it changes whenever a new medium
	// appears on the same device node (0 when the kernel has none).
	DiskSeq uint64
	// Scanned marks events made by the startup scan rather than by udev.
	Scanned bool
}

// Gone reports whether the event means the medium is no longer there: a
// Remove, or a Change that left the device empty (loop device detached,
// card reader emptied).
func (e Event) Gone() bool { return e.Action == Remove || e.Size == 0 }

func (e Event) String() string {
	s := fmt.Sprintf("%s %s", e.Action, e.DevPath)
	if e.FSType != "" {
		s += " fs=" + e.FSType
	}
	if e.Label != "" {
		s += fmt.Sprintf(" label=%q", e.Label)
	}
	return s + fmt.Sprintf(" size=%d", e.Size)
}

// Source delivers block device events until its context ends. The agent
// declares the same shape where it uses it; Monitor is the real one and
// Fake the one for unit tests.
type Source interface {
	Events(ctx context.Context) (<-chan Event, error)
}

var (
	_ Source = (*Monitor)(nil)
	_ Source = (*Fake)(nil)
)

// Fake is a Source that replays Initial, then whatever is sent to Send,
// until the context ends. Only one Events call at a time.
type Fake struct {
	Initial []Event
	ch      chan Event
}

// NewFake returns a Fake that first emits initial.
func NewFake(initial ...Event) *Fake {
	return &Fake{Initial: initial, ch: make(chan Event)}
}

// Send hands ev to the running Events loop; it blocks until taken or ctx ends.
func (f *Fake) Send(ctx context.Context, ev Event) error {
	select {
	case f.ch <- ev:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Events implements Source.
func (f *Fake) Events(ctx context.Context) (<-chan Event, error) {
	out := make(chan Event)
	go func() {
		defer close(out)
		for _, ev := range f.Initial {
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
		for {
			select {
			case ev := <-f.ch:
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}
