package pacing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakePressure is a node whose stalls a test sets.
type fakePressure struct {
	mu      sync.Mutex
	cpu, io float64
	err     error
}

func (f *fakePressure) Sample() (float64, float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cpu, f.io, f.err
}

func (f *fakePressure) set(cpu, io float64) {
	f.mu.Lock()
	f.cpu, f.io = cpu, io
	f.mu.Unlock()
}

var _ Pressure = (*fakePressure)(nil)

func etcdSafe(t *testing.T) Limits {
	l, ok := LimitsFor(DefaultPoliteness)
	if !ok {
		t.Fatalf("no limits for %s", DefaultPoliteness)
	}
	return l
}

func TestGovernor_SlowsUnderIOStallAndRecovers(t *testing.T) {
	f := &fakePressure{}
	g := New(f, etcdSafe(t), DefaultInterval, nil)

	g.Step()
	if g.Pause() != 0 || g.HoldingBack() != "" || g.Workers(8) != 8 {
		t.Fatalf("quiet node: pause %v, holding back %q, workers %d; want full speed", g.Pause(), g.HoldingBack(), g.Workers(8))
	}

	f.set(0, 0.23) // etcd's fsyncs wait: some task stalls on IO 23% of the time
	var last time.Duration
	for range 12 {
		g.Step()
		if g.Pause() < last {
			t.Fatalf("pause fell from %v to %v while the node still stalls", last, g.Pause())
		}
		last = g.Pause()
	}
	if last != maxPause {
		t.Errorf("after a sustained stall the pause is %v, want the longest, %v", last, maxPause)
	}
	if got := g.HoldingBack(); got != "io pressure 23%" {
		t.Errorf("HoldingBack() = %q, want %q", got, "io pressure 23%")
	}
	if w := g.Workers(8); w != 1 {
		t.Errorf("Workers(8) = %d at the longest pause, want 1", w)
	}
	start := time.Now()
	if err := g.Pace(t.Context(), 1<<20); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < maxPause/2 {
		t.Errorf("Pace of 1 MiB took %v while holding back, want about %v", el, maxPause)
	}

	f.set(0.02, 0.07) // between half the limit and the limit: hold
	g.Step()
	if g.Pause() != maxPause {
		t.Errorf("pause %v at 70%% of the limit, want it kept at %v", g.Pause(), maxPause)
	}

	f.set(0.01, 0.01) // quiet again
	steps := 0
	for g.Pause() > 0 && steps < 1000 {
		g.Step()
		steps++
	}
	if g.Pause() != 0 || g.HoldingBack() != "" || g.Workers(8) != 8 {
		t.Fatalf("after %d quiet samples: pause %v, holding back %q, workers %d; want full speed", steps, g.Pause(), g.HoldingBack(), g.Workers(8))
	}
	// Recovery halves the pause every recoverHalfLife: from the longest
	// to none in eight halvings, slower than the back-off.
	if quiet := time.Duration(steps) * g.interval; quiet < 7*recoverHalfLife || quiet > 8*recoverHalfLife {
		t.Errorf("took %d quiet samples (%v) to recover, want 7–8 halvings of %v", steps, quiet, recoverHalfLife)
	}
}

func TestGovernor_BacksOffAtOnceByHowFarOver(t *testing.T) {
	lim := etcdSafe(t)
	for _, c := range []struct {
		io       float64
		min, max time.Duration
	}{
		{lim.IO * 1.01, minPause, minPause + maxPause/100}, // just over: the shortest
		{lim.IO * 2, maxPause / 2, maxPause / 2},           // twice: half the longest
		{lim.IO * 3, maxPause, maxPause},                   // three times or more: the longest
		{0.9, maxPause, maxPause},
	} {
		f := &fakePressure{}
		g := New(f, lim, DefaultInterval, nil)
		g.Step()
		f.set(0, c.io)
		g.Step() // one sample over the limit
		if p := g.Pause(); p < c.min || p > c.max {
			t.Errorf("io pressure %.3f (limit %.2f): pause %v after one sample, want %v–%v", c.io, lim.IO, p, c.min, c.max)
		}
	}
}

func TestGovernor_CPUPressureNamesItself(t *testing.T) {
	f := &fakePressure{}
	f.set(0.95, 0.01)
	g := New(f, etcdSafe(t), 0, nil)
	g.Step()
	if got := g.HoldingBack(); got != "cpu pressure 95%" {
		t.Errorf("HoldingBack() = %q, want cpu pressure 95%%", got)
	}
}

func TestGovernor_UnreadablePressureRunsAtFullSpeed(t *testing.T) {
	f := &fakePressure{}
	f.set(0, 0.9)
	g := New(f, etcdSafe(t), 0, nil)
	g.Step()
	if g.Pause() == 0 {
		t.Fatal("no pause under stall")
	}
	f.mu.Lock()
	f.err = errors.New("no PSI")
	f.mu.Unlock()
	g.Step()
	if g.Pause() != 0 || g.HoldingBack() != "" {
		t.Errorf("pressure unreadable: pause %v, holding back %q; want full speed", g.Pause(), g.HoldingBack())
	}
}

func TestGovernor_PaceEndsWithContext(t *testing.T) {
	f := &fakePressure{}
	f.set(0, 1)
	g := New(f, etcdSafe(t), 0, nil)
	for range 10 {
		g.Step()
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := g.Pace(ctx, 64<<20); !errors.Is(err, context.Canceled) {
		t.Errorf("Pace with a cancelled context: %v, want context.Canceled", err)
	}
}

func TestGovernor_PaceIsSharedByAllWhoAsk(t *testing.T) {
	g := New(&fakePressure{}, etcdSafe(t), 0, nil)
	g.pause.Store(int64(maxPause)) // held back as far as it goes: 4 MiB/s
	const workers, chunk = 4, 256 << 10
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			if err := g.Pace(t.Context(), chunk); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	// Each on its own would be done in one chunk's pause; taking turns,
	// the last waits for the other three.
	if el, want := time.Since(start), time.Duration(workers-1)*maxPause*chunk/mib; el < want {
		t.Errorf("%d workers paced %d KiB each in %v, want at least %v: the pause is not shared", workers, chunk>>10, el, want)
	}

	// A caller that gives up hands its turn back.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	before := g.next.Load()
	if err := g.Pace(ctx, 64<<20); !errors.Is(err, context.Canceled) {
		t.Fatalf("Pace with a cancelled context: %v", err)
	}
	if after := g.next.Load(); after > max(before, time.Now().UnixNano()) {
		t.Errorf("a cancelled Pace of 64 MiB kept its turn: the next caller waits until %v", time.Unix(0, after))
	}
}

func TestGovernor_RunAdjustsAndStops(t *testing.T) {
	f := &fakePressure{}
	f.set(0, 0.5)
	g := New(f, etcdSafe(t), time.Millisecond, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for g.Pause() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if g.Pause() == 0 {
		t.Fatal("Run never held back under stall")
	}
	cancel()
	<-done
	if g.Pause() != 0 {
		t.Errorf("pause %v after Run ended, want 0", g.Pause())
	}
}

func TestGovernor_NilNeverHoldsBack(t *testing.T) {
	var g *Governor
	if err := g.Pace(t.Context(), 1<<30); err != nil || g.Workers(4) != 4 || g.HoldingBack() != "" {
		t.Error("a nil governor held back")
	}
}

func TestPSI_ReadsFilesAsDeltas(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, total int) {
		s := "some avg10=0.00 avg60=0.00 avg300=0.00 total=" + strconv.Itoa(total) + "\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
		if err := os.WriteFile(dir+"/"+name, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("cpu", 1000)
	write("io", 5000)
	now := time.Unix(100, 0)
	p := NewPSI(dir)
	p.now = func() time.Time { return now }
	if c, i, err := p.Sample(); err != nil || c != 0 || i != 0 {
		t.Fatalf("first sample: %v %v %v, want 0 0 nil", c, i, err)
	}
	now = now.Add(time.Second)
	write("cpu", 1000+100_000) // 0.1 s stalled of 1 s
	write("io", 5000+230_000)
	c, i, err := p.Sample()
	if err != nil || !near(c, 0.10) || !near(i, 0.23) {
		t.Errorf("sample: cpu %v io %v err %v, want 0.10 0.23", c, i, err)
	}
}

func TestPSI_CgroupV2Names(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"cpu.pressure", "io.pressure"} {
		if err := os.WriteFile(dir+"/"+n, []byte("some avg10=0.00 avg60=0.00 avg300=0.00 total=7\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := NewPSI(dir).Sample(); err != nil {
		t.Errorf("cgroup v2 directory: %v", err)
	}
}

func TestPSI_MissingFileSaysWhat(t *testing.T) {
	_, _, err := NewPSI(t.TempDir()).Sample()
	if err == nil || !strings.Contains(err.Error(), "pacing.enabled = false") {
		t.Errorf("error %v does not say how to turn pacing off", err)
	}
}

// TestPSI_RealKernel reads the node's own /proc/pressure: two samples a
// moment apart give shares between 0 and 1, and a governor built on it
// steps without error.
func TestPSI_RealKernel(t *testing.T) {
	if _, err := os.Stat("/proc/pressure/io"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("this kernel has no PSI: %v", err)
		}
		t.Skipf("no PSI here: %v", err)
	}
	p := NewPSI("")
	if _, _, err := p.Sample(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	c, i, err := p.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if c < 0 || c > 1 || i < 0 || i > 1 {
		t.Errorf("shares out of range: cpu %v io %v", c, i)
	}
	t.Logf("this node: cpu pressure %.1f%%, io pressure %.1f%%", 100*c, 100*i)
	g := New(p, etcdSafe(t), 0, nil)
	g.Step()
	g.Step()
	if !g.err && g.Pause() > 0 && g.HoldingBack() == "" {
		t.Error("holding back without saying why")
	}
}

func near(a, b float64) bool { return a-b < 0.005 && b-a < 0.005 }

// clockedGovernor is an etcd-safe governor on a fake node and a fake
// clock, sampled once; tick moves the clock one interval and samples.
func clockedGovernor(t *testing.T) (*Governor, *fakePressure, func()) {
	f := &fakePressure{}
	g := New(f, etcdSafe(t), DefaultInterval, nil)
	clock := time.Unix(0, 0)
	g.now = func() time.Time { return clock }
	g.Step()
	return g, f, func() {
		clock = clock.Add(DefaultInterval)
		g.Step()
	}
}

// The node's IO pressure counts ferry's own waits for its writeback:
// those alone must not hold it back, anyone else's on top of them must.
func TestGovernor_OwnWritebackWaitsAreNotOthersStall(t *testing.T) {
	g, f, tick := clockedGovernor(t)

	f.set(0, 0.30)                     // some task stalled on IO 30% of the last sample...
	g.Waited(DefaultInterval * 3 / 10) // ...and that task was ferry
	tick()
	if g.Pause() != 0 || g.HoldingBack() != "" {
		t.Fatalf("ferry alone stalled: pause %v, holding back %q; want full speed", g.Pause(), g.HoldingBack())
	}

	g.Waited(DefaultInterval / 10) // ferry a tenth of it; others 20%, twice the limit
	tick()
	if g.Pause() == 0 {
		t.Fatalf("others stalled 20%% beside ferry's own 10%%: no pause")
	}
	if got := g.HoldingBack(); got != "io pressure 20%" {
		t.Errorf("HoldingBack() = %q, want the others' share, io pressure 20%%", got)
	}
}

// A one-sample blip (a journal commit) is forgiven within a second; a
// stall that lasts is recovered from slowly (above).
func TestGovernor_ForgivesABlipQuickly(t *testing.T) {
	f := &fakePressure{}
	g := New(f, etcdSafe(t), DefaultInterval, nil)
	g.Step()
	f.set(0, 1)
	g.Step()
	if g.Pause() != maxPause {
		t.Fatalf("pause %v after a full stall, want %v", g.Pause(), maxPause)
	}
	f.set(0, 0)
	steps := 0
	for g.Pause() > 0 && steps < 1000 {
		g.Step()
		steps++
	}
	if quiet := time.Duration(steps) * DefaultInterval; quiet > time.Second {
		t.Errorf("a blip of one sample held ferry back %v of quiet samples, want at most 1s", quiet)
	}
}

func writePressure(t *testing.T, dir string, cpuUs, ioUs int) {
	t.Helper()
	for n, v := range map[string]int{"cpu.pressure": cpuUs, "io.pressure": ioUs} {
		body := fmt.Sprintf("some avg10=0.00 avg60=0.00 avg300=0.00 total=%d\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", v)
		if err := os.WriteFile(filepath.Join(dir, n), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Auto picks the pods' cgroup where the node publishes its pressure, else
// the node's; a given directory wins.
func TestWatchDir_PodsWhereTheyHavePressureElseTheNode(t *testing.T) {
	pods := t.TempDir()
	old := kubePods
	t.Cleanup(func() { kubePods = old })
	kubePods = pods
	if got := WatchDir(""); got != DefaultPSIDir {
		t.Errorf("no pods' pressure (cgroup v1): WatchDir(\"\") = %s, want %s", got, DefaultPSIDir)
	}
	writePressure(t, pods, 0, 0)
	if got := WatchDir(""); got != pods {
		t.Errorf("pods' pressure published: WatchDir(\"\") = %s, want %s", got, pods)
	}
	if got := WatchDir("/proc/pressure"); got != "/proc/pressure" {
		t.Errorf("WatchDir(/proc/pressure) = %s", got)
	}
	if !NewPSI(DefaultPSIDir).CountsSelf() || NewPSI(pods).CountsSelf() {
		t.Error("the node's pressure counts ferry's own stalls, the pods' does not")
	}
}

// Watching the pods, ferry's own waits are not in the pressure and are
// not taken away from it: the pods' stall holds ferry back whatever it
// waited itself.
func TestGovernor_WatchingThePodsKeepsTheirWholeStall(t *testing.T) {
	pods := t.TempDir()
	writePressure(t, pods, 0, 0)
	psi := NewPSI(pods)
	clock := time.Unix(0, 0)
	psi.now = func() time.Time { return clock }
	g := New(psi, etcdSafe(t), DefaultInterval, nil)
	g.now = psi.now
	g.Step()
	clock = clock.Add(100 * time.Millisecond)
	writePressure(t, pods, 0, 30_000) // the pods stalled on IO 30 ms of 100
	g.Waited(30 * time.Millisecond)   // and ferry waited as long for its own writeback
	g.Step()
	if g.Pause() == 0 || g.HoldingBack() != "io pressure 30%" {
		t.Errorf("the pods stalled 30%%: pause %v, holding back %q; want held back for io pressure 30%%", g.Pause(), g.HoldingBack())
	}
}

// A stall that turns out to have been ferry's own (a long wait of its
// own ends and takes it away) is recovered from as fast as a blip.
func TestGovernor_AStallThatWasFerrysOwnIsForgivenFast(t *testing.T) {
	g, f, tick := clockedGovernor(t)
	f.set(0, 1) // 400 ms of stall: ferry's write behind a journal commit
	for range int(400 * time.Millisecond / DefaultInterval) {
		tick()
	}
	if g.Pause() != maxPause {
		t.Fatalf("pause %v during the stall, want %v", g.Pause(), maxPause)
	}
	f.set(0, 0.9) // the write returns: the last interval's stall was its wait
	g.Waited(450 * time.Millisecond)
	tick()
	f.set(0, 0)
	steps := 0
	for g.Pause() > 0 && steps < 1000 {
		tick()
		steps++
	}
	if quiet := time.Duration(steps) * DefaultInterval; quiet > time.Second {
		t.Errorf("recovered from ferry's own stall in %v of quiet samples, want at most 1s", quiet)
	}
}
