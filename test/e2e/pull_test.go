package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/pull"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/fixture"
)

// siteMirror writes the node's registries.conf as a site's would (or as
// OpenShift renders an ImageDigestMirrorSet): quay.io's images come from
// the registry behind link, whose certificate the node trusts.
func siteMirror(t *testing.T, cfg agent.Config, link *fixture.Link) {
	t.Helper()
	link.TrustIn(t, cfg.Paths.CertsDir)
	conf := filepath.Join(filepath.Dir(cfg.Paths.RegistriesConfDir), "registries.conf")
	crioenv.Write(t, conf, link.RegistriesConf())
}

// TestRegistryMode_LoadReleaseThroughACuttingLinkPinsEverythingOnce
// (issue 36): ferry load --release on a single node with a real CRI-O and
// no API, the registry behind a link that cuts every second large blob
// response midway and carries 4 MiB/s: the release and the extra image
// are pulled once (at most 1.05× one copy over the link), shown with
// their progress, verified, loaded and pinned; the pull's tar goes once
// the agent holds the bundle; with the registry gone, nothing more is
// fetched and a restart serves every image again.
func TestRegistryMode_LoadReleaseThroughACuttingLinkPinsEverythingOnce(t *testing.T) {
	c := crioenv.Start(t)
	reg := fixture.NewRegistry(t)
	reg.PushImage(t, "my-company/my-workload", "v1")
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: 8, ImageSize: 1 << 20})
	link := fixture.NewLink(t, reg, fixture.LinkOptions{CutEvery: 2, Rate: 4 << 20})

	cfg := nodeConfig(t, c)
	cfg.Approval = agent.ApprovalModeRequired // the request approves what it pulls, nothing else
	siteMirror(t, cfg, link)
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, "idle")
	if out, err := a.Ferry("load", "--release", release, "--extra-image", "quay.io/my-company/my-workload:v1"); err != nil {
		t.Fatalf("ferry load --release: %v\n%s", err, out)
	}
	fetching := a.Wait(bound, "the pull's progress", func(s agent.Status) bool {
		return s.Pull != nil && s.Pull.State == pull.StateFetching && s.Pull.ToFetch > 0 && s.Pull.Bytes > 0
	})
	if fetching.Reason != agent.ReasonPulling || fetching.Line != fetching.Pull.Line() {
		t.Errorf("the status does not show the pull's progress: %s, %q", fetching.Reason, fetching.Line)
	}
	s := a.WaitPhase(bound, agent.PhaseClusterReady)
	var meta *bundle.Metadata
	for _, r := range s.Bundles {
		if r.Digest == s.Digest {
			meta = r.Metadata
		}
	}
	if meta == nil || meta.Release != release || len(meta.Images) != 9 {
		t.Fatalf("the bundle pulled: %+v", meta)
	}
	checkPinned(t, c.Client(t), refsOf(meta), true)

	if link.Cuts() < 3 {
		t.Fatalf("the link cut %d responses: the test shows nothing", link.Cuts())
	}
	sent := link.Sent()
	ratio := float64(sent) / float64(meta.SizeBytes)
	t.Logf("%d responses cut; %d bytes over the link for a %d-byte release: %.3f×", link.Cuts(), sent, meta.SizeBytes, ratio)
	if ratio > 1.05 {
		t.Errorf("%.3f× one copy of the release crossed the link, want ≤ 1.05× (CRI-O pulled from the registry, not from ferry's?)", ratio)
	}
	a.Wait(bound, "the pull's end", func(s agent.Status) bool { return s.Pull != nil && s.Pull.State == pull.StateDone })
	if left, _ := filepath.Glob(filepath.Join(cfg.Paths.StateDir, "pull", "*", "*.tar")); len(left) > 0 {
		t.Errorf("the pulled tar is kept once the agent holds the bundle: %v", left)
	}
	if _, err := os.Stat(filepath.Join(cfg.Paths.StateDir, "pull", "request.json")); !os.IsNotExist(err) {
		t.Errorf("the pull's request is kept after its end: %v", err)
	}

	// The registry is gone: nothing more was or is fetched, and a restart
	// serves every image from the node's own copy.
	time.Sleep(3 * time.Second)
	if now := link.Sent(); now != sent {
		t.Errorf("%d more bytes crossed the link after the load", now-sent)
	}
	link.Close()
	a.Stop()
	a.Restart()
	a.WaitPhase(bound, agent.PhaseClusterReady)
	checkPinned(t, c.Client(t), refsOf(meta), true)
}

// TestRegistryMode_AnImageTheRegistryLacksIsNamedAndNothingLoads (issue
// 36, item 5): a pull whose extra image the registry does not have fails
// at once, naming it, is not retried, and loads nothing.
func TestRegistryMode_AnImageTheRegistryLacksIsNamedAndNothingLoads(t *testing.T) {
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: 2})
	link := fixture.NewLink(t, reg, fixture.LinkOptions{})
	cfg := ferryenv.Config(t.TempDir())
	siteMirror(t, cfg, link)
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, "idle")
	if out, err := a.Ferry("load", "--release", release, "--extra-image", "quay.io/my-company/not-there:v9"); err != nil {
		t.Fatalf("ferry load --release: %v\n%s", err, out)
	}
	s := a.Wait(bound, "the pull's failure", func(s agent.Status) bool { return s.Pull != nil && s.Pull.State == pull.StateFailed })
	// The failure's words are the product: the image the registry lacks.
	if s.Reason != agent.ReasonPullFailed || !strings.Contains(s.Pull.Error, "my-company/not-there") || !strings.Contains(s.Line, s.Pull.Error) {
		t.Errorf("the failure does not name the missing image: %q / %q", s.Pull.Error, s.Line)
	}
	if s.Pull.Attempts != 0 {
		t.Errorf("a missing image was retried %d times", s.Pull.Attempts)
	}
	if s.Phase != string(agent.PhaseIdle) || len(s.Bundles) != 0 {
		t.Errorf("something was loaded: phase %s, bundles %d", s.Phase, len(s.Bundles))
	}

	// A release given by tag is refused before anything is asked.
	if out, err := a.Ferry("load", "--release", "quay.io/openshift-release-dev/ocp-release:4.13.7"); err == nil || !strings.Contains(out, "by digest") {
		t.Errorf("a release by tag: %v\n%s", err, out)
	}
}

// TestRegistryMode_NoRoomIsSaidBeforeTheLinkCarriesTheImages (issue 36,
// item 5): CRI-O's image store on a small filesystem, with the kubelet's
// image GC threshold at 50%: the pull is refused once its images are
// resolved, before their blobs cross the link, saying what to free; it is
// retried, never loaded.
func TestRegistryMode_NoRoomIsSaidBeforeTheLinkCarriesTheImages(t *testing.T) {
	store := smallFS(t, 256<<20)
	c := crioenv.StartOn(t, store)
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: 2, ImageSize: 32 << 20})
	link := fixture.NewLink(t, reg, fixture.LinkOptions{})
	kubelet := filepath.Join(t.TempDir(), "kubelet.conf")
	crioenv.Write(t, kubelet, "kind: KubeletConfiguration\nimageGCHighThresholdPercent: 50\nevictionHard:\n  imagefs.available: 5%\n")
	cfg := nodeConfig(t, c)
	cfg.CRIO.KubeletConfig = kubelet
	siteMirror(t, cfg, link)
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, agent.PhaseIdle)
	if out, err := a.Ferry("load", "--release", release); err != nil {
		t.Fatalf("ferry load --release: %v\n%s", err, out)
	}
	s := a.Wait(bound, "the refusal for room", func(s agent.Status) bool {
		return s.Pull != nil && s.Pull.State == pull.StateRetrying
	})
	if s.Reason != agent.ReasonPullRetrying || !strings.Contains(s.Pull.Error, "not enough space in "+store) || !strings.Contains(s.Line, s.Pull.Error) {
		t.Errorf("the refusal does not say where room is missing: %q / %q", s.Pull.Error, s.Line)
	}
	if sent := link.Sent(); sent > 8<<20 {
		t.Errorf("%d bytes crossed the link before the room was checked (the images are 64 MiB)", sent)
	}
	if s.Phase != string(agent.PhaseIdle) {
		t.Errorf("phase %s: something was taken in", s.Phase)
	}
}

// TestRegistryMode_AnAgentKilledMidPullResumesWhereItWas (issue 36, item
// 2): the agent is killed in the middle of a pull; restarted, it resumes
// the request from disk and every blob where it stopped: the release
// crosses the link once in all, and ends pinned.
func TestRegistryMode_AnAgentKilledMidPullResumesWhereItWas(t *testing.T) {
	c := crioenv.Start(t)
	reg := fixture.NewRegistry(t)
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: 4, ImageSize: 3 << 20})
	link := fixture.NewLink(t, reg, fixture.LinkOptions{Rate: 2 << 20})
	cfg := nodeConfig(t, c)
	siteMirror(t, cfg, link)
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, agent.PhaseIdle)
	if out, err := a.Ferry("load", "--release", release); err != nil {
		t.Fatalf("ferry load --release: %v\n%s", err, out)
	}
	a.Wait(bound, "a third of the pull", func(s agent.Status) bool {
		return s.Pull != nil && s.Pull.ToFetch > 0 && s.Pull.Bytes > s.Pull.ToFetch/3
	})
	a.Kill()
	before := link.Sent()
	a.Restart()
	s := a.WaitPhase(bound, agent.PhaseClusterReady)
	var meta *bundle.Metadata
	for _, r := range s.Bundles {
		if r.Digest == s.Digest {
			meta = r.Metadata
		}
	}
	if meta == nil || meta.Release != release {
		t.Fatalf("the bundle pulled: %+v", meta)
	}
	checkPinned(t, c.Client(t), refsOf(meta), true)
	ratio := float64(link.Sent()) / float64(meta.SizeBytes)
	t.Logf("killed after %d bytes; %d in all for a %d-byte release: %.3f×", before, link.Sent(), meta.SizeBytes, ratio)
	if ratio > 1.05 {
		t.Errorf("%.3f× one copy crossed the link: the restarted pull did not resume", ratio)
	}
}
