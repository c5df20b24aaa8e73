package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
)

// Peak figures a real load must stay under. packaging/ferry.service sets
// MemoryHigh and MemoryMax with a margin over what this test measures
// (its comment has the figures): if these fail, measure again and move
// the unit's limits with them.
const (
	maxAgentHWM     = 256 << 20 // bytes of VmHWM
	maxAgentThreads = 64
)

// The agent's memory and threads in a real load, at two bundle sizes:
// `ferry load` of a bundle, verified, extracted, served to a real CRI-O
// and pinned. The peak RSS (VmHWM) and peak threads stay far under the
// unit's limits, and the extraction streams: eight times the bytes do not
// cost eight times the memory. FERRY_MEMORY_IMAGE_MIB sets the larger
// bundle's image size (default 16 MiB each, 30 images: ~480 MiB);
// FERRY_MEMORY_PULL_WORKERS the load's workers (default: from the cores),
// and GOMAXPROCS, passed on to the agent, stands in for a bigger node.
func TestHost_AgentMemoryBoundedWhateverTheBundleSize(t *testing.T) {
	big := int64(16)
	if n, err := strconv.Atoi(os.Getenv("FERRY_MEMORY_IMAGE_MIB")); err == nil && n > 0 {
		big = int64(n)
	}
	var small, large peak
	t.Run("2MiB-images", func(t *testing.T) { small = loadAndMeasure(t, 30, 2<<20) })
	t.Run(fmt.Sprintf("%dMiB-images", big), func(t *testing.T) { large = loadAndMeasure(t, 30, big<<20) })
	if t.Failed() {
		return
	}
	t.Logf("peak RSS %d MiB / %d threads with 30×2 MiB images; %d MiB / %d threads with 30×%d MiB",
		small.hwm>>20, small.threads, large.hwm>>20, large.threads, big)
	// Streaming: the larger bundle may cost a little more (bigger
	// buffers in flight, more pages touched by the hash), never in
	// proportion to its size.
	if large.hwm > 2*small.hwm+32<<20 {
		t.Errorf("peak RSS grew with the bundle: %d MiB for %d MiB images, %d MiB for 2 MiB images",
			large.hwm>>20, big, small.hwm>>20)
	}
}

type peak struct {
	hwm     int64 // bytes
	threads int64
}

// loadAndMeasure loads a bundle of n images of size bytes into a real
// CRI-O with a fresh agent, and returns the agent's peak RSS and threads.
func loadAndMeasure(t *testing.T, n int, size int64) peak {
	c := crioenv.Start(t)
	tarPath, meta := makeBundle(t, n, size)
	fi, err := os.Stat(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg := nodeConfig(t, c)
	// Only ferry load: a loop device another test plugs on this host is
	// not taken for a stick in the middle of the measurement.
	cfg.Media.Detect = "manual"
	if n, err := strconv.Atoi(os.Getenv("FERRY_MEMORY_PULL_WORKERS")); err == nil && n > 0 {
		cfg.CRIO.PullWorkers = n
	}
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, "idle")
	pid := a.Cmd.Process.Pid

	// VmHWM is the process's own high-water mark; the threads are sampled.
	var threads atomic.Int64
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if v, ok := procStatus(pid, "Threads"); ok && v > threads.Load() {
				threads.Store(v)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	start := time.Now()
	if out, err := a.Ferry("load", tarPath); err != nil {
		cancel()
		<-done
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	a.WaitPhase(bound, agent.PhaseClusterReady)
	took := time.Since(start)
	hwm, ok := procStatus(pid, "VmHWM")
	cancel()
	<-done
	if !ok {
		t.Fatalf("no VmHWM for the agent (pid %d)", pid)
	}
	checkPinned(t, c.Client(t), refsOf(meta), true)
	p := peak{hwm: hwm << 10, threads: threads.Load()}
	t.Logf("bundle %d MiB (%d images of %d KiB), loaded in %s: agent peak RSS (VmHWM) %d MiB, peak threads %d",
		fi.Size()>>20, n, size>>10, took.Round(time.Second), p.hwm>>20, p.threads)
	if p.hwm > maxAgentHWM {
		t.Errorf("agent peak RSS %d MiB, over %d MiB", p.hwm>>20, maxAgentHWM>>20)
	}
	if p.threads > maxAgentThreads {
		t.Errorf("agent peak threads %d, over %d", p.threads, maxAgentThreads)
	}
	return p
}

// procStatus reads one number from /proc/PID/status (kB for sizes).
func procStatus(pid int, key string) (int64, bool) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != key {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			return 0, false
		}
		n, err := strconv.ParseInt(fields[0], 10, 64)
		return n, err == nil
	}
	return 0, false
}
