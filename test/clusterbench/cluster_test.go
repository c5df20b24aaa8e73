package clusterbench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/testca"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/fixture"
	"github.com/ferry-edge/ferry/test/freeport"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// The cluster the benchmark runs: the real kube-apiserver (kubeenv) with
// ferry's RBAC, admission policies and CRDs and OpenShift's
// MachineConfigPool CRD; N Nodes, each with a real `ferry agent` process
// holding only that node's kubelet credential (a client certificate of
// the API server's client CA) and serving certificate, its peer server
// on a loopback address of its own (127.0.x.y, the Node's InternalIP and
// so its Lease's address, which the others dial), and a CRI-O stand-in
// (StartCRI). The harness plays the administrator, the version operator
// and the machine config operator, as test/kube does.

const (
	current    = "quay.io/openshift-release-dev/ocp-release@sha256:1111111111111111111111111111111111111111111111111111111111111111"
	workerRole = "node-role.kubernetes.io/worker"
	oldConfig  = "rendered-worker-0b5e4c6a1f2d"
	newConfig  = "rendered-worker-7d1e9a03c8b4"
)

type cluster struct {
	b      testing.TB
	e      *kubeenv.Env
	names  []string
	agents []*ferryenv.Agent
	tar    string
	meta   *bundle.Metadata
	name   string // the UpgradeBundle's
	digest string // the bundle's, as the engineer's .sha256 says
	// reads are the harness's own reads in the flow (count, bytes by
	// "VERB resource", as the server counts them), taken off its figures.
	reads    map[string][2]float64
	lastRead float64 // the size of ClusterVersion as last read
}

// desiredUpdate is ClusterVersion's spec.desiredUpdate.image, read as the
// harness's own (counted) read.
func (c *cluster) desiredUpdate() string {
	var raw json.RawMessage
	if err := c.e.Admin.Raw(context.Background(), "GET", "/apis/config.openshift.io/v1/clusterversions/version", "", nil, &raw); err != nil {
		c.b.Fatal(err)
	}
	c.lastRead = float64(len(raw))
	c.countRead("GET clusterversions")
	var cv struct {
		Spec struct {
			DesiredUpdate struct {
				Image string `json:"image"`
			} `json:"desiredUpdate"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(raw, &cv); err != nil {
		c.b.Fatal(err)
	}
	return cv.Spec.DesiredUpdate.Image
}

// countRead counts one read of the harness's, of ClusterVersion's size.
func (c *cluster) countRead(key string) {
	if c.reads == nil {
		c.reads = map[string][2]float64{}
	}
	r := c.reads[key]
	c.reads[key] = [2]float64{r[0] + 1, r[1] + c.lastRead}
}

// nodeIP is node i's loopback address: 127.0.1.1, 127.0.1.2, …
func nodeIP(i int) string { return fmt.Sprintf("127.0.%d.%d", 1+i/250, 1+i%250) }

// newCluster sets up the API server and n Nodes as a running cluster has
// them (labelled workers, Ready, the MCO done on oldConfig), the
// administrator's empty UpgradeBundle and the release approved in
// ferry-admission; no agent runs yet.
func newCluster(b testing.TB, n int) *cluster {
	b.Helper()
	c := &cluster{b: b}
	c.tar, c.meta = releaseBundle(b)
	c.name = agent.ResourceName(c.meta.Version, c.meta.Arch)
	sha, err := os.ReadFile(strings.TrimSuffix(c.tar, ".tar") + ".sha256")
	if err != nil {
		b.Fatal(err)
	}
	c.digest = "sha256:" + strings.Fields(string(sha))[0]

	e := kubeenv.Start(b, current)
	c.e = e
	e.InstallFerry()
	e.InstallUpgradeBundles(repoFile("packaging/upgradebundle-crd.yaml"))
	e.InstallMachineConfigPools()
	for i := range n {
		name := fmt.Sprintf("node-%03d", i)
		c.names = append(c.names, name)
		e.AddNode(name, nodeIP(i))
		e.LabelNode(name, map[string]string{workerRole: ""})
		e.SetMachineConfig(name, "Done", oldConfig, oldConfig)
		e.SetNodeReady(name, true, time.Now())
	}
	e.SetPool(kubeenv.MachineConfigPool{Name: "worker", NodeSelector: map[string]string{workerRole: ""}, Target: oldConfig, Current: oldConfig, Machines: n, Updated: n})
	e.CreateBundle(c.name)
	e.ApproveRelease(c.meta.Release)
	return c
}

// startAgents starts every node's agent with its CRI-O stand-in (pulls
// taking pullDelay) and waits until each is idle and has written its
// record (its Lease) for the others.
func (c *cluster) startAgents(pullDelay time.Duration) {
	b, e := c.b, c.e
	b.Helper()
	servingCA := testca.New(b, "kubelet-signer")
	e.Create("/api/v1/namespaces/openshift-config-managed/configmaps", map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "kubelet-serving-ca"}, "data": map[string]any{"ca-bundle.crt": string(servingCA.PEM)}})
	// One peer port for every node (a node dials its peers' Lease
	// addresses at its own port), free on every node's address.
	port := peerPort(b, len(c.names))
	for i, n := range c.names {
		root := b.TempDir()
		cfg := ferryenv.Config(root)
		cfg.NodeName = n
		cfg.Approval = "required"
		cfg.Media.Detect = "manual"
		cfg.Cluster.Kubeconfig = e.NodeCertKubeconfig(n)
		// As on a node: CRI-O's directories exist.
		for _, d := range []string{filepath.Join(root, "pki"), cfg.Paths.CertsDir, cfg.Paths.CRIOConfDir, cfg.Paths.RegistriesConfDir} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		cert, key := servingCA.Serving(b, n, nodeIP(i))
		cfg.Peer.Cert = testca.WriteCurrent(b, filepath.Join(root, "pki"), "kubelet-server", cert, key)
		cfg.Peer.Identity = "node"
		cfg.Peer.Listen = net.JoinHostPort(nodeIP(i), strconv.Itoa(port))
		for _, d := range []string{cfg.Paths.CertsDir, cfg.Paths.CRIOConfDir, cfg.Paths.RegistriesConfDir} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		cri := StartCRI(b, filepath.Join(root, "crio"), cfg.Paths.CRIOConfDir, cfg.Paths.RegistriesConfDir, pullDelay)
		cfg.CRIO.Socket, cfg.CRIO.Reload = cri.Socket, "none"
		c.agents = append(c.agents, ferryenv.StartIn(b, sourcePrefix(b, n, nodeIP(i)), cfg))
	}
	c.waitAll(10*time.Minute, "idle", func(s agent.Status) bool { return s.Phase == string(agent.PhaseIdle) })
	c.waitRecords(10 * time.Minute)
}

// waitRecords waits until every node has written its record (its Lease),
// reading them all in one list a second: at N=100 a read of each, with
// 100 agents starting, outran the client's timeout. A read the busy
// server does not answer is tried again until timeout.
func (c *cluster) waitRecords(timeout time.Duration) {
	c.b.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	missing := c.names
	for {
		var list struct {
			Items []struct {
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
			} `json:"items"`
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		err := c.e.Admin.Raw(ctx, "GET", "/apis/coordination.k8s.io/v1/namespaces/openshift-ferry/leases", "", nil, &list)
		cancel()
		if err == nil {
			have := map[string]bool{}
			for _, l := range list.Items {
				have[l.Metadata.Name] = true
			}
			missing = slices.DeleteFunc(slices.Clone(c.names), func(n string) bool { return have[n] })
			if len(missing) == 0 {
				return
			}
		} else {
			lastErr = err
		}
		if time.Now().After(deadline) {
			n := missing[0]
			c.b.Fatalf("%d nodes never wrote their Lease (last error listing them: %v); %s's log:\n%s", len(missing), lastErr, n, tail(c.agents[slices.Index(c.names, n)].Logs(), 6000))
		}
		time.Sleep(time.Second)
	}
}

// peerPort is a port from freeport that every node's address can bind.
func peerPort(b testing.TB, n int) int {
	b.Helper()
	for range 20 {
		p := freeport.Port(b, "127.0.0.1")
		ok := true
		for i := range n {
			l, err := net.Listen("tcp", net.JoinHostPort(nodeIP(i), strconv.Itoa(p)))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return p
		}
	}
	b.Fatal("no port free on every node's address")
	return 0
}

// waitAll waits until cond holds for every agent's status; on timeout it
// fails with how many nodes stand where.
func (c *cluster) waitAll(timeout time.Duration, what string, cond func(agent.Status) bool) {
	c.b.Helper()
	deadline := time.Now().Add(timeout)
	left := slices.Clone(c.agents)
	last := map[*ferryenv.Agent]agent.Status{}
	for len(left) > 0 {
		var still []*ferryenv.Agent
		for _, a := range left {
			select {
			case <-a.Exited():
				c.b.Fatalf("%s exited while waiting for %s:\n%s", a.Cfg.NodeName, what, a.Logs())
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s, err := a.Status(ctx)
			cancel()
			if err == nil {
				last[a] = s
			}
			if err != nil || !cond(s) {
				still = append(still, a)
			}
		}
		left = still
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			where := map[string]int{}
			for _, a := range left {
				s := last[a]
				where[s.Phase+" "+s.Reason]++
			}
			var lines []string
			for _, k := range slices.Sorted(maps.Keys(where)) {
				lines = append(lines, fmt.Sprintf("  %d nodes: %s", where[k], k))
			}
			c.b.Fatalf("timed out after %s waiting for %s: %d of %d nodes not there:\n%s\n%s's log:\n%s",
				timeout, what, len(left), len(c.agents), strings.Join(lines, "\n"), left[0].Cfg.NodeName, tail(left[0].Logs(), 6000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// approvalSeen is when each agent logged the cluster's approval of
// digest (its log's own time), for those that did.
func (c *cluster) approvalSeen() map[string]time.Time {
	out := map[string]time.Time{}
	hex := strings.TrimPrefix(c.digest, "sha256:")
	for _, a := range c.agents {
		sc := bufio.NewScanner(strings.NewReader(a.Logs()))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, "approved digests from the cluster's UpgradeBundles") || !strings.Contains(line, hex) {
				continue
			}
			if at, ok := logTime(line); ok {
				out[a.Cfg.NodeName] = at
				break
			}
		}
	}
	return out
}

// logTime is the time= of a slog text line.
func logTime(line string) (time.Time, bool) {
	v, ok := strings.CutPrefix(line, "time=")
	if !ok {
		return time.Time{}, false
	}
	v, _, _ = strings.Cut(v, " ")
	t, err := time.Parse(time.RFC3339Nano, v)
	return t, err == nil
}

// releaseBundle makes a small release's bundle with ferry bundle create
// (three payload images and the release image).
func releaseBundle(b testing.TB) (string, *bundle.Metadata) {
	b.Helper()
	reg := fixture.NewRegistry(b)
	release, _ := reg.PushRelease(b, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: 3, Seed: 7})
	out := b.TempDir()
	args := []string{"bundle", "create", "--release", release, "--mirror", reg.Mirror(), "--cert-dir", reg.CertsDir, "--output", out}
	if o, err := exec.Command(ferryenv.Binary(b), args...).CombinedOutput(); err != nil {
		b.Fatalf("ferry bundle create: %v\n%s", err, o)
	}
	tarPath := filepath.Join(out, "upgrade-4.13.7-x86_64.tar")
	meta, err := bundle.InspectFile(tarPath)
	if err != nil {
		b.Fatal(err)
	}
	return tarPath, meta
}

func repoFile(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", name)
}
