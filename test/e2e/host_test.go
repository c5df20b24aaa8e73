// Package e2e runs ferry's main job on the host against the real parts:
// a bundle made by `ferry bundle create` from a TLS registry, given to a
// real `ferry agent` process, loaded into a real CRI-O through ferry's
// embedded registry, and every image checked present and pinned over CRI.
// Needs root, test/setup/install-deps.sh and test/setup/build-crio.sh.
package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/fixture"
)

const bound = 5 * time.Minute

// makeBundle pushes a release of n payload images and one custom image
// (by tag) to a TLS registry and runs `ferry bundle create` against it.
func makeBundle(t *testing.T, n int, imageSize int64) (tarPath string, meta *bundle.Metadata) {
	t.Helper()
	return createBundle(t, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: n, ImageSize: imageSize})
}

// createBundle pushes a release made as opts says and the custom workload
// image to a fresh registry, and makes a bundle of them with ferry bundle
// create and its extra arguments.
func createBundle(t *testing.T, opts fixture.ReleaseOptions, extra ...string) (tarPath string, meta *bundle.Metadata) {
	t.Helper()
	reg := fixture.NewRegistry(t)
	reg.PushImage(t, "my-company/my-workload", "v1")
	return createBundleFrom(t, reg, opts, extra...)
}

// createBundleFrom is createBundle with a registry that already holds the
// workload image.
func createBundleFrom(t *testing.T, reg *fixture.Registry, opts fixture.ReleaseOptions, extra ...string) (tarPath string, meta *bundle.Metadata) {
	t.Helper()
	release, _ := reg.PushRelease(t, opts)
	return createBundleOf(t, reg, release, extra...)
}

// createBundleOf runs ferry bundle create for a release reg already holds,
// with the workload image and the extra arguments.
func createBundleOf(t *testing.T, reg *fixture.Registry, release string, extra ...string) (tarPath string, meta *bundle.Metadata) {
	t.Helper()
	out := t.TempDir()
	args := append([]string{"bundle", "create", "--release", release,
		"--mirror", reg.Mirror(), "--cert-dir", reg.CertsDir,
		"--extra-image", "quay.io/my-company/my-workload:v1", "--output", out}, extra...)
	if b, err := exec.Command(ferryenv.Binary(t), args...).CombinedOutput(); err != nil {
		t.Fatalf("ferry bundle create: %v\n%s", err, b)
	}
	tars, _ := filepath.Glob(filepath.Join(out, "upgrade-*.tar"))
	if len(tars) != 1 {
		t.Fatalf("ferry bundle create wrote %v", tars)
	}
	tarPath = tars[0]
	meta, err := bundle.InspectFile(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	return tarPath, meta
}

// nodeConfig points an agent at c's sockets and drop-in dirs.
func nodeConfig(t *testing.T, c *crioenv.CRIO) agent.Config {
	cfg := ferryenv.Config(t.TempDir())
	c.Configure(&cfg)
	return cfg
}

// refsOf lists every reference CRI-O pulls the bundle's images as (the
// pins match these), tags included.
func refsOf(meta *bundle.Metadata) []string {
	return bundle.PullRefs(meta.AllImages())
}

func checkPinned(t *testing.T, cl crio.ImageService, refs []string, want bool) {
	t.Helper()
	for _, ref := range refs {
		present, pinned, err := cl.Status(context.Background(), ref)
		if err != nil {
			t.Fatalf("status %s: %v", ref, err)
		}
		if want && (!present || !pinned) {
			t.Errorf("%s: present=%v pinned=%v", ref, present, pinned)
		}
		if !want && pinned {
			t.Errorf("%s still pinned", ref)
		}
	}
}

func TestHost_StickBundleLoadedAndPinnedInRealCRIO(t *testing.T) {
	c := crioenv.Start(t)
	tarPath, meta := makeBundle(t, 30, 0)
	if n := len(meta.AllImages()); n < 32 {
		t.Fatalf("bundle has %d images", n)
	}
	// MCO's pins, which must survive ferry's drop-in.
	mcoPin := "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:" + strings.Repeat("7", 64)
	crioenv.Write(t, filepath.Join(c.Dropins.CRIOConfDir, "50-pinned-images"), "[crio.image]\npinned_images = [\""+mcoPin+"\"]\n")

	cfg := nodeConfig(t, c)
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, "idle")
	if out, err := a.Ferry("load", tarPath); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	s := a.WaitPhase(bound, agent.PhaseClusterReady)
	if s.Version != "4.13.7" || s.Reason != agent.ReasonClusterReady {
		t.Fatalf("status %+v", s)
	}
	cl := c.Client(t)
	refs := refsOf(meta)
	if !slices.Contains(refs, "quay.io/my-company/my-workload:v1") {
		t.Fatalf("the custom image's tag is not among the pull references: %v", refs)
	}
	checkPinned(t, cl, refs, true)
	pins, err := cl.PinnedImages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pins, mcoPin) {
		t.Errorf("MCO's pin lost: live pinned_images %v", pins)
	}

	// A restart keeps the state and serves the bundle again.
	a.Stop()
	a.Restart()
	a.WaitPhase(bound, agent.PhaseClusterReady)
	checkPinned(t, cl, refs, true)

	// Without an API, cleanup says the upgrade is done: the mirror, CA and
	// registry go; the pins and the files (the running release's source)
	// stay until the next upgrade; MCO's pin stays too.
	if out, err := a.Ferry("cleanup"); err != nil {
		t.Fatalf("ferry cleanup: %v\n%s", err, out)
	}
	a.WaitPhase(bound, agent.PhaseUpgraded)
	checkPinned(t, cl, refs, true)
	if _, err := os.Stat(filepath.Join(c.Dropins.RegistriesConfDir, crio.DropinName)); !os.IsNotExist(err) {
		t.Error("the mirror drop-in is left after the upgrade is done")
	}
	if _, err := os.Stat(filepath.Join(c.Dropins.CRIOConfDir, crio.DropinName)); err != nil {
		t.Errorf("the pins drop-in went with the upgrade's end: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.Paths.ExtractDir, meta.DirName(), bundle.MetadataName)); err != nil {
		t.Errorf("the running release's tree is not kept after the upgrade: %v", err)
	}
	pins, _ = cl.PinnedImages(context.Background())
	if !slices.Contains(pins, mcoPin) {
		t.Errorf("MCO's pin lost by cleanup: %v", pins)
	}
}

func TestHost_CRIOKilledMidLoadTheAgentWaitsThenCompletes(t *testing.T) {
	c := crioenv.Start(t)
	tarPath, meta := makeBundle(t, 60, 1<<20)
	a := ferryenv.Start(t, nodeConfig(t, c))
	a.WaitPhase(bound, "idle")
	if out, err := a.Ferry("load", tarPath); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	s := a.Wait(bound, "loading to start", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseLoading) && s.Progress != nil && s.Progress.Done > 0 ||
			s.Phase == string(agent.PhaseClusterReady)
	})
	c.Kill(t)
	if s.Phase != string(agent.PhaseLoading) {
		t.Fatalf("the load finished before CRI-O could be killed (%s): make the bundle bigger", s.Line)
	}
	t.Logf("CRI-O killed at %s", s.Line)
	time.Sleep(2 * time.Second)
	c.Start(t)
	a.WaitPhase(bound, agent.PhaseClusterReady)
	checkPinned(t, c.Client(t), refsOf(meta), true)
}

// TestHost_APullThatCannotHealEndsFailedNotRetriedForever: a tree damaged
// on the node after it was extracted and checked (one image's manifest
// link gone, as a bad disk or a hand in /var/lib/upgrade would do) fails
// that pull in a real CRI-O with "manifest unknown": the agent ends the
// bundle in failed, naming the image, within a bounded time, instead of
// retrying forever. CRI-O is down while the tree is damaged, so the agent
// is waiting in loading, as after a crio restart.
func TestHost_APullThatCannotHealEndsFailedNotRetriedForever(t *testing.T) {
	c := crioenv.Start(t)
	tarPath, meta := makeBundle(t, 4, 0)
	c.Kill(t)
	cfg := nodeConfig(t, c)
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, "idle")
	if out, err := a.Ferry("load", tarPath); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	a.WaitPhase(bound, agent.PhaseLoading)
	missing := meta.Images[1]
	name, _, d := bundle.SplitRef(missing)
	link := filepath.Join(cfg.Paths.ExtractDir, meta.DirName(), bundle.RegistryRoot, "repositories", bundle.RepoPath(name), "_manifests/revisions/sha256", strings.TrimPrefix(d, "sha256:"))
	if err := os.RemoveAll(link); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.Start(t)
	s := a.WaitPhase(bound, agent.PhaseFailed)
	if s.Reason != agent.ReasonLoadFailed || !strings.Contains(s.Message, name) || !strings.Contains(s.Message, "make it again") || s.Healthy {
		t.Fatalf("status %+v", s)
	}
	t.Logf("failed %s after CRI-O came back: %s", time.Since(start).Round(time.Second), s.Line)
}
