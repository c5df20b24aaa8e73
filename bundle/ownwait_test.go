package bundle

import (
	"testing"
	"time"
)

// Time off the CPU in a call is reported; a nil meter measures nothing.
func TestWaitMeter_ReportsTimeOffTheCPU(t *testing.T) {
	var got time.Duration
	m, unlock := newWaitMeter(func(d time.Duration) { got += d })
	defer unlock()
	s := m.start()
	time.Sleep(30 * time.Millisecond) // off the CPU, as a read from a slow stick
	m.stop(s)
	if got < 20*time.Millisecond || got > 2*time.Second {
		t.Errorf("a 30 ms sleep reported %v off the CPU", got)
	}

	none, unlockNone := newWaitMeter(nil)
	defer unlockNone()
	if none != nil {
		t.Fatal("no pacer: want no meter")
	}
	none.stop(none.start()) // must not panic
}
