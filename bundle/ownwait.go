package bundle

import (
	"io"
	"time"

	"golang.org/x/sys/unix"
)

// waitMeter tells the pacer how long the extraction waited for its own IO
// (the source's reads, its creates, writes and writeback): the node's
// pressure stall information counts those waits like anyone else's, and a
// pacer that took them for the node's stall held ferry back on a quiet
// node (a synced extraction ran at a third of its speed). It times each
// call by the thread's CPU clock: wall time less CPU time is time spent
// off the CPU, waiting. A goroutine stays on its thread through a system
// call but may move between two calls, so a measure that ends on another
// thread is dropped (locking the goroutine to its thread instead made
// every hand-off to the hashing goroutine a thread switch: 12% slower).
// Waits on the hashing goroutine are not IO and are left out by timing
// only the system calls. A nil *waitMeter measures nothing.
type waitMeter struct {
	p interface{ Waited(d time.Duration) }
}

type waitStart struct {
	wall time.Time
	cpu  int64 // ns of the thread's CPU time
	tid  int
}

func threadCPU() int64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return ts.Nano()
}

func (m *waitMeter) start() waitStart {
	if m == nil {
		return waitStart{}
	}
	return waitStart{wall: time.Now(), cpu: threadCPU(), tid: unix.Gettid()}
}

// stop reports the time off the CPU since s.
func (m *waitMeter) stop(s waitStart) {
	if m == nil {
		return
	}
	off := time.Since(s.wall) - time.Duration(threadCPU()-s.cpu)
	if unix.Gettid() == s.tid && off > 0 {
		m.p.Waited(off)
	}
}

// meteredReader times a file's reads: a stick's reads stall on IO.
type meteredReader struct {
	r io.Reader
	m *waitMeter
}

func (r meteredReader) Read(p []byte) (int, error) {
	s := r.m.start()
	n, err := r.r.Read(p)
	r.m.stop(s)
	return n, err
}
