package bundle

import (
	"os"

	"golang.org/x/sys/unix"
)

// writeBehindWindow is how many bytes of a file an extraction that is
// synced at its end (Options.Sync) writes before it starts their
// writeback; it waits for that writeback one window later. A window is
// what stands in the disk's queue ahead of another process's fsync: with
// 8 MiB, etcd's p99.9 under a paced extraction doubled in one run; with
// 1 MiB it is as without write-behind, and unpaced it is 7 × lower.
const writeBehindWindow = 1 << 20

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
	written int64 // bytes written to the file
	started int64 // [0, started): writeback started
	waited  int64 // [0, waited): on disk
}

func newWriteBehind(f *os.File) *writeBehind { return &writeBehind{fd: int(f.Fd())} }

// wrote is told n more bytes were written.
func (w *writeBehind) wrote(n int) {
	w.written += int64(n)
	for w.written-w.started >= writeBehindWindow {
		syncRange(w.fd, w.started, writeBehindWindow, unix.SYNC_FILE_RANGE_WRITE)
		w.started += writeBehindWindow
		if back := w.started - writeBehindWindow; back > w.waited {
			syncRange(w.fd, w.waited, back-w.waited,
				unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
			w.waited = back
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
