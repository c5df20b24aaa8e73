package kube

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/fixture"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// The test plays the machine config operator as it plays the version
// operator: it writes the pools (spec and status) and each Node's
// machineconfiguration.openshift.io annotations, as the MCO and its
// daemon do, against OpenShift's real MachineConfigPool CRD.

const (
	workerRole = "node-role.kubernetes.io/worker"
	oldConfig  = "rendered-worker-0b5e4c6a1f2d"
	newConfig  = "rendered-worker-7d1e9a03c8b4"
)

func TestClient_TheMachineConfigStateWithOnlyFerrysRBAC(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "10.0.0.1")
	e.AddNode("infra-a", "10.0.0.2")
	c := ferryClient(t, e)
	ctx := t.Context()

	// No MCO: no annotations, no pools (not even their CRD).
	st, err := c.MachineConfigState(ctx, "node-a")
	if err != nil || st.Managed {
		t.Fatalf("a Node without the MCO: %+v, %v", st, err)
	}
	if n, known, err := c.MachineCount(ctx); known || err != nil {
		t.Fatalf("no MCP CRD: MachineCount %d %v %v, want not known", n, known, err)
	}

	e.InstallMachineConfigPools()
	e.LabelNode("node-a", map[string]string{workerRole: ""})
	e.LabelNode("infra-a", map[string]string{workerRole: "", "node-role.kubernetes.io/infra": ""})
	e.SetPool(kubeenv.MachineConfigPool{Name: "master", NodeSelector: map[string]string{"node-role.kubernetes.io/master": ""}, Target: "rendered-master-1", Current: "rendered-master-1"})
	e.SetPool(kubeenv.MachineConfigPool{Name: "worker", NodeSelector: map[string]string{workerRole: ""}, Target: newConfig, Current: oldConfig, Machines: 2, Updated: 0})
	e.SetPool(kubeenv.MachineConfigPool{Name: "infra", NodeSelector: map[string]string{"node-role.kubernetes.io/infra": ""}, Paused: true, Target: "rendered-infra-2", Current: "rendered-infra-1", Machines: 1})
	e.SetMachineConfig("node-a", "Working", oldConfig, newConfig)
	e.SetMachineConfig("infra-a", "Done", "rendered-infra-1", "rendered-infra-1")

	st, err = c.MachineConfigState(ctx, "node-a")
	want := cluster.NodeUpdate{Managed: true, State: "Working", Current: oldConfig, Desired: newConfig, Pool: "worker", Target: newConfig}
	if err != nil || st != want {
		t.Fatalf("node-a: %+v, %v; want %+v", st, err, want)
	}
	// The MCO's count of nodes: each pool's status.machineCount, summed,
	// read with ferry's rights (master counts none here).
	if n, known, err := c.MachineCount(ctx); n != 3 || !known || err != nil {
		t.Fatalf("MachineCount %d %v %v, want 3 (worker 2, infra 1)", n, known, err)
	}
	// A custom pool's node matches worker's selector too: the custom pool
	// is its pool, as the MCO has it.
	st, err = c.MachineConfigState(ctx, "infra-a")
	if err != nil || st.Pool != "infra" || !st.Paused || st.Target != "rendered-infra-2" || st.State != "Done" {
		t.Fatalf("infra-a: %+v, %v", st, err)
	}

	// Without ferry's rights, the error names the resource.
	nobody, err := kube.New(e.NobodyKubeconfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nobody.MachineConfigState(ctx, "node-a"); !errors.Is(err, kube.ErrForbidden) || !strings.Contains(err.Error(), "nodes") {
		t.Fatalf("without rights: %v", err)
	}
}

// TestAgent_KeepsItsMirrorUntilTheMCOIsDoneWithTheNode: one node, real
// CRI-O, the real API with ferry's RBAC. ClusterVersion says Completed
// while the worker pool is paused, then while the MCO updates this node:
// the node keeps its bundle's registry, mirror and certs.d entry and says
// what it waits for, in its status and on its Node; once its daemon says
// Done on the new rendered config, they go.
func TestAgent_KeepsItsMirrorUntilTheMCOIsDoneWithTheNode(t *testing.T) {
	c := crioenv.Start(t)
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "127.0.0.1")
	e.InstallFerry()
	e.InstallMachineConfigPools()
	e.LabelNode("node-a", map[string]string{workerRole: ""})
	worker := kubeenv.MachineConfigPool{Name: "worker", NodeSelector: map[string]string{workerRole: ""}, Target: oldConfig, Current: oldConfig, Machines: 1, Updated: 1}
	e.SetPool(worker)
	e.SetMachineConfig("node-a", "Done", oldConfig, oldConfig)
	tarPath, meta := releaseBundle(t)
	e.ApproveRelease(meta.Release) // the administrator's one command (ferry bundle verify prints it)

	a := nodeAgent(t, e, tarPath, func(cfg *agent.Config) { c.Configure(cfg) })
	a.WaitPhase(bound, agent.PhaseClusterReady)
	a.Wait(bound, "the config from before the upgrade recorded", func(s agent.Status) bool {
		for _, r := range s.Bundles {
			if r.MachineConfig == oldConfig {
				return true
			}
		}
		return false
	})
	waitUntil(t, "the upgrade asked for", func() bool { du := e.DesiredUpdate(); return du != nil && du["image"] == meta.Release })

	// The control plane upgrades; the MCO renders the worker pool's new
	// config, but the pool is paused.
	e.SetHistory(kubeenv.History{State: "Partial", Image: meta.Release, Version: meta.Version}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	a.WaitPhase(bound, agent.PhaseUpgrading)
	worker.Paused, worker.Target, worker.Updated = true, newConfig, 0
	e.SetPool(worker)
	e.SetHistory(kubeenv.History{State: "Completed", Image: meta.Release, Version: meta.Version}, kubeenv.History{State: "Completed", Image: current, Version: "4.13.6"})
	keepsTheBundle(t, e, a, c, agent.ReasonPoolPaused)

	// Unpaused: the MCO sends this node to the new config; its daemon works.
	worker.Paused = false
	e.SetPool(worker)
	e.SetMachineConfig("node-a", "Working", oldConfig, newConfig)
	keepsTheBundle(t, e, a, c, agent.ReasonNodeUpdating)

	// Done on the new rendered config: the registry, mirror and certs.d
	// entry go; the pins stay.
	e.SetMachineConfig("node-a", "Done", newConfig, newConfig)
	worker.Current, worker.Updated = newConfig, 1
	e.SetPool(worker)
	a.Wait(bound, "cleaned up", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseUpgraded) && s.Reason == agent.ReasonUpgraded
	})
	waitUntil(t, "the waiting reason gone from the Node", func() bool { return e.Annotations("node-a")["ferry.io/reason"] == "" })
	if _, err := os.Stat(filepath.Join(c.Dropins.RegistriesConfDir, crio.DropinName)); !os.IsNotExist(err) {
		t.Error("the mirror drop-in outlived the MCO's update")
	}
	if ents, _ := os.ReadDir(c.Dropins.CertsDir); len(ents) != 0 {
		t.Errorf("certs.d entries left: %v", ents)
	}
	if _, err := os.Stat(filepath.Join(a.Cfg.Paths.ExtractDir, meta.DirName(), bundle.MetadataName)); err != nil {
		t.Errorf("the running release's tree is not kept after the MCO's update: %v", err)
	}
	if registryAnswers(t, a.Cfg) {
		t.Error("the embedded registry still answers")
	}
	cl := c.Client(t)
	for _, ref := range bundle.PullRefs(meta.AllImages()) {
		if present, pinned, err := cl.Status(context.Background(), ref); err != nil || !present || !pinned {
			t.Errorf("%s: present %v pinned %v (%v): the pins stay until the next upgrade", ref, present, pinned, err)
		}
	}
}

// keepsTheBundle waits for the node to say why it waits (the reason why),
// in its status and, in words, on its Node, and checks that its registry, mirror and certs.d entry
// are all still there.
func keepsTheBundle(t *testing.T, e *kubeenv.Env, a *ferryenv.Agent, c *crioenv.CRIO, why string) {
	t.Helper()
	s := a.Wait(bound, "the reason "+why, func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseUpgraded) && s.Reason == why
	})
	waitUntil(t, "the reason on the Node", func() bool {
		ann := e.Annotations("node-a")
		return ann["ferry.io/phase"] == "upgraded" && ann["ferry.io/reason"] == s.Message
	})
	if _, err := os.Stat(filepath.Join(c.Dropins.RegistriesConfDir, crio.DropinName)); err != nil {
		t.Fatalf("the mirror drop-in went while the node still needs it: %v", err)
	}
	if ents, _ := os.ReadDir(c.Dropins.CertsDir); len(ents) == 0 {
		t.Fatal("the certs.d entry went while the node still needs it")
	}
	if !registryAnswers(t, a.Cfg) {
		t.Fatal("the embedded registry stopped while the node still needs it")
	}
}

// registryAnswers reports whether the embedded registry listens at the
// port it keeps.
func registryAnswers(t *testing.T, cfg agent.Config) bool {
	t.Helper()
	port, err := os.ReadFile(filepath.Join(cfg.Paths.StateDir, "registry", "port"))
	if err != nil {
		t.Fatalf("the registry's kept port: %v", err)
	}
	conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strings.TrimSpace(string(port)), time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

const bound = 3 * time.Minute

// releaseBundle makes a small release's bundle with ferry bundle create.
func releaseBundle(t *testing.T) (string, *bundle.Metadata) {
	t.Helper()
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: 3, Seed: 7})
	out := t.TempDir()
	args := []string{"bundle", "create", "--release", release, "--mirror", reg.Mirror(), "--cert-dir", reg.CertsDir, "--output", out}
	if b, err := exec.Command(ferryenv.Binary(t), args...).CombinedOutput(); err != nil {
		t.Fatalf("ferry bundle create: %v\n%s", err, b)
	}
	tarPath := filepath.Join(out, "upgrade-4.13.7-x86_64.tar")
	meta, err := bundle.InspectFile(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	return tarPath, meta
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
