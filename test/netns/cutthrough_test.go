package netns

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/test/bigbundle"
	"github.com/ferry-edge/ferry/test/udevenv"
)

// cutOptions shape one plug of a throttled stick into a fleet.
type cutOptions struct {
	Nodes     int
	Size      int64 // bundle bytes (bigbundle)
	StickRate int64 // the stick's read cap, bytes/s
	LinkRate  int64 // every link's cap, bytes/s each way
	Serial    bool  // peer.serial: no cut-through, for comparison
}

// cutRun is what one plug measured.
type cutRun struct {
	tarSize int64
	plugged time.Time
	// sourceDone: the stick's node verified and extracted it (its status).
	sourceDone time.Time
	// firstBytes: when each fetching node was first seen with bytes of
	// the bundle; done: when it had it extracted.
	firstBytes, done map[string]time.Time
	// peak: each fetching node's disk use under its state and extract
	// dirs, sampled every 100 ms.
	peak map[string]int64
	all  time.Duration // plug to every node extracted
}

// plugThrottledStick puts the bundle on a stick whose reads the stick's
// node (the first) gets at o.StickRate through its cgroup, plugs it (ferry
// load of the file on the mounted stick) and waits for every node to hold
// it extracted, sampling the others' progress and disk use meanwhile.
func plugThrottledStick(t testing.TB, o cutOptions) (cutRun, *fleet, string) {
	t.Helper()
	tarPath, err := bigbundle.Make(o.Size, bigBlob, os.TempDir()+"/ferry-test-bundles")
	if err != nil {
		t.Fatal(err)
	}
	digest := sidecarDigest(t, tarPath)
	fi, err := os.Stat(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	f := newFleet(t, fleetOptions{Nodes: o.Nodes, Rate: o.LinkRate, Setup: func(_ *Node, cfg *agent.Config) {
		cfg.Peer.Serial = o.Serial
		cfg.Media.Detect = "manual" // the stick is given with ferry load, never mounted by a node itself
	}})
	src, fetchers := f.nodes[0], f.nodes[1:]
	stick := NewStick(t, tarPath)
	udevenv.CapReads(t, stick.Dev, o.StickRate).Add(src.A.Cmd.Process.Pid)

	run := cutRun{tarSize: fi.Size(), firstBytes: map[string]time.Time{}, done: map[string]time.Time{}, peak: map[string]int64{}}
	var mu sync.Mutex
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	for _, n := range fetchers {
		wg.Go(func() { watchFetcher(ctx, n, &mu, &run) })
	}
	run.plugged = time.Now()
	src.load(t, stick.Tar)
	for _, n := range f.nodes {
		s := n.waitHolds(t, agent.PhaseExtracted, digest)
		mu.Lock()
		run.done[n.Name] = s.Times[agent.PhaseExtracted]
		mu.Unlock()
	}
	run.all = time.Since(run.plugged)
	stop()
	wg.Wait()
	run.sourceDone = run.done[src.Name]
	delete(run.done, src.Name)
	return run, f, digest
}

// fetchers is each fetching node's first bytes and extraction, in
// seconds after the plug, in the order they finished.
func (r cutRun) fetchers() string {
	names := slices.SortedFunc(maps.Keys(r.done), func(a, b string) int { return r.done[a].Compare(r.done[b]) })
	var parts []string
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %.1f/%.1f", n, r.firstBytes[n].Sub(r.plugged).Seconds(), r.done[n].Sub(r.plugged).Seconds()))
	}
	return strings.Join(parts, ", ")
}

// watchFetcher samples n's status and disk use until ctx ends.
func watchFetcher(ctx context.Context, n *anode, mu *sync.Mutex, run *cutRun) {
	// A walk of both trees a tick: every 100 ms is fine-grained enough
	// for a peak that moves at the link's rate (5 MB a tick at 50 MB/s)
	// and leaves the nodes their CPU.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		use := DiskUse(n.Cfg.Paths.StateDir, n.Cfg.Paths.ExtractDir)
		s, err := n.A.Status(ctx)
		now := time.Now()
		mu.Lock()
		run.peak[n.Name] = max(run.peak[n.Name], use)
		if _, seen := run.firstBytes[n.Name]; !seen && err == nil && s.Phase == string(agent.PhaseFetching) && s.Progress != nil && s.Progress.Done > 0 {
			run.firstBytes[n.Name] = now
		}
		mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// TestAgents_CutThroughFromAThrottledStick: the stick's node reads the
// bundle through its device capped at 32 MiB/s (cgroup blkio/io.max on a
// loop device), so its read takes ~8 s; the other two nodes start
// fetching before it has finished, every node ends with the same
// verified tree, and no fetching node ever uses more disk than the
// bundle plus peer.StreamWindow.
func TestAgents_CutThroughFromAThrottledStick(t *testing.T) {
	run, f, _ := plugThrottledStick(t, cutOptions{Nodes: 3, Size: bigSize, StickRate: 32 << 20, LinkRate: bigRate})
	bound := run.tarSize + peer.StreamWindow(run.tarSize)
	t.Logf("plugged %s; stick's node extracted after %.1fs; all after %.1fs", run.plugged.Format("15:04:05.000"),
		run.sourceDone.Sub(run.plugged).Seconds(), run.all.Seconds())
	for _, n := range f.nodes[1:] {
		first, ok := run.firstBytes[n.Name]
		t.Logf("%s: first bytes after %.1fs, extracted after %.1fs, disk peak %d MiB = %.3f × the bundle (bound %.3f ×)", n.Name,
			first.Sub(run.plugged).Seconds(), run.done[n.Name].Sub(run.plugged).Seconds(), run.peak[n.Name]>>20,
			float64(run.peak[n.Name])/float64(run.tarSize), float64(bound)/float64(run.tarSize))
		if !ok || !first.Before(run.sourceDone) {
			t.Errorf("%s got its first bytes at %s, not before the stick's node finished reading (%s): no cut-through",
				n.Name, first.Format("15:04:05.000"), run.sourceDone.Format("15:04:05.000"))
		}
		if p := run.peak[n.Name]; p == 0 || p > bound {
			t.Errorf("%s used %d bytes of disk at its peak, want at most the bundle (%d) plus the window (%d)", n.Name, p, run.tarSize, peer.StreamWindow(run.tarSize))
		}
	}
	for _, n := range f.nodes {
		n.checkBigTree(t)
	}
}

// TestAgents_StickNodeRestartedMidRead: the stick's node is killed (-9)
// while it still reads the throttled stick and the others already fetch
// from it; restarted, it asks for the stick again, and once given it
// (ferry load, as its status says) every node ends with the same verified
// tree.
func TestAgents_StickNodeRestartedMidRead(t *testing.T) {
	tarPath, err := bigbundle.Make(bigSize, bigBlob, os.TempDir()+"/ferry-test-bundles")
	if err != nil {
		t.Fatal(err)
	}
	digest := sidecarDigest(t, tarPath)
	f := newFleet(t, fleetOptions{Nodes: 3, Rate: bigRate, Setup: func(_ *Node, cfg *agent.Config) {
		cfg.Media.Detect = "manual"
	}})
	src, b := f.nodes[0], f.nodes[1]
	stick := NewStick(t, tarPath)
	udevenv.CapReads(t, stick.Dev, 16<<20).Add(src.A.Cmd.Process.Pid) // ~16 s for the whole stick

	src.load(t, stick.Tar)
	bs := b.A.Wait(agentBound, "B fetching while the stick's node reads", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseFetching) && s.Progress != nil && s.Progress.Done > 0
	})
	s, err := src.A.Status(t.Context())
	if err != nil || s.Phase != string(agent.PhaseDetected) || s.Progress == nil {
		t.Fatalf("the stick's node is not reading any more when it is to be killed: %+v (%v)", s, err)
	}
	src.A.Kill()
	t.Logf("killed the stick's node at %d of %d bytes read; B had %d", s.Progress.Done, s.Progress.Total, bs.Progress.Done)
	src.A.Restart()
	src.A.Wait(agentBound, "the stick's node to ask for the stick again", func(s agent.Status) bool {
		return s.Reason == agent.ReasonCopyInterrupted
	})
	src.load(t, stick.Tar)
	for _, n := range f.nodes {
		n.waitHolds(t, agent.PhaseExtracted, digest)
		n.checkBigTree(t)
	}
}

var (
	cutSizeMiB  = flag.Int64("cut.size", 1024, "BenchmarkCutThrough: bundle size in MiB")
	cutStickMiB = flag.Int64("cut.stick", 100, "BenchmarkCutThrough: the stick's read cap in MiB/s")
	cutRateMB   = flag.Int64("cut.rate", 50, "BenchmarkCutThrough: each node's link cap in MB/s (10^6 bytes), each direction")
	cutNodes    = flag.String("cut.nodes", "4,8", "BenchmarkCutThrough: node counts (the stick's node included)")
	cutModes    = flag.String("cut.modes", "cut,serial", "BenchmarkCutThrough: cut (cut-through), serial (peer.serial: extract, then fetch whole, then extract)")
)

// BenchmarkCutThrough is issue 15's P2c: plug to every node extracted,
// the stick read capped and every link capped, as a ratio to the floor
// max(size/stick cap, size/link cap) ("x-floor"), and each fetching
// node's peak disk use over the bundle size ("x-disk", the worst node):
//
//	go test ./test/netns -run XXX -bench CutThrough -benchtime 1x [-cut.size 1024]
func BenchmarkCutThrough(b *testing.B) {
	Require(b)
	size := *cutSizeMiB << 20
	stick, link := *cutStickMiB<<20, *cutRateMB*1000*1000
	floor := time.Duration(float64(size) / float64(min(stick, link)) * float64(time.Second))
	// The stick's node by itself, plug to extracted: its own extraction
	// floor, which the goal adds to 1.2 × the floor.
	b.Run("alone/N=1", func(b *testing.B) {
		var all time.Duration
		for range b.N {
			run, _, _ := plugThrottledStick(b, cutOptions{Nodes: 1, Size: size, StickRate: stick, LinkRate: link})
			all += run.all
		}
		b.ReportMetric((all / time.Duration(b.N)).Seconds(), "s/all")
	})
	for _, n := range nodeCounts(b, "-cut.nodes", *cutNodes) {
		for _, mode := range strings.Split(*cutModes, ",") {
			b.Run(fmt.Sprintf("%s/N=%d", mode, n), func(b *testing.B) {
				var all time.Duration
				var disk float64
				for range b.N {
					run, _, _ := plugThrottledStick(b, cutOptions{Nodes: n, Size: size, StickRate: stick, LinkRate: link, Serial: mode == "serial"})
					all += run.all
					for _, p := range run.peak {
						disk = max(disk, float64(p)/float64(run.tarSize))
					}
					b.Logf("P2c %s N=%d: stick's node extracted after %.1fs, all after %.1fs; fetchers (first bytes/extracted): %s",
						mode, n, run.sourceDone.Sub(run.plugged).Seconds(), run.all.Seconds(), run.fetchers())
				}
				per := all / time.Duration(b.N)
				b.ReportMetric(per.Seconds(), "s/all")
				b.ReportMetric(float64(per)/float64(floor), "x-floor")
				b.ReportMetric(disk, "x-disk")
				b.Logf("P2c %s N=%d: %d MiB, stick %d MiB/s, links %d MB/s: all extracted after %.1fs = %.2f × the floor (%.1fs); fetchers' disk peak %.3f × the bundle",
					mode, n, *cutSizeMiB, *cutStickMiB, *cutRateMB, per.Seconds(), float64(per)/float64(floor), floor.Seconds(), disk)
			})
		}
	}
}

// TestAgents_AFetchFromACompletePeerKeepsOneCopyOnDisk: B is down while
// A reads and extracts a 512 MiB bundle; started after A is done, B
// fetches it from a peer holding all of it, and extracts the bytes as
// they arrive: its state and extract dirs never hold more than 1.1 × the
// bundle (the tree plus the kept part of the window, not tar and tree).
func TestAgents_AFetchFromACompletePeerKeepsOneCopyOnDisk(t *testing.T) {
	const size = 512 << 20
	tarPath, err := bigbundle.Make(size, bigBlob, os.TempDir()+"/ferry-test-bundles")
	if err != nil {
		t.Fatal(err)
	}
	digest := sidecarDigest(t, tarPath)
	fi, err := os.Stat(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	f := newFleet(t, fleetOptions{Nodes: 2, Rate: bigRate, Setup: func(_ *Node, cfg *agent.Config) {
		cfg.Media.Detect = "manual"
	}})
	a, b := f.nodes[0], f.nodes[1]
	b.A.Stop()
	a.load(t, tarPath)
	a.waitHolds(t, agent.PhaseExtracted, digest)

	run := cutRun{firstBytes: map[string]time.Time{}, peak: map[string]int64{}}
	var mu sync.Mutex
	ctx, stop := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { watchFetcher(ctx, b, &mu, &run) })
	b.A.Restart()
	b.waitHolds(t, agent.PhaseExtracted, digest)
	stop()
	wg.Wait()

	if _, ok := run.firstBytes[b.Name]; !ok {
		t.Fatalf("%s was never seen fetching: the disk was not sampled during its fetch", b.Name)
	}
	ratio := float64(run.peak[b.Name]) / float64(fi.Size())
	t.Logf("%s fetched from a complete peer: disk peak %d MiB = %.3f × the bundle", b.Name, run.peak[b.Name]>>20, ratio)
	if ratio > 1.1 {
		t.Errorf("%s's state and extract dirs peaked at %.3f × the bundle, want at most 1.1 ×: the fetch kept more than one copy", b.Name, ratio)
	}
	if err := bigbundle.CheckTree(filepath.Join(b.Cfg.Paths.ExtractDir, fmt.Sprintf("0.1.%d-x86_64", size>>20)), size, bigBlob); err != nil {
		t.Fatal(err)
	}
}
