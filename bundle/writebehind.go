package bundle

import (
	"os"

	"golang.org/x/sys/unix"
)

// writeBehindWindow is how many bytes of a file an extraction that is
// synced at its end (Options.Sync) writes before it starts their
// writeback; it waits for that writeback one window later. A window is
// what stands in the disk's queue ahead of another process's fsync, and
// while paced, what reaches the disk at once (treeWriter.write): with
// 8 MiB, etcd's p99.9 under a paced extraction doubled in one run; with
// 1 MiB unpaced it is 7 × lower than without write-behind; 256 KiB
// halved the paced p99.9 again (N1, README).
const writeBehindWindow = 256 << 10

// syncRange is sync_file_range(2); a variable for the tests.
var syncRange = unix.SyncFileRange

// writeBehind writes a file back to disk while it is written, as
// PostgreSQL's *_flush_after do: writeback of each window starts as soon
// as it is written, and the window before is waited for. Left to the
// kernel, gigabytes of an extraction stay dirty until the sync at its end
// or the kernel's own flush, and an fsync of anyone else on the
// filesystem (etcd's WAL) can wait behind them in the journal; this way
// at most two windows a file are dirty, the final sync is short, and the
// extraction writes no faster than the disk takes it. Errors are
// ignored: the sync at the end is the one that counts.
type writeBehind struct {
	fd      int
	wait    *waitMeter // times the waits for the pacer; may be nil
	written int64      // bytes written to the file
	started int64      // [0, started): writeback started
	done    int64      // [0, done): on disk
}

func newWriteBehind(f *os.File, wait *waitMeter) *writeBehind {
	return &writeBehind{fd: int(f.Fd()), wait: wait}
}

// wrote is told n more bytes were written.
func (w *writeBehind) wrote(n int) {
	w.written += int64(n)
	for w.written-w.started >= writeBehindWindow {
		syncRange(w.fd, w.started, writeBehindWindow, unix.SYNC_FILE_RANGE_WRITE)
		w.started += writeBehindWindow
		if back := w.started - writeBehindWindow; back > w.done {
			s := w.wait.start()
			syncRange(w.fd, w.done, back-w.done,
				unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
			w.wait.stop(s)
			w.done = back
		}
	}
}

// close starts the writeback of what is left, before the file is closed.
func (w *writeBehind) close() {
	if w.written > w.started {
		syncRange(w.fd, w.started, w.written-w.started, unix.SYNC_FILE_RANGE_WRITE)
		w.started = w.written
	}
}
