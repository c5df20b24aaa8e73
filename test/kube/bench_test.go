package kube

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// BenchmarkAgentIdleRSSWithKubeconfig: a ferry agent with a kubeconfig
// (annotating its Node, reading ClusterVersion) idles for 15 s against a
// real API server; reports its RSS (test/bench/p4-agent.sh prints it).
func BenchmarkAgentIdleRSSWithKubeconfig(b *testing.B) {
	e := kubeenv.Start(b, current)
	e.AddNode("bench", "127.0.0.1")
	e.InstallFerry()
	cfg := ferryenv.Config(b.TempDir())
	cfg.NodeName = "bench"
	cfg.Cluster.Kubeconfig = e.NodeKubeconfig("bench")
	for range b.N {
		a := ferryenv.Start(b, cfg)
		a.WaitPhase(time.Minute, "idle")
		deadline := time.Now().Add(time.Minute)
		for e.Annotations("bench")["ferry.io/phase"] != "idle" {
			if time.Now().After(deadline) {
				b.Fatalf("the agent never annotated its Node:\n%s", a.Logs())
			}
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(15 * time.Second)
		b.ReportMetric(float64(vmRSS(b, a.Cmd.Process.Pid))/(1<<20), "idle-rss-MiB")
		a.Stop()
	}
}

func vmRSS(b testing.TB, pid int) int64 {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
