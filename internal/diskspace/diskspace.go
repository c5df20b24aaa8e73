// Package diskspace answers "is there room?" the one way ferry asks it:
// free bytes for an unprivileged writer (statfs f_bavail), one sentinel
// for "no", and sizes written the way metadata.json writes them.
package diskspace

import (
	"fmt"
	"math"

	"golang.org/x/sys/unix"

	"github.com/ferry-edge/ferry/internal/room"
)

// ErrNoSpace means a filesystem lacks the room something needs: room's,
// which the agent's state machine tells refusals by.
var ErrNoSpace = room.ErrNoSpace

// Free is the space available in the filesystem holding path.
func Free(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, fmt.Errorf("checking free space in %s: %w", path, err)
	}
	if st.Bsize <= 0 {
		return 0, nil
	}
	if st.Bavail > uint64(math.MaxInt64/st.Bsize) {
		return math.MaxInt64, nil
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// Check returns ErrNoSpace, saying how much is free and needed and what
// to do (fix), when the filesystem holding path has less than need free.
func Check(path string, need int64, fix string) error {
	free, err := Free(path)
	if err != nil {
		return err
	}
	if free < need {
		return fmt.Errorf("%w in %s: %s free, %s needed: %s", ErrNoSpace, path, Human(free), Human(need), fix)
	}
	return nil
}

// Human formats n bytes as metadata's size field does ("16 GiB").
func Human(n int64) string { return room.Human(n) }
