package pacing

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// Limits are the stall shares (0–1) of the node above which ferry holds
// its bulk work back.
type Limits struct {
	CPU, IO float64
}

// Politeness levels (pacing.politeness). IO is what etcd feels: its WAL
// fsyncs wait behind every other writer, so "etcd-safe" holds back as soon
// as a tenth of the time some task waits for IO. CPU is shared by the
// unit's CPUWeight already (the scheduler gives ferry's threads a tenth of
// a busy node), and ferry's own three busy threads on two cores stall each
// other, so CPU pressure only counts when it is high.
var politeness = map[string]Limits{
	"etcd-safe": {CPU: 0.80, IO: 0.10},
	"balanced":  {CPU: 0.90, IO: 0.25},
	"eager":     {CPU: 1.00, IO: 0.50},
}

// DefaultPoliteness is what a node gets with no pacing.politeness.
const DefaultPoliteness = "etcd-safe"

// Politeness names the levels, most polite first.
func Politeness() []string { return []string{"etcd-safe", "balanced", "eager"} }

// LimitsFor returns the limits of a politeness level.
func LimitsFor(name string) (Limits, bool) {
	l, ok := politeness[name]
	return l, ok
}

const (
	// DefaultInterval is how often the governor samples the pressure: a
	// stall is seen within 50 ms (two small reads of /proc). Until then
	// ferry runs on at full speed into it, and the start of a stall is
	// what a short etcd job's p99 saw most during a load.
	DefaultInterval = 50 * time.Millisecond
	// recoverHalfLife is how often the pause halves while the node is
	// quiet: slower than it backs off, so that ferry does not return to
	// full speed between two bursts of someone else's work.
	recoverHalfLife = 500 * time.Millisecond
	// blipFor is the longest stall recovered from by halving the pause
	// every quiet sample.
	blipFor = 200 * time.Millisecond
	// minPause and maxPause bound the pause per MiB of bulk work while
	// holding back: 2 ms halves a page-cache extraction's pace; 250 ms
	// holds it to 4 MiB/s.
	minPause = 2 * time.Millisecond
	maxPause = 250 * time.Millisecond
	mib      = 1 << 20
)

// Governor paces bulk work. A sampler (Run) raises a pause per MiB while
// the node stalls over the limits, at once as far as the stall asks
// (backOff) and doubling it each sample it lasts, and halves it every
// recoverHalfLife the node is under half of them, down to none. Workers
// call Pace per chunk: when the pause is zero that is one atomic load.
// A nil *Governor never holds back.
type Governor struct {
	p        Pressure
	lim      Limits
	interval time.Duration
	log      *slog.Logger

	recoverEvery int // quiet samples per halving of the pause
	blipSamples  int // samples of the longest stall that is a blip (blipFor)
	quiet        int // quiet samples since the last halving
	stalled      int // samples over the limits in the stall now being recovered from

	own  atomic.Int64 // ns ferry's own work waited for its IO since the last sample
	now  func() time.Time
	last time.Time // the last sample

	pause atomic.Int64           // ns per MiB; 0: full speed
	next  atomic.Int64           // unix ns at which the last paced bytes' turn ends
	why   atomic.Pointer[string] // what it holds back for, while pause > 0
	err   bool                   // the last sample failed (logged once)
}

// New returns a governor reading p against lim; interval 0 is
// DefaultInterval.
func New(p Pressure, lim Limits, interval time.Duration, log *slog.Logger) *Governor {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Governor{p: p, lim: lim, interval: interval, log: log,
		recoverEvery: max(1, int(recoverHalfLife/interval)), blipSamples: max(1, int(blipFor/interval)), now: time.Now}
}

// Run samples the pressure every interval until ctx ends.
func (g *Governor) Run(ctx context.Context) {
	if g == nil {
		return
	}
	t := time.NewTicker(g.interval)
	defer t.Stop()
	g.Step() // the first sample only sets the baseline
	for {
		select {
		case <-ctx.Done():
			g.pause.Store(0)
			g.why.Store(nil)
			return
		case <-t.C:
			g.Step()
		}
	}
}

// Step takes one sample and adjusts the pause (Run calls it; tests too).
func (g *Governor) Step() {
	cpu, io, err := g.p.Sample()
	if err != nil {
		if !g.err {
			g.log.Warn("pacing: cannot read the node's pressure; running at full speed", "err", err)
			g.err = true
		}
		g.pause.Store(0)
		g.why.Store(nil)
		return
	}
	g.err = false
	// The node's IO stall counts ferry's own waits (its writeback, a slow
	// stick's reads: Waited): held back for those, a synced extraction
	// ran at a third of its speed on a quiet node. Taken away, what is
	// left is a lower bound on everyone else's.
	now := g.now()
	own := time.Duration(g.own.Swap(0))
	if s, ok := g.p.(interface{ CountsSelf() bool }); ok && !s.CountsSelf() {
		own = 0
	}
	if !g.last.IsZero() && now.After(g.last) {
		share := float64(own) / float64(now.Sub(g.last))
		io = max(0, io-share)
		if share > 0.5 && io < g.lim.IO/2 {
			// A long wait of ferry's own just ended (a write behind a
			// journal commit): the node's stall seen while it lasted
			// was ferry's, so recover from it as from a blip.
			g.stalled = 0
		}
	}
	g.last = now
	over, why := 0.0, ""
	if g.lim.IO > 0 && io/g.lim.IO > over {
		over, why = io/g.lim.IO, fmt.Sprintf("io pressure %.0f%%", 100*io)
	}
	if g.lim.CPU > 0 && cpu/g.lim.CPU > over {
		over, why = cpu/g.lim.CPU, fmt.Sprintf("cpu pressure %.0f%%", 100*cpu)
	}
	p := time.Duration(g.pause.Load())
	switch {
	case over >= 1:
		p = min(maxPause, max(minPause, 2*p, backOff(over)))
		if g.quiet > 0 {
			g.stalled = 0 // a new stall
		}
		g.quiet = 0
		g.stalled++
	case over < 0.5 && p > 0:
		// A blip (a journal commit, the kernel's discard of freed blocks,
		// which the node's pressure also counts) is forgiven at once: held
		// back 4 s for each, a synced extraction lost a third of its speed
		// on a quiet node. A stall that lasted is recovered from slowly.
		if g.quiet++; g.quiet >= g.recoverEvery || g.stalled <= g.blipSamples {
			g.quiet = 0
			if p /= 2; p < minPause {
				p = 0
			}
		}
	default: // between half the limits and them: hold
		g.quiet = 0
	}
	if p > 0 {
		if why == "" {
			why = "the node's pressure"
		}
		g.why.Store(&why)
	} else {
		g.why.Store(nil)
	}
	g.pause.Store(int64(p))
}

// backOff is the pause a sample over the limits asks for at once: none
// just at the limit, the longest at three times it. Doubling alone took
// eight samples (4 s) from full speed to the longest pause, and a fio
// etcd job that ran 5 s spent most of them behind a nearly unpaced
// extraction; backing off in one step and recovering by halves is what
// TCP does for the same reason.
func backOff(over float64) time.Duration {
	return time.Duration(float64(maxPause) * min(1, (over-1)/2))
}

// Waited tells the governor that ferry's bulk work waited d for its own
// IO, which the node's IO pressure counts as a stall.
func (g *Governor) Waited(d time.Duration) {
	if g != nil {
		g.own.Add(int64(d))
	}
}

// Pace pauses the caller for n bytes of bulk work while the governor holds
// back, or until ctx ends. The pause is shared: callers take turns, so
// that all of ferry's bulk work together goes a MiB per pause however
// many ask at once. Paused each on its own, the registry's streams to
// CRI-O (a dozen layers at a time) went a dozen times the rate that one
// held-back extraction does, and CRI-O wrote all of it.
func (g *Governor) Pace(ctx context.Context, n int) error {
	if g == nil {
		return nil
	}
	p := g.pause.Load()
	if p == 0 {
		return nil
	}
	d := p * int64(n) / mib
	if d <= 0 {
		return nil
	}
	now := time.Now().UnixNano()
	var end int64 // when this caller's turn ends
	for {
		next := g.next.Load()
		end = max(now, next) + d
		if g.next.CompareAndSwap(next, end) {
			break
		}
	}
	t := time.NewTimer(time.Duration(end - now))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		g.next.CompareAndSwap(end, end-d) // its turn back, unless others queued behind it
		return ctx.Err()
	}
}

// Workers scales a pool of n workers: n at full speed, fewer as the pause
// grows, 1 at the longest.
func (g *Governor) Workers(n int) int {
	if g == nil || n <= 1 {
		return max(n, 1)
	}
	p := g.pause.Load()
	if p == 0 {
		return n
	}
	return max(1, n-int(int64(n)*p/int64(maxPause)))
}

// Pause is the current pause per MiB (0: full speed).
func (g *Governor) Pause() time.Duration {
	if g == nil {
		return 0
	}
	return time.Duration(g.pause.Load())
}

// HoldingBack says why the bulk work is slowed ("io pressure 23%"), or ""
// when it runs at full speed.
func (g *Governor) HoldingBack() string {
	if g == nil {
		return ""
	}
	if w := g.why.Load(); w != nil {
		return *w
	}
	return ""
}
