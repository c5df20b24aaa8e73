package agenttest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/udevenv"
)

// longestGap is the longest time without a WATCHDOG=1 ping between from
// and to.
func (n *notifySocket) longestGap(from, to time.Time) time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	last, gap := from, time.Duration(0)
	for i, p := range n.at {
		if p.Before(from) || p.After(to) || !strings.Contains(n.msgs[i], "WATCHDOG=1") {
			continue
		}
		gap = max(gap, p.Sub(last))
		last = p
	}
	return max(gap, to.Sub(last))
}

func dropCaches(t *testing.T, dev string) {
	exec.Command("blockdev", "--flushbufs", dev).Run()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200); err != nil {
		t.Fatalf("drop caches: %v", err)
	}
}

// TestAgent_RawStickOfTheHeldBundleNeverStallsTheWatchdog plugs a raw
// stick that takes more than a minute to read (systemd's watchdog is 60 s)
// while its bundle is already held, and starts the agent again with the
// stick still in: the whole read runs off the main loop, the watchdog is
// pinged throughout, the agent never restarts, and it says the stick holds
// the bundle already here.
func TestAgent_RawStickOfTheHeldBundleNeverStallsTheWatchdog(t *testing.T) {
	udevenv.Require(t)
	tarPath, digest := mediumBundle(t)
	tb, err := os.ReadFile(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	img := udevenv.RawImage(t, udevenv.File{Name: "raw", Data: tb})
	// ~70 s for the whole tar.
	rate := len(tb) / 70
	const watchdog = 20 * time.Second // pings every 10 s

	cfg := ferryenv.Config(t.TempDir())
	notify := newNotifySocket(t)
	a := ferryenv.Start(t, cfg, "NOTIFY_SOCKET="+notify.path,
		fmt.Sprintf("WATCHDOG_USEC=%d", watchdog.Microseconds()))
	a.WaitPhase(bound, "idle")
	if out, err := a.Ferry("load", tarPath); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	a.WaitPhase(bound, agent.PhaseExtracted)

	// From here on the agent runs in a cgroup that reads the next loop
	// device (the stick to come) at a capped rate.
	next := udevenv.Run(t, "losetup", "-f")
	a.Stop()
	a.Prefix = udevenv.CapReads(t, next, int64(rate)).Prefix()
	t.Cleanup(a.Stop) // before the cgroup goes: it cannot while the agent is in it
	a.Restart()
	a.WaitPhase(bound, agent.PhaseExtracted)

	// The stick is attached here, not in a subtest: its cleanup detaches it.
	if loop := udevenv.Attach(t, img); loop.Dev != next {
		t.Fatalf("the stick is %s, the throttle is on %s", loop.Dev, next)
	}
	for _, run := range []string{"plugged while the bundle is held", "present when the agent starts"} {
		if run == "present when the agent starts" {
			a.Stop()
			dropCaches(t, next)
			a.Restart()
		}
		start := time.Now()
		s := a.Wait(3*time.Minute, run+": the stick to be recognised", func(s agent.Status) bool {
			return strings.Contains(s.Notice, "bundle already held")
		})
		took := time.Since(start)
		if took < 60*time.Second {
			t.Fatalf("%s: the read took %s: the throttle did not hold, nothing was proven", run, took)
		}
		if gap := notify.longestGap(start, time.Now()); gap > watchdog {
			t.Fatalf("%s: no watchdog ping for %s during the read (watchdog %s)", run, gap, watchdog)
		}
		select {
		case <-a.Exited():
			t.Fatalf("%s: the agent exited during the read", run)
		default:
		}
		if s.Phase != string(agent.PhaseExtracted) || s.Digest != digest || s.Error != "" {
			t.Fatalf("%s: status after the read: %+v", run, s)
		}
		t.Logf("%s: read the %d-byte stick in %s, watchdog pinged throughout", run, len(tb), took.Round(time.Second))
	}
}
