package e2e

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/cvoverify"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/fixture"
	"github.com/ferry-edge/ferry/test/kubeenv"
	"github.com/ferry-edge/ferry/test/releasesig"
)

const runningRelease = "quay.io/openshift-release-dev/ocp-release@sha256:1111111111111111111111111111111111111111111111111111111111111111"

func repoFile(name string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", name)
}

// releaseBundle makes the bundle of a release (payload by seed) plus a
// custom image every release of the site carries, with the release's
// signature fetched from a signature store as Red Hat's serves it.
func releaseBundle(t *testing.T, reg *fixture.Registry, version string, seed uint64) (string, *bundle.Metadata) {
	t.Helper()
	return createBundleFrom(t, reg, fixture.ReleaseOptions{Version: version, PayloadImages: 4, Seed: seed},
		"--signature-store", reg.SignatureStore(t))
}

// upgradeOnce takes one bundle through the whole loop with the test as the
// cluster version operator, checking what a node shows at each step.
func upgradeOnce(t *testing.T, e *kubeenv.Env, a *ferryenv.Agent, reg *fixture.Registry, tarPath string, meta *bundle.Metadata, previous string) {
	t.Helper()
	if out, err := a.Ferry("load", tarPath); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	a.WaitPhase(bound, agent.PhaseClusterReady)
	waitDesired(t, e, meta.Release)
	if du := e.DesiredUpdate(); du["force"] != false || du["version"] != meta.Version {
		t.Fatalf("desiredUpdate %v", du)
	}
	hex := strings.TrimPrefix(meta.Release[strings.Index(meta.Release, "@")+1:], "sha256:")
	labels, data, ok := e.ConfigMap("openshift-config-managed", "sha256-"+hex)
	if _, labelled := labels["release.openshift.io/verification-signatures"]; !ok || !labelled || len(data) != 1 {
		t.Fatalf("signature ConfigMap: exists %v, labels %v, data %q", ok, labels, data)
	}
	checkSignature(t, e, reg, meta, data["sha256-"+hex+"-1"])
	waitAnnotated(t, e, "cluster-ready")

	e.SetHistory(kubeenv.History{State: "Partial", Image: meta.Release, Version: meta.Version}, kubeenv.History{State: "Completed", Image: previous, Version: "old"})
	e.SetConditions(kubeenv.Condition{Type: "Progressing", Status: "True", Message: "Working towards " + meta.Version + ": 300 of 841 done (35% complete)"})
	// The history and the conditions are two writes: the node may show
	// upgrading before it has read the operator's progress.
	a.Wait(bound, "upgrading, with the operator's progress in the status line", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseUpgrading) && s.ClusterMessage == "Working towards "+meta.Version+": 300 of 841 done (35% complete)"
	})
	waitAnnotated(t, e, "upgrading")
	waitUntil(t, "the operator's progress annotated", func() bool {
		return strings.Contains(e.Annotations("node-a")["ferry.io/progress"], "300 of 841")
	})

	e.SetHistory(kubeenv.History{State: "Completed", Image: meta.Release, Version: meta.Version}, kubeenv.History{State: "Completed", Image: previous, Version: "old"})
	e.SetConditions(kubeenv.Condition{Type: "Progressing", Status: "False", Message: "Cluster version is " + meta.Version})
	a.Wait(bound, "upgraded and cleaned up", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseUpgraded) && s.Reason == agent.ReasonUpgraded
	})
	waitAnnotated(t, e, "upgraded")
}

// checkSignature checks the release signature ferry placed as the version
// operator does (its verifier, for the digest desiredUpdate names) and as
// a node does (containers/image, for the release's manifest and its
// <version>-<arch> tag): signed by the test key.
func checkSignature(t *testing.T, e *kubeenv.Env, reg *fixture.Registry, meta *bundle.Metadata, placed []byte) {
	t.Helper()
	key := releasesig.Test()
	cvo, err := cvoverify.Trusting(key.PublicArmored(), e.Admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := cvo.VerifyDesiredUpdate(t.Context()); err != nil {
		t.Fatalf("the version operator's verifier refuses ferry's request: %v", err)
	}
	name, _, d := bundle.SplitRef(meta.Release)
	if got, err := key.Verify(placed, reg.Manifest(t, meta.Release), name+":"+meta.Version+"-"+meta.Arch); err != nil || got != d {
		t.Fatalf("containers/image: the placed signature verifies for %q, %v; want %s", got, err, d)
	}
}

func waitAnnotated(t *testing.T, e *kubeenv.Env, phase string) {
	t.Helper()
	waitUntil(t, "node-a annotated "+phase, func() bool { return e.Annotations("node-a")["ferry.io/phase"] == phase })
}

// TestHost_TheUpgradeLoopThroughARealAPI: one node, real CRI-O, a real
// kube-apiserver with OpenShift's ClusterVersion CRD and ferry's own
// RBAC. Two upgrades in a row: each ends with its files, registry and
// mirror gone and its pins kept; the second's end unpins the first's
// images except those both hold.
func TestHost_TheUpgradeLoopThroughARealAPI(t *testing.T) {
	c := crioenv.Start(t)
	e := kubeenv.Start(t, runningRelease)
	e.AddNode("node-a", "127.0.0.1")
	e.InstallFerry()
	reg := fixture.NewRegistry(t)
	reg.PushImage(t, "my-company/my-workload", "v1")
	firstTar, first := releaseBundle(t, reg, "4.13.7", 1)
	secondTar, second := releaseBundle(t, reg, "4.13.8", 2)
	e.ApproveRelease(first.Release) // the administrator's one command each (ferry bundle verify prints it)
	e.ApproveRelease(second.Release)

	cfg := nodeConfig(t, c)
	cfg.NodeName = "node-a"
	cfg.Cluster.Kubeconfig = e.NodeKubeconfig("node-a")
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, "idle")
	cl := c.Client(t)

	upgradeOnce(t, e, a, reg, firstTar, first, runningRelease)
	if _, err := os.Stat(filepath.Join(cfg.Paths.ExtractDir, first.DirName(), bundle.MetadataName)); err != nil {
		t.Errorf("the running release's tree is not kept after the upgrade: %v", err)
	}
	if _, err := os.Stat(filepath.Join(c.Dropins.RegistriesConfDir, crio.DropinName)); !os.IsNotExist(err) {
		t.Error("the mirror drop-in outlived the upgrade")
	}
	if ents, _ := os.ReadDir(c.Dropins.CertsDir); len(ents) != 0 {
		t.Errorf("certs.d entries left: %v", ents)
	}
	if s, _ := a.Status(context.Background()); s.Phase != string(agent.PhaseUpgraded) {
		t.Errorf("status after the upgrade %+v", s)
	}
	checkPinned(t, cl, refsOf(first), true)

	// Nothing changes: nothing is written to the Node (resourceVersion),
	// once its annotations say the upgrade is done and cleaned up (the
	// cleanup's end is the last change; under load it may come after the
	// status line's).
	waitUntil(t, "node-a annotated upgraded, with no reason left", func() bool {
		ann := e.Annotations("node-a")
		return ann["ferry.io/phase"] == "upgraded" && ann["ferry.io/reason"] == "" && ann["ferry.io/progress"] == ""
	})
	rv, before := nodeVersion(t, e), e.Annotations("node-a")
	// Turns of the agent's loop that change nothing write nothing.
	a.TurnsRefused(3, "proceed")
	if now := nodeVersion(t, e); now != rv {
		t.Errorf("the Node was written while nothing changed (resourceVersion %s → %s; annotations %v → %v)", rv, now, before, e.Annotations("node-a"))
	}

	// The registry is gone: nothing listens where it served.
	port, err := os.ReadFile(filepath.Join(cfg.Paths.StateDir, "registry", "port"))
	if err != nil {
		t.Fatalf("the registry's kept port: %v", err)
	}
	if conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strings.TrimSpace(string(port)), time.Second); err == nil {
		conn.Close()
		t.Error("the embedded registry still answers after the upgrade")
	}

	// The next upgrade: the first bundle's pins stay while it runs, and go
	// at its end, except the image both carry.
	upgradeOnce(t, e, a, reg, secondTar, second, first.Release)
	checkPinned(t, cl, refsOf(second), true)
	shared := "quay.io/my-company/my-workload:v1"
	var gone []string
	for _, ref := range refsOf(first) {
		if !strings.HasPrefix(ref, "quay.io/my-company/my-workload") {
			gone = append(gone, ref)
		}
	}
	checkPinned(t, cl, gone, false)
	checkPinned(t, cl, []string{shared}, true)
	if _, err := os.Stat(filepath.Join(cfg.Paths.ExtractDir, first.DirName())); !os.IsNotExist(err) {
		t.Error("the first release's kept tree outlived the next upgrade")
	}
	if _, err := os.Stat(filepath.Join(cfg.Paths.ExtractDir, second.DirName(), bundle.MetadataName)); err != nil {
		t.Errorf("the running release's tree is not kept: %v", err)
	}
}

func nodeVersion(t *testing.T, e *kubeenv.Env) string {
	t.Helper()
	var n struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := e.Admin.Raw(context.Background(), "GET", "/api/v1/nodes/node-a", "", nil, &n); err != nil {
		t.Fatal(err)
	}
	return n.Metadata.ResourceVersion
}

// TestHost_ManualProceedAFailedHookAnOutageAndARefusal: the API server is
// down when the node becomes ready (ferry keeps trying, loses nothing);
// with schedule Manual nothing is asked until ferry proceed; the hook that
// fails runs again on the next ferry proceed, without asking twice; the
// operator refusing the release is shown in the status and on the Node.
func TestHost_ManualProceedAFailedHookAnOutageAndARefusal(t *testing.T) {
	c := crioenv.Start(t)
	e := kubeenv.Start(t, runningRelease)
	e.AddNode("node-a", "127.0.0.1")
	e.InstallFerry()
	reg := fixture.NewRegistry(t)
	reg.PushImage(t, "my-company/my-workload", "v1")
	tarPath, meta := releaseBundle(t, reg, "4.13.7", 3)
	e.ApproveRelease(meta.Release)

	flag := filepath.Join(t.TempDir(), "hook-may-succeed")
	cfg := nodeConfig(t, c)
	cfg.NodeName = "node-a"
	cfg.Cluster.Schedule = "Manual"
	cfg.Cluster.OnReady = []string{"/bin/sh", "-c", "test -e " + flag}
	cfg.Cluster.Kubeconfig = e.NodeKubeconfig("node-a")
	gen := e.Generation()
	e.StopAPIServer()
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, "idle")
	if out, err := a.Ferry("load", tarPath); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	a.WaitPhase(bound, agent.PhaseClusterReady)
	time.Sleep(3 * time.Second) // annotation tries fail meanwhile
	e.StartAPIServer()
	waitAnnotated(t, e, "cluster-ready")
	if du := e.DesiredUpdate(); du != nil {
		t.Fatalf("Manual schedule asked by itself: %v", du)
	}

	if out, err := a.Ferry("proceed"); err != nil {
		t.Fatalf("ferry proceed: %v\n%s", err, out)
	}
	waitDesired(t, e, meta.Release)
	hookState := func() (ran, failed bool) {
		s, err := a.Status(context.Background())
		if err != nil {
			return false, false
		}
		for _, r := range s.Bundles {
			if r.Hook != nil && !r.Hook.Finished.IsZero() {
				return true, r.Hook.Error != ""
			}
		}
		return false, false
	}
	waitUntil(t, "the hook to fail", func() bool { ran, failed := hookState(); return ran && failed })
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := a.Ferry("proceed"); err != nil {
		t.Fatalf("ferry proceed (hook again): %v\n%s", err, out)
	}
	waitUntil(t, "the hook to succeed on the second proceed", func() bool { ran, failed := hookState(); return ran && !failed })
	if g := e.Generation(); g != gen+1 {
		t.Errorf("ClusterVersion's spec changed %d times, want one", g-gen)
	}

	// The operator refuses the release: its verifier, trusting another
	// key than the one that signed it, says why.
	other, err := cvoverify.Trusting(releasesig.NewKey().PublicArmored(), e.Admin)
	if err != nil {
		t.Fatal(err)
	}
	refusal := other.VerifyDesiredUpdate(t.Context())
	if refusal == nil {
		t.Fatal("a verifier trusting another key accepts the release")
	}
	e.SetConditions(kubeenv.Condition{Type: "ReleaseAccepted", Status: "False", Reason: "RetrievePayload", Message: refusal.Error()})
	s := a.Wait(bound, "the refusal to show", func(s agent.Status) bool {
		return s.Reason == agent.ReasonReleaseRefused
	})
	if s.Healthy || !strings.Contains(s.Line, s.Message) {
		t.Errorf("status %+v", s)
	}
	waitUntil(t, "the refusal on the Node", func() bool {
		return strings.Contains(e.Annotations("node-a")["ferry.io/reason"], "cannot be verified")
	})
}

// waitDesired waits until ClusterVersion's desiredUpdate names release.
func waitDesired(t *testing.T, e *kubeenv.Env, release string) {
	t.Helper()
	waitUntil(t, "desiredUpdate to name "+release, func() bool {
		du := e.DesiredUpdate()
		return du != nil && du["image"] == release
	})
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
