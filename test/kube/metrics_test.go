package kube

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/internal/testca"
	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/promenv"
)

// TestMetrics_ARealPrometheusFollowsTwoAgentsThroughALoad: a real
// Prometheus scrapes two real agents (kubelet identities, the real API
// server, a real CRI-O on node-a) as OpenShift's monitoring does: over the
// peers' TLS, checking each agent's kubelet serving certificate with the
// kubelet serving CA the cluster publishes, presenting a client
// certificate from the API server's client CA that names
// MonitoringUser. Through a load (node-a given the bundle, waiting for
// the administrator's approval, loading while its CRI-O is down, node-b
// refusing node-a's offer until then, and fetching it after), Prometheus
// sees each phase change, the refusal by its reason, the bytes
// read from the file, sent to and fetched from the peer and served to
// CRI-O, the images pinned, CRI-O's reloads and the API's answers.
// node-b has no CRI-O (one fewer to run): it fetches and holds the
// bundle, and node-a's load ends in loaded (the gate waits for node-b).
func TestMetrics_ARealPrometheusFollowsTwoAgentsThroughALoad(t *testing.T) {
	start := time.Now()
	stage := func(what string) { t.Logf("%s after %s", what, time.Since(start).Round(100*time.Millisecond)) }
	e := twoNodeCluster(t)
	b := givenBundle(t, e)
	names := []string{"node-a", "node-b"}
	var crio *crioenv.CRIO
	agents := kubeletAgents(t, e, names, func(node string, cfg *agent.Config) {
		if node == "node-a" {
			crio = crioenv.Start(t)
			crio.Configure(cfg)
		}
		cfg.Approval = "required"
	})

	// Prometheus as OpenShift's: the kubelet serving CA from the
	// cluster's ConfigMap, its metrics client certificate from the API
	// server's client CA.
	dir := t.TempDir()
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := e.Admin.Raw(t.Context(), "GET", "/api/v1/namespaces/openshift-config-managed/configmaps/kubelet-serving-ca", "", nil, &cm); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "kubelet-serving-ca.crt")
	if err := os.WriteFile(caFile, []byte(cm.Data["ca-bundle.crt"]), 0o644); err != nil {
		t.Fatal(err)
	}
	cert, key := e.ClientCA.Issue(t, testca.Cert{CN: peer.MonitoringUser, Client: true})
	certFile := testca.WriteCurrent(t, dir, "metrics-client", cert, key)
	job := promenv.Job{Name: "ferry", CAFile: caFile, CertFile: certFile, KeyFile: certFile, Interval: 500 * time.Millisecond,
		Labels: map[string]map[string]string{}}
	for _, n := range names {
		addr := agents[n].Cfg.Peer.Listen
		job.Targets = append(job.Targets, addr)
		job.Labels[addr] = map[string]string{"node": n}
	}
	prom := promenv.Start(t, job)
	prom.WaitFor(bound, "both agents scraped", `count(up{job="ferry"} == 1) == 2`)
	stage("both agents scraped")

	fi, err := os.Stat(b.tar)
	if err != nil {
		t.Fatal(err)
	}
	tarSize := float64(fi.Size())
	if out, err := agents["node-a"].Ferry("load", b.tar); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	phase := func(node, p string) string {
		return fmt.Sprintf(`ferry_bundle_phase{node=%q,digest=%q,phase=%q} == 1`, node, b.digest, p)
	}
	prom.WaitFor(bound, "node-a's bundle waiting for approval", phase("node-a", "extracted"))
	// node-b is offered it by node-a and refuses it: nothing approves it.
	prom.WaitFor(bound, "node-b refusing the offer", `ferry_refusals_total{node="node-b",reason="NotApproved"} >= 1`)

	// node-a's CRI-O is down when the administrator approves: node-a
	// waits in loading until it comes back.
	crio.Kill(t)
	e.ApproveRelease(b.meta.Release)
	e.PatchBundleSpec(b.name, map[string]any{"approvedDigest": b.digest, "schedule": "Manual"})
	prom.WaitFor(bound, "node-a loading", phase("node-a", "loading"))
	stage("node-a seen loading")
	crio.Start(t)
	// Generous: pulls on a busy two-core machine have taken over two
	// minutes.
	prom.WaitFor(2*bound, "node-b holding the bundle", phase("node-b", "extracted"))
	prom.WaitFor(2*bound, "node-a loaded", phase("node-a", "loaded"))
	stage("node-a seen loaded")
	for _, l := range strings.Split(agents["node-a"].Logs(), "\n") {
		if strings.Contains(l, "bundle images loaded and pinned") {
			t.Log(l)
		}
	}

	// What Prometheus recorded, asked as a dashboard would.
	value := func(q string) float64 {
		t.Helper()
		got, err := prom.Query(context.Background(), q)
		if err != nil || len(got) != 1 {
			t.Fatalf("%s: %v, %v", q, got, err)
		}
		return got[0].Value
	}
	seen := func(node, p string) string {
		return fmt.Sprintf(`max_over_time(ferry_bundle_phase{node=%q,digest=%q,phase=%q}[1h])`, node, b.digest, p)
	}
	for _, c := range []struct {
		what string
		q    string
		ok   func(float64) bool
	}{
		{"node-a was extracted", seen("node-a", "extracted"), eq(1)},
		{"node-a was loading", seen("node-a", "loading"), eq(1)},
		{"node-a is no longer loading", `ferry_bundle_phase{node="node-a",phase="loading"}`, eq(0)},
		{"node-a read the tar from the file", `ferry_fetched_bytes_total{node="node-a",source="file"}`, eq(tarSize)},
		{"node-a served the tar to node-b", `ferry_served_bytes_total{node="node-a",kind="peer"}`, atLeast(tarSize)},
		{"node-b fetched the tar from node-a", `ferry_fetched_bytes_total{node="node-b",source="peer"}`, atLeast(tarSize)},
		{"node-a's registry served CRI-O", `ferry_served_bytes_total{node="node-a",kind="registry"}`, atLeast(1)},
		{"every image pinned on node-a", `count(ferry_images_pinned{node="node-a"} == ferry_images_expected and ferry_images_expected > 0)`, eq(1)},
		{"node-a reloaded CRI-O", `sum(ferry_crio_reloads_total{node="node-a",result="ok"})`, atLeast(1)},
		{"the API answered node-b", `sum(ferry_api_requests_total{node="node-b",code=~"2.."})`, atLeast(1)},
		{"each says whether it is healthy", `count(ferry_node_healthy)`, eq(2)},
	} {
		v := value(c.q)
		if !c.ok(v) {
			t.Errorf("%s: %s = %v", c.what, c.q, v)
		}
		t.Logf("%s: %s = %v", c.what, c.q, v)
	}
}

func eq(want float64) func(float64) bool      { return func(v float64) bool { return v == want } }
func atLeast(want float64) func(float64) bool { return func(v float64) bool { return v >= want } }
