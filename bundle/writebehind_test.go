package bundle

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// half is half a write-behind window, the unit recordSyncRange counts in.
const half = writeBehindWindow / 2

// recordSyncRange records the ranges writeBehind starts and waits for,
// in half windows.
func recordSyncRange(t *testing.T) *[]string {
	var calls []string
	old := syncRange
	syncRange = func(fd int, off, n int64, flags int) error {
		kind := "start"
		if flags&unix.SYNC_FILE_RANGE_WAIT_AFTER != 0 {
			kind = "wait"
		}
		calls = append(calls, fmt.Sprintf("%s %d+%d", kind, off/half, n/half))
		return nil
	}
	t.Cleanup(func() { syncRange = old })
	return &calls
}

// A file is written back window by window as it is written: each window's
// writeback starts once it is whole, the one before it is waited for, and
// the tail's starts at close.
func TestWriteBehind_StartsEachWindowAndWaitsForTheOneBefore(t *testing.T) {
	calls := recordSyncRange(t)
	f, err := os.Create(filepath.Join(t.TempDir(), "blob"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := newWriteBehind(f, nil)
	for range 7 { // three and a half windows, half a window a write
		w.wrote(half)
	}
	w.close()
	want := "start 0+2, start 2+2, wait 0+2, start 4+2, wait 2+2, start 6+1"
	if got := strings.Join(*calls, ", "); got != want {
		t.Fatalf("sync_file_range calls:\n got %s\nwant %s", got, want)
	}
}

// An extraction asked to sync writes its files back as it goes; one that
// is not (verify, a quick extract) leaves them to the kernel.
func TestExtract_SyncWritesBehindOnlyWhenAsked(t *testing.T) {
	for _, sync := range []bool{true, false} {
		t.Run(fmt.Sprint("sync=", sync), func(t *testing.T) {
			calls := recordSyncRange(t)
			src, _ := pacedBundle(t)
			if _, err := Extract(t.Context(), src, filepath.Join(t.TempDir(), "out"), Options{Policy: Policy{SpaceFactor: -1}, Sync: sync}); err != nil {
				t.Fatal(err)
			}
			if sync && len(*calls) == 0 {
				t.Fatal("a synced extraction started no writeback")
			}
			if !sync && len(*calls) != 0 {
				t.Fatalf("an extraction not asked to sync wrote back: %v", *calls)
			}
		})
	}
}
