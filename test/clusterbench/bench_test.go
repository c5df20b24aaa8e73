// Package clusterbench measures what a cluster at work costs the API
// server, per node (issue 43): N real agents against the real
// kube-apiserver through the whole flow of one bundle. It is a
// benchmark, not a CI test: `make bench-cluster` (test/bench/
// k2-cluster.sh) runs it; FERRY_BENCH_NODES says the sizes.
package clusterbench

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// BenchmarkClusterAtWork runs, for each N of FERRY_BENCH_NODES (default
// 10), the whole flow of one bundle on N nodes: `ferry load` on node 0,
// which offers it; the administrator's approval (spec.approvedDigest),
// after which the others fetch it from the peers; every node loads it
// into its CRI-O stand-in (FERRY_BENCH_PULL_DELAY a pull, default 2s);
// ferry sets desiredUpdate; the version operator's Partial then
// Completed; the machine config operator takes each node through Working
// to Done on a new rendered config; every node retires the bundle's
// mirror (cleanup). It reads the API server's own metrics before and
// after, and reports per node and per minute of the flow the requests,
// response bytes and watch-event bytes (less the server's own at rest,
// measured before the agents start), the requests of an idle minute
// after it (FERRY_BENCH_IDLE, default 2m), the time from the approval
// until every node saw it, and where the CPU went. Run it with
// -benchtime 1x: one flow is one measurement.
func BenchmarkClusterAtWork(b *testing.B) {
	for _, n := range sizes(b) {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			for range b.N {
				flow(b, n)
			}
		})
	}
}

func sizes(b *testing.B) []int {
	v := os.Getenv("FERRY_BENCH_NODES")
	if v == "" {
		return []int{10}
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 || n > 1000 {
			b.Fatalf("FERRY_BENCH_NODES=%q: want sizes from 2 to 1000, comma-separated, e.g. 10,50,100", v)
		}
		out = append(out, n)
	}
	return out
}

func duration(b *testing.B, env string, def time.Duration) time.Duration {
	v := os.Getenv(env)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		b.Fatalf("%s=%q: want a duration, e.g. 2s", env, v)
	}
	return d
}

// stage bounds each wait of the flow: generous, a slow machine is no
// failure, a flow that never completes is.
const stage = 15 * time.Minute

func flow(b *testing.B, n int) {
	pullDelay := duration(b, "FERRY_BENCH_PULL_DELAY", 2*time.Second)
	idle := duration(b, "FERRY_BENCH_IDLE", 2*time.Minute)
	quiet := duration(b, "FERRY_BENCH_QUIET", 30*time.Second)

	c := newCluster(b, n)
	e := c.e
	// The server alone, before any agent runs: its own controllers'
	// requests and watches, taken off every figure below.
	r := read(e)
	time.Sleep(quiet)
	alone := between(r, read(e))
	startAgents := time.Now()
	if dir := os.Getenv("FERRY_BENCH_LOGS"); dir != "" {
		// Every agent's log, kept where the script says, to see where a
		// flow spent its time or stopped.
		b.Cleanup(func() {
			for _, a := range c.agents {
				os.MkdirAll(dir, 0o755)
				os.WriteFile(filepath.Join(dir, fmt.Sprintf("N%d-%s.log", n, a.Cfg.NodeName)), []byte(a.Logs()), 0o644)
			}
		})
	}
	c.startAgents(pullDelay)
	b.Logf("N=%d: %d agents started, idle and recorded in %s", n, n, time.Since(startAgents).Round(time.Second))
	time.Sleep(5 * time.Second) // their first writes done

	apiPid := pidOf("kube-apiserver", "--secure-port="+strconv.Itoa(e.Port))
	etcdPid := pidOf("etcd", "--data-dir="+e.Dir)
	cpu := func() (api, etcd, agents, self float64) {
		for _, a := range c.agents {
			agents += cpuSeconds(a.Cmd.Process.Pid)
		}
		return cpuSeconds(apiPid), cpuSeconds(etcdPid), agents, cpuSeconds(os.Getpid())
	}
	var marks []string
	t0 := time.Now()
	mark := func(what string) {
		marks = append(marks, fmt.Sprintf("%6.1fs %s", time.Since(t0).Seconds(), what))
		fmt.Fprintf(os.Stderr, "K2 N=%d %s\n", n, marks[len(marks)-1]) // as it goes: a benchmark's log waits for its end
	}
	api0, etcd0, agents0, self0 := cpu()
	r0 := read(e)

	// node 0 gets the bundle (ferry load, as a stick would) and offers it
	// to the others, which refuse it until the administrator approves.
	if out, err := c.agents[0].Ferry("load", c.tar); err != nil {
		b.Fatalf("ferry load on %s: %v\n%s", c.names[0], err, out)
	}
	mark("ferry load on node 0")
	c.agents[0].Wait(stage, "node 0 waiting for approval", func(s agent.Status) bool { return s.Reason == agent.ReasonAwaitingApproval })
	mark("node 0 extracted, waiting for approval")
	approved := time.Now()
	e.PatchBundleSpec(c.name, map[string]any{"approvedDigest": c.digest})
	mark("the administrator approves (spec.approvedDigest)")
	var seen map[string]time.Time
	// Each agent's own log time says when it saw it: reading N logs once
	// a second is enough, and leaves the agents the CPU.
	for deadline := time.Now().Add(stage); ; time.Sleep(time.Second) {
		if seen = c.approvalSeen(); len(seen) == n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d nodes saw the approval within %s", len(seen), n, stage)
		}
	}
	var lags []time.Duration
	for _, at := range seen {
		lags = append(lags, at.Sub(approved))
	}
	slices.Sort(lags)
	slowest := lags[len(lags)-1]
	mark(fmt.Sprintf("every node saw the approval (median %s, slowest %s after it)", lags[len(lags)/2].Round(time.Millisecond), slowest.Round(time.Millisecond)))

	loaded := func(s agent.Status) bool {
		switch agent.Phase(s.Phase) {
		case agent.PhaseLoaded, agent.PhaseClusterReady, agent.PhaseUpgrading, agent.PhaseUpgraded:
			return true
		}
		return false
	}
	c.waitAll(stage, "every node loaded", loaded)
	mark("every node loaded")
	for deadline := time.Now().Add(stage); ; time.Sleep(time.Second) {
		if c.desiredUpdate() == c.meta.Release {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("no desiredUpdate %s within %s", c.meta.Release, stage)
		}
	}
	mark("ferry set ClusterVersion desiredUpdate")

	// The version operator.
	prev := kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"}
	e.SetHistory(kubeenv.History{State: "Partial", Image: c.meta.Release, Version: c.meta.Version}, prev)
	c.countRead("GET clusterversions") // SetHistory reads it before its PUT
	c.waitAll(stage, "every node upgrading", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseUpgrading) || s.Phase == string(agent.PhaseUpgraded)
	})
	mark("the version operator: Partial; every node upgrading")
	e.SetHistory(kubeenv.History{State: "Completed", Image: c.meta.Release, Version: c.meta.Version}, prev)
	c.countRead("GET clusterversions")
	c.waitAll(stage, "every node upgraded", func(s agent.Status) bool { return s.Phase == string(agent.PhaseUpgraded) })
	mark("the version operator: Completed; every node upgraded, waiting for the MCO")

	// The machine config operator: the pool's new rendered config, each
	// node Working then Done on it.
	worker := kubeenv.MachineConfigPool{Name: "worker", NodeSelector: map[string]string{workerRole: ""}, Target: newConfig, Current: oldConfig, Machines: n}
	e.SetPool(worker)
	for _, name := range c.names {
		e.SetMachineConfig(name, "Working", oldConfig, newConfig)
		e.SetMachineConfig(name, "Done", newConfig, newConfig)
	}
	worker.Current, worker.Updated = newConfig, n
	e.SetPool(worker)
	mark("the MCO: every node Done on the new config")
	c.waitAll(stage, "every node cleaned up after the MCO", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseUpgraded) && s.Reason == agent.ReasonUpgraded
	})
	mark("every node retired its mirror (cleanup)")
	r1 := read(e)
	api1, etcd1, agents1, self1 := cpu()
	took := r1.at.Sub(r0.at)

	// At rest after it.
	time.Sleep(10 * time.Second)
	ri := read(e)
	time.Sleep(idle)
	rest := between(ri, read(e)).less(alone)

	rss, rssMax := 0.0, 0.0
	for _, a := range c.agents {
		m := rssMiB(a.Cmd.Process.Pid)
		rss += m
		rssMax = max(rssMax, m)
	}

	w := between(r0, r1).less(alone).lessHarness(c.reads)
	per := func(v float64) float64 { return v / float64(n) / took.Minutes() }
	nodesReq, allReq := w.nodes(), kubeenv.Sum(w.requests)
	b.ReportMetric(per(nodesReq), "req/node/min")
	b.ReportMetric(per(w.readBytes())/1000, "resp-kB/node/min")
	b.ReportMetric(per(kubeenv.Sum(w.evBytes))/1000, "watch-kB/node/min")
	b.ReportMetric(rest.nodes()/float64(n)/rest.d.Minutes(), "idle-req/node/min")
	b.ReportMetric(slowest.Seconds(), "approval-seen-s")
	b.ReportMetric(took.Seconds(), "flow-s")

	var out strings.Builder
	fmt.Fprintf(&out, "K2 N=%d: the flow took %s; per node: %.0f requests, %.1f kB of responses to reads (and %.1f kB of watches that ended in the flow, counted in watch events as they were sent), %.1f kB of watch events (%.0f events)\n",
		n, took.Round(time.Second), nodesReq/float64(n), w.readBytes()/float64(n)/1000, w.watchEnded()/float64(n)/1000, kubeenv.Sum(w.evBytes)/float64(n)/1000, kubeenv.Sum(w.events)/float64(n))
	fmt.Fprintf(&out, "K2 N=%d per node per minute of the flow: %.1f requests (%.1f with the harness's), %.1f kB responses to reads, %.1f kB watch events; idle after: %.2f requests/node/min (%.1f kB watch events); approval seen by all %d nodes within %s (median %s)\n",
		n, per(nodesReq), per(allReq), per(w.readBytes())/1000, per(kubeenv.Sum(w.evBytes))/1000,
		rest.nodes()/float64(n)/rest.d.Minutes(), kubeenv.Sum(rest.evBytes)/float64(n)/1000/rest.d.Minutes(), n, slowest.Round(time.Millisecond), lags[len(lags)/2].Round(time.Millisecond))
	fmt.Fprintf(&out, "  CPU during the flow (%s wall, 2 cores = %.0f CPU-s): kube-apiserver %.1f s, etcd %.1f s, %d agents %.1f s, the harness and its CRI stand-ins %.1f s; agent RSS mean %.1f MiB, max %.1f MiB; kube-apiserver RSS %.0f MiB\n",
		took.Round(time.Second), 2*took.Seconds(), api1-api0, etcd1-etcd0, n, agents1-agents0, self1-self0, rss/float64(n), rssMax, rssMiB(apiPid))
	fmt.Fprintf(&out, "  requests by flow schema: %s\n", top(w.flows, 8, count))
	fmt.Fprintf(&out, "  requests (all, less the server alone): %s\n", top(w.requests, 14, count))
	fmt.Fprintf(&out, "  response bytes: %s\n", top(w.respBytes, 10, kb))
	fmt.Fprintf(&out, "  watch events: %s\n", top(w.events, 10, count))
	fmt.Fprintf(&out, "  watch-event bytes: %s\n", top(w.evBytes, 10, kb))
	fmt.Fprintf(&out, "  idle %s: requests %s; watch-event bytes %s\n", rest.d.Round(time.Second), top(rest.requests, 10, count), top(rest.evBytes, 6, kb))
	fmt.Fprintf(&out, "  the server alone over %s: %s\n", alone.d.Round(time.Second), top(alone.requests, 8, count))
	fmt.Fprintf(&out, "  timeline:\n    %s\n", strings.Join(marks, "\n    "))
	b.Log("\n" + out.String())
	// The whole report also where the script keeps it: a benchmark's log
	// is cut to its first lines without -v.
	if f := os.Getenv("FERRY_BENCH_REPORT"); f != "" {
		if err := appendFile(f, out.String()); err != nil {
			b.Fatal(err)
		}
	}
}

func appendFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
