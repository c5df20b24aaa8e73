package bundle

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// waitRecorder is a pacer's side of the meter.
type waitRecorder struct{ waited time.Duration }

func (r *waitRecorder) Waited(d time.Duration) { r.waited += d }

// Time off the CPU in a system call is reported; a nil meter measures
// nothing.
func TestWaitMeter_ReportsTimeOffTheCPU(t *testing.T) {
	r := &waitRecorder{}
	m := &waitMeter{p: r}
	s := m.start()
	ts := unix.NsecToTimespec(int64(30 * time.Millisecond))
	unix.Nanosleep(&ts, nil) // a system call off the CPU, as a read from a slow stick
	m.stop(s)
	if r.waited < 20*time.Millisecond || r.waited > 2*time.Second {
		t.Errorf("a 30 ms sleep in a system call reported %v off the CPU", r.waited)
	}

	var none *waitMeter
	none.stop(none.start()) // must not panic
}
