package agent

import (
	"context"
	"github.com/ferry-edge/ferry/agent/machine"
	"os"
	"syscall"
	"time"
)

// runtimePoll is how often CRI-O's socket is looked at: a stat, nothing
// asked of CRI-O.
const runtimePoll = 5 * time.Second

// watchRuntime asks the loop to check the running release's images in
// CRI-O (evRuntimeCheck) once at start, each time CRI-O restarts (its
// socket is made anew: another inode) and every interval (0: never). A
// CRI-O that repaired its storage after an unclean stop has just
// restarted, so that check comes within seconds.
func (a *Agent) watchRuntime(ctx context.Context, poll, interval time.Duration) {
	sock := a.cfg.CRIO.Socket
	last := socketID(sock)
	send := func(why string) bool {
		select {
		case a.events <- machine.EvRuntimeCheck{Why: why}:
			return true
		case <-ctx.Done():
			return false
		}
	}
	if !send("ferry started") {
		return
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	due := time.Now().Add(interval)
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			id := socketID(sock)
			switch {
			case id != last && id != (sockID{}):
				last = id
				if !send("CRI-O restarted") {
					return
				}
				due = now.Add(interval)
			case interval > 0 && now.After(due):
				if !send("periodic check") {
					return
				}
				due = now.Add(interval)
			default:
				last = id
			}
		}
	}
}

// sockID tells one socket file from the next made at the same path: a
// file system reuses a freed inode number at once, so its change time
// (nanoseconds) goes with it. The zero sockID: no socket.
type sockID struct {
	ino   uint64
	ctime syscall.Timespec
}

func socketID(path string) sockID {
	fi, err := os.Stat(path)
	if err != nil {
		return sockID{}
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return sockID{}
	}
	return sockID{st.Ino, st.Ctim}
}
