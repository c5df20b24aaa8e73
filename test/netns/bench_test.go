package netns

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	fanSizeMiB = flag.Int64("fanout.size", 256, "BenchmarkFanOut: bundle size in MiB (issue 5 P2 asks 1024)")
	fanRateMB  = flag.Int64("fanout.rate", 50, "BenchmarkFanOut: each node's link cap in MB/s (10^6 bytes), each direction")
	fanNodes   = flag.String("fanout.nodes", "4,8", "BenchmarkFanOut: node counts (the source included)")
	fanModes   = flag.String("fanout.modes", "p2p,star", "BenchmarkFanOut: p2p (every node fetches from every other), star (all fetch from the source only), uncapped (p2p without tc: this machine's own floor)")
	fanFlags   = flag.String("fanout.flags", "", "BenchmarkFanOut: extra flags for every cmd/peernode, space-separated")
	fanPiece   = flag.Int64("fanout.piece", 0, "BenchmarkFanOut: piece size in KiB the source publishes (0: peer.DefaultPieceSize)")
)

// BenchmarkFanOut is issue 5's P2: with each node's link capped by tc, the
// time for every node to hold the bundle, as a ratio to one link's time
// (size / cap), reported as the "x-link" metric. Run it once per case:
//
//	go test ./test/netns -run XXX -bench FanOut -benchtime 1x [-fanout.size 1024]
func BenchmarkFanOut(b *testing.B) {
	Require(b)
	size := *fanSizeMiB << 20
	rate := *fanRateMB * 1000 * 1000
	link := time.Duration(float64(size) / float64(rate) * float64(time.Second))
	bundle, digest := makeBundle(b, b.TempDir(), size)
	var extra []string
	if *fanPiece > 0 {
		extra = []string{"-piece-size", strconv.FormatInt(*fanPiece<<10, 10)}
	}
	extra = append(extra, strings.Fields(*fanFlags)...)
	for _, n := range nodeCounts(b, "-fanout.nodes", *fanNodes) {
		for _, mode := range strings.Split(*fanModes, ",") {
			b.Run(fmt.Sprintf("%s/N=%d", mode, n), func(b *testing.B) {
				capped := rate
				if mode == "uncapped" {
					capped = 0
				}
				lab := New(b, Options{Nodes: n, RateBytes: capped})
				c := &cluster{t: b, lab: lab, bin: peernode(b), bundle: bundle, digest: digest, size: size, flags: extra}
				nodes := lab.Nodes()
				src := c.hold(nodes[0])
				c.waitPhase(b.Context(), nodes[0], src, "ready")
				var elapsed time.Duration
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					procs := map[*Node]*Proc{}
					for _, nd := range nodes[1:] {
						os.Remove(c.dest(nd))
						os.Remove(c.dest(nd) + ".state")
					}
					b.StartTimer()
					start := time.Now()
					for _, nd := range nodes[1:] {
						peers := []string{nodes[0].Addr(peerPort)}
						if mode != "star" {
							peers = c.others(nd)
						}
						procs[nd] = c.fetch(nd, peers)
					}
					for _, nd := range nodes[1:] {
						c.waitPhase(b.Context(), nd, procs[nd], "ready")
					}
					elapsed += time.Since(start)
					b.StopTimer()
					for _, nd := range nodes[1:] {
						procs[nd].Kill()
						c.checkHolds(nd)
					}
				}
				out, _ := nodes[0].Exec(b.Context(), "cat", "/sys/class/net/eth0/statistics/tx_bytes")
				var sent float64
				fmt.Sscan(string(out), &sent)
				var secs []string
				for _, nd := range nodes[1:] {
					secs = append(secs, fmt.Sprintf("%.1f", c.report(nd).Seconds))
				}
				b.Logf("source sent %.2f copies; nodes done after %s s", sent/float64(size)/float64(b.N), strings.Join(secs, " "))
				per := elapsed / time.Duration(b.N)
				ratio := float64(per) / float64(link)
				b.ReportMetric(ratio, "x-link")
				b.ReportMetric(per.Seconds(), "s/fanout")
				b.Logf("P2 %s N=%d: %d MiB at %d MB/s per link: all nodes hold it after %.1fs = %.2f × one link's time (%.1fs)",
					mode, n, *fanSizeMiB, *fanRateMB, per.Seconds(), ratio, link.Seconds())
			})
		}
	}
}

// nodeCounts parses a benchmark's list of node counts (flag: its name).
func nodeCounts(b *testing.B, flag, list string) []int {
	var out []int
	for _, ns := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(ns))
		if err != nil || n < 2 {
			b.Fatalf("%s: %q is not a node count of 2 or more", flag, ns)
		}
		out = append(out, n)
	}
	return out
}
