package netns

import (
	"cmp"
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/pull"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/fixture"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

var (
	regNodes   = flag.String("regmode.nodes", "3,8", "BenchmarkRegistryMode: node counts")
	regRateMB  = flag.Float64("regmode.rate", 2.5, "BenchmarkRegistryMode: the site's link to its registry in MB/s (10^6 bytes), all nodes together")
	regSizeMiB = flag.Int64("regmode.size", 64, "BenchmarkRegistryMode: the release's payload in MiB, in -regmode.images equal images")
	regImages  = flag.Int("regmode.images", 16, "BenchmarkRegistryMode: payload images in the release (plus the release image and one extra image)")
	regWorkers = flag.Int("regmode.workers", 5, "BenchmarkRegistryMode: pulls in flight per node in the CRI-O modes (the MCO's defaultPrefetchWorkers; its control-plane pools use 1)")
	regModes   = flag.String("regmode.modes", "ferry,per-node", "BenchmarkRegistryMode: ferry (registry mode: one node pulls, the peers share), per-node (every node's CRI-O pulls every image, the PinnedImageSet way), split (node i's CRI-O pulls every N-th image from i: the nodes split one copy), one (one node's CRI-O pulls every image)")
)

// BenchmarkRegistryMode is issue 36's Must-show: N nodes, each with a real
// CRI-O in its own network namespace, get every image of a release (and an
// extra image) from the site's registry through one throttled link
// (fixture.Link: Rate bytes/s for all responses together, a fresh link per
// mode so that its byte count is that mode's). Each mode reports the time
// from its start until every node has every image ("s/all-images") and
// the bytes the link carried ("link-B"); ferry also reports one copy, its
// bundle's size ("copy-B"), and the other modes their bytes as a multiple
// of it ("x-copy") when ferry ran before them; "x-linktime" is the time
// over what the link needed for the bytes it carried (near 1: the link,
// not this machine, set the pace). The goals: ferry ≤
// 1.05 copies; ferry's time ≤ per-node's / N × 1.2. Run it once:
//
//	go test ./test/netns -run XXX -bench RegistryMode -benchtime 1x [-regmode.nodes 3,8]
func BenchmarkRegistryMode(b *testing.B) {
	Require(b)
	rate := int64(*regRateMB * 1e6)
	reg := fixture.NewRegistry(b)
	extraTag := "quay.io/my-company/my-workload:v1"
	extra := reg.PushImage(b, "my-company/my-workload", "v1")
	const version = "4.13.8"
	release, payload := reg.PushRelease(b, fixture.ReleaseOptions{Version: version, PayloadImages: *regImages,
		ImageSize: (*regSizeMiB << 20) / int64(*regImages), Seed: 36})
	refs := append(append([]string{release}, payload...), extra)
	for _, n := range nodeCounts(b, "-regmode.nodes", *regNodes) {
		var copyBytes int64
		for _, mode := range strings.Split(*regModes, ",") {
			b.Run(fmt.Sprintf("N=%d/%s", n, mode), func(b *testing.B) {
				var elapsed time.Duration
				var sent int64
				for range b.N {
					link := fixture.NewLink(b, reg, fixture.LinkOptions{Rate: rate})
					var d time.Duration
					switch mode {
					case "ferry":
						var meta *bundle.Metadata
						d, meta = ferryRegistryMode(b, reg, link, n, release, version, extraTag)
						copyBytes = meta.SizeBytes
					case "per-node":
						d = crioPulls(b, link, n, func(int) []string { return refs })
					case "split":
						d = crioPulls(b, link, n, func(i int) (mine []string) {
							for j := i; j < len(refs); j += n {
								mine = append(mine, refs[j])
							}
							return mine
						})
					case "one":
						d = crioPulls(b, link, 1, func(int) []string { return refs })
					default:
						b.Fatalf("-regmode.modes: unknown mode %q", mode)
					}
					elapsed += d
					sent += link.Sent()
				}
				per := elapsed / time.Duration(b.N)
				sentPer := float64(sent) / float64(b.N)
				b.ReportMetric(per.Seconds(), "s/all-images")
				b.ReportMetric(sentPer, "link-B")
				// Near 1: the link was the bottleneck, not this machine.
				b.ReportMetric(per.Seconds()/(sentPer/float64(rate)), "x-linktime")
				copies := ""
				if copyBytes > 0 {
					if mode == "ferry" {
						b.ReportMetric(float64(copyBytes), "copy-B")
					}
					b.ReportMetric(sentPer/float64(copyBytes), "x-copy")
					copies = fmt.Sprintf(" = %.3f copies of the %d-byte bundle (one copy crosses the link in %.1fs)",
						sentPer/float64(copyBytes), copyBytes, float64(copyBytes)/float64(rate))
				}
				b.Logf("%s N=%d, %.1f MB/s link: every node has every image after %.1fs; %.0f bytes over the link%s",
					mode, n, *regRateMB, per.Seconds(), sentPer, copies)
			})
		}
	}
}

// ferryRegistryMode: n agents with real CRI-Os and the real API server;
// the administrator creates an UpgradeBundle whose spec.source names the
// release and an extra image. It returns the time from that creation
// until the last node had loaded every image (by the agents' own clocks:
// the loaded phase's time), after checking that every image is present
// and pinned in every node's CRI-O, and the bundle pulled.
func ferryRegistryMode(b *testing.B, reg *fixture.Registry, link *fixture.Link, n int, release, version, extra string) (time.Duration, *bundle.Metadata) {
	e := kubeenv.Start(b, runningRelease)
	e.InstallFerry()
	e.InstallUpgradeBundles(repoFile("packaging/upgradebundle-crd.yaml"))
	f := registryFleet(b, e, link, n)
	start := time.Now()
	e.PatchBundleSpec(agent.ResourceName(version, "x86_64"), map[string]any{"source": map[string]any{"release": release, "extraImages": []string{extra}}})
	var meta *bundle.Metadata
	var last time.Time
	var at []string
	for _, nd := range f.nodes {
		s := nd.A.Wait(agentBound, nd.Name+" cluster-ready", func(s agent.Status) bool {
			return s.Phase == string(agent.PhaseClusterReady) || s.Phase == string(agent.PhaseUpgrading)
		})
		loaded := s.Times[agent.PhaseLoaded]
		if loaded.IsZero() {
			b.Fatalf("%s is %s with no time for loaded: %+v", nd.Name, s.Phase, s.Times)
		}
		if loaded.After(last) {
			last = loaded
		}
		at = append(at, nd.Name+" "+phaseTimes(s.Times, start)+pullText(s.Pull))
		for _, r := range s.Bundles {
			if r.Digest == s.Digest && r.Metadata != nil {
				meta = r.Metadata
			}
		}
	}
	if meta == nil || meta.Release != release {
		b.Fatalf("the bundle pulled: %+v", meta)
	}
	for _, nd := range f.nodes {
		nd.checkPinned(b, meta, true)
	}
	b.Logf("ferry N=%d: seconds from the UpgradeBundle's creation to each phase:\n%s", n, strings.Join(at, "\n"))
	return last.Sub(start), meta
}

// crioPulls: n nodes, each with a real CRI-O in its namespace whose
// registries.conf mirrors quay.io to link; every node's CRI-O pulls
// refs(i) at once, -regmode.workers pulls in flight per node (through
// the CRI, as the MCO's PinnedImageSet does). It returns the time until
// the last pull ended, after checking every image is present.
func crioPulls(b *testing.B, link *fixture.Link, n int, refs func(i int) []string) time.Duration {
	lab := New(b, Options{Nodes: n})
	toLink := forwardPort(b, linkPort(link))
	var clients []*crio.Client
	for _, nd := range lab.Nodes() {
		toLink(nd)
		c := crioenv.StartIn(b, []string{"nsenter", "--net=/run/netns/" + nd.NS})
		link.TrustIn(b, c.Dropins.CertsDir)
		crioenv.Write(b, filepath.Join(c.Root, "etc", "containers", "registries.conf"), link.RegistriesConf())
		// registries.conf is read when CRI-O starts (or on SIGHUP,
		// applied some time later): start it again on it.
		c.Kill(b)
		c.Start(b)
		clients = append(clients, c.Client(b))
	}
	ctx := b.Context()
	errs := make([]error, n)
	took := make([]time.Duration, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i, cl := range clients {
		wg.Go(func() { took[i], errs[i] = crioenv.PullAll(ctx, cl, refs(i), *regWorkers) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	var at []string
	for i, cl := range clients {
		if errs[i] != nil {
			b.Fatalf("node%d: %v", i, errs[i])
		}
		for _, ref := range refs(i) {
			if present, _, err := cl.Status(ctx, ref); err != nil || !present {
				b.Fatalf("node%d: %s present=%v after its pull: %v", i, ref, present, err)
			}
		}
		at = append(at, fmt.Sprintf("node%d %.1fs", i, took[i].Seconds()))
	}
	b.Logf("CRI-O pulls, N=%d: done on %s", n, strings.Join(at, ", "))
	return elapsed
}

// pullText is a node's registry pull in words: where from, what it
// fetched and served.
func pullText(p *pull.Status) string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf(" (pull %s from %s: %d B fetched, %d B served)", p.State, cmp.Or(p.From, "the registry"), p.Bytes, p.Shared)
}

// phaseTimes lists the phases in times in order, as seconds since start.
func phaseTimes(times map[agent.Phase]time.Time, start time.Time) string {
	var ps []agent.Phase
	for p := range times {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b agent.Phase) int { return times[a].Compare(times[b]) })
	var out []string
	for _, p := range ps {
		out = append(out, fmt.Sprintf("%s %.1f", p, times[p].Sub(start).Seconds()))
	}
	return strings.Join(out, ", ")
}
