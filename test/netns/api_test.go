package netns

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/test/cvoverify"
	"github.com/ferry-edge/ferry/test/fixture"
	"github.com/ferry-edge/ferry/test/kubeenv"
	"github.com/ferry-edge/ferry/test/releasesig"
)

const runningRelease = "quay.io/openshift-release-dev/ocp-release@sha256:1111111111111111111111111111111111111111111111111111111111111111"

// forwardAPI makes the API server (on the host's loopback) reachable from
// inside the lab's namespaces at 127.0.0.1:<its port>: a unix socket on
// the shared file system joins the two sides (the host's own network is
// not touched). It returns the Setup to pass to newFleet: each node gets
// its Node and its own credential (a token bound to its Node).
func forwardAPI(t testing.TB, e *kubeenv.Env) func(n *Node, cfg *agent.Config) {
	fwd := forwardPort(t, e.Port)
	return func(n *Node, cfg *agent.Config) {
		fwd(n)
		e.AddNode(n.Name, n.IP)
		cfg.Cluster.Kubeconfig = e.NodeKubeconfig(n.Name)
	}
}

// forwardPort makes the host's 127.0.0.1:port reachable at 127.0.0.1:port
// inside each node it is called for (socat there, through a unix socket):
// the nodes' namespaces cannot reach the host's loopback otherwise, and
// the same address keeps a server's certificate valid.
func forwardPort(t testing.TB, port int) func(n *Node) {
	sock := fixture.ForwardUnix(t, "127.0.0.1:"+strconv.Itoa(port))
	return func(n *Node) {
		n.Start("forward-"+strconv.Itoa(port), "socat", "TCP-LISTEN:"+strconv.Itoa(port)+",bind=127.0.0.1,fork,reuseaddr", "UNIX-CONNECT:"+sock)
	}
}

func repoFile(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", name)
}

// TestAgents_ThreeNodesOneAPIServerOneUpgrade: a stick on A; every node
// loads; exactly one desiredUpdate patch (from A, with the signature
// ConfigMap); the test, as the version operator, upgrades; every node
// follows to upgraded, annotated on its Node, its files gone, its pins kept.
func TestAgents_ThreeNodesOneAPIServerOneUpgrade(t *testing.T) {
	e := kubeenv.Start(t, runningRelease)
	e.InstallFerry()
	f := newFleet(t, fleetOptions{Nodes: 3, CRIO: true, Setup: forwardAPI(t, e)})
	reg := fixture.NewRegistry(t)
	tarPath, meta, digest := realBundle(t, reg, "4.13.7", 0, "--signature-store", reg.SignatureStore(t))
	e.ApproveRelease(meta.Release) // the administrator's one command (ferry bundle verify prints it)
	a := f.nodes[0]
	gen := e.Generation()

	a.load(t, tarPath)
	for _, n := range f.nodes {
		n.waitHolds(t, agent.PhaseClusterReady, digest)
	}
	waitFor(t, "desiredUpdate to name the bundle's release", func() bool {
		du := e.DesiredUpdate()
		return du != nil && du["image"] == meta.Release && du["force"] == false
	})
	hex := strings.TrimPrefix(meta.Release[strings.Index(meta.Release, "@")+1:], "sha256:")
	if _, data, ok := e.ConfigMap("openshift-config-managed", "sha256-"+hex); !ok || len(data) != 1 {
		t.Fatalf("signature ConfigMap: %v %q", ok, data)
	}
	cvo, err := cvoverify.Trusting(releasesig.Test().PublicArmored(), e.Admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := cvo.VerifyDesiredUpdate(t.Context()); err != nil {
		t.Fatalf("the version operator's verifier refuses the request: %v", err)
	}
	waitFor(t, "A's hook after the API accepted the upgrade", func() bool { return len(hookLines(t, a.Hook)) == 1 })

	e.SetHistory(kubeenv.History{State: "Partial", Image: meta.Release, Version: "4.13.7"}, kubeenv.History{State: "Completed", Image: runningRelease, Version: "4.13.6"})
	const working = "Working towards 4.13.7: 9 of 841 done (1% complete)"
	e.SetConditions(kubeenv.Condition{Type: "Progressing", Status: "True", Message: working})
	for _, n := range f.nodes {
		// Two writes: a node may show upgrading before the progress.
		n.A.Wait(agentBound, n.Name+" upgrading, with the operator's progress", func(s agent.Status) bool {
			return s.Phase == string(agent.PhaseUpgrading) && s.ClusterMessage == working
		})
	}
	waitFor(t, "every Node annotated upgrading", func() bool {
		for _, n := range f.nodes {
			if ann := e.Annotations(n.Name); ann["ferry.io/phase"] != "upgrading" || ann["ferry.io/digest"] != digest || ann["ferry.io/bundle"] != "4.13.7-x86_64" {
				return false
			}
		}
		return true
	})

	e.SetHistory(kubeenv.History{State: "Completed", Image: meta.Release, Version: "4.13.7"}, kubeenv.History{State: "Completed", Image: runningRelease, Version: "4.13.6"})
	e.SetConditions(kubeenv.Condition{Type: "Progressing", Status: "False", Message: "Cluster version is 4.13.7"})
	for _, n := range f.nodes {
		n.A.Wait(agentBound, "upgraded and cleaned up", func(s agent.Status) bool {
			return s.Phase == string(agent.PhaseUpgraded) && s.Reason == agent.ReasonUpgraded
		})
		if _, err := os.Stat(filepath.Join(n.Cfg.Paths.ExtractDir, meta.DirName(), bundle.MetadataName)); err != nil {
			t.Errorf("%s: the running release's tree is not kept: %v", n.Name, err)
		}
		n.checkPinned(t, meta, true)
	}
	waitFor(t, "every Node annotated upgraded", func() bool {
		for _, n := range f.nodes {
			if e.Annotations(n.Name)["ferry.io/phase"] != "upgraded" {
				return false
			}
		}
		return true
	})
	out, err := f.nodes[1].A.Ferry("status", "--cluster")
	if err != nil || !strings.Contains(out, "in the cluster's API") || strings.Count(out, "upgraded") < 3 {
		t.Errorf("ferry status --cluster on %s: %v\n%s", f.nodes[1].Name, err, out)
	}
	if g := e.Generation(); g != gen+1 {
		t.Errorf("ClusterVersion's spec changed %d times, want exactly one desiredUpdate patch", g-gen)
	}
	if got := hookLines(t, a.Hook); len(got) != 1 {
		t.Errorf("A's hook ran %d times", len(got))
	}
}

// TestAgents_ARefusedReleaseIsShownOnEveryNode: the version operator
// refuses the release (it cannot verify it); every node says why in its
// status and on its Node, and none goes on.
func TestAgents_ARefusedReleaseIsShownOnEveryNode(t *testing.T) {
	e := kubeenv.Start(t, runningRelease)
	e.InstallFerry()
	f := newFleet(t, fleetOptions{Nodes: 3, CRIO: true, Setup: forwardAPI(t, e)})
	reg := fixture.NewRegistry(t)
	tarPath, meta, digest := realBundle(t, reg, "4.13.7", 5, "--signature-store", "")
	e.ApproveRelease(meta.Release)
	f.nodes[0].load(t, tarPath)
	for _, n := range f.nodes {
		n.waitHolds(t, agent.PhaseClusterReady, digest)
	}
	waitFor(t, "desiredUpdate", func() bool { du := e.DesiredUpdate(); return du != nil && du["image"] == meta.Release })
	e.SetConditions(kubeenv.Condition{Type: "ReleaseAccepted", Status: "False", Reason: "RetrievePayload",
		Message: "The update cannot be verified: unable to verify " + meta.Release + " against keyrings: verifier-public-key-redhat"})
	for _, n := range f.nodes {
		s := n.A.Wait(agentBound, "the refusal", func(s agent.Status) bool {
			return s.Reason == agent.ReasonReleaseRefused
		})
		if s.Healthy || s.Phase != string(agent.PhaseClusterReady) {
			t.Errorf("%s: %+v", n.Name, s)
		}
	}
	waitFor(t, "the refusal on every Node", func() bool {
		for _, n := range f.nodes {
			if !strings.Contains(e.Annotations(n.Name)["ferry.io/reason"], "cannot be verified") {
				return false
			}
		}
		return true
	})
}
