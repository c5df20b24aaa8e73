package e2e

import (
	"context"
	"fmt"
	"os"
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
	"github.com/ferry-edge/ferry/test/freeport"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// Issue 32: ferry never leaves a node worse off. OpenShift's own pins
// (the MCO's 50-pinned-images) are followed whenever they change, taking
// out a bundle that never ran keeps the running release pinned, and the
// running release is loaded again with no registry when CRI-O loses it or
// a node comes back empty.

// mcoPinsFile is 50-pinned-images as the machine config operator writes
// it for a PinnedImageSet.
func mcoPinsFile(pins ...string) string {
	q := make([]string, len(pins))
	for i, p := range pins {
		q[i] = fmt.Sprintf("%q", p)
	}
	return "[crio]\n  [crio.image]\n    pinned_images = [" + strings.Join(q, ", ") + "]\n"
}

// pinnedState is whether each ref is present and pinned.
func allPinned(cl crio.ImageService, refs []string) (bool, string) {
	for _, ref := range refs {
		present, pinned, err := cl.Status(context.Background(), ref)
		if err != nil || !present || !pinned {
			return false, fmt.Sprintf("%s: present=%v pinned=%v err=%v", ref, present, pinned, err)
		}
	}
	return true, ""
}

func pinnedOf(cl crio.ImageService, ref string) bool {
	_, pinned, err := cl.Status(context.Background(), ref)
	return err == nil && pinned
}

// within fails the test unless cond holds within d (polled); what says
// what was waited for.
func within(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	start := time.Now()
	var last string
	for {
		ok, why := cond()
		if ok {
			t.Logf("%s after %s", what, time.Since(start).Round(10*time.Millisecond))
			return
		}
		last = why
		if time.Since(start) > d {
			t.Fatalf("not within %s: %s (%s)", d, what, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ferryOK runs a ferry command against a, failing the test on an error.
func ferryOK(t *testing.T, a *ferryenv.Agent, args ...string) {
	t.Helper()
	if out, err := a.Ferry(args...); err != nil {
		t.Fatalf("ferry %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// loadAndWait gives a the bundle at tarPath and waits until it is loaded
// and every node holds it.
func loadAndWait(t *testing.T, a *ferryenv.Agent, tarPath string) {
	t.Helper()
	ferryOK(t, a, "load", tarPath)
	a.WaitPhase(bound, agent.PhaseClusterReady)
}

// pullIntoStore puts an image that no bundle holds in CRI-O's store, as a
// PinnedImageSet's image would be: pulled from the fixture registry by
// its own address.
func pullIntoStore(t *testing.T, c *crioenv.CRIO, reg *fixture.Registry, repo string) string {
	t.Helper()
	ref := reg.Local(reg.PushImage(t, repo, "v1"))
	crioenv.Write(t, filepath.Join(c.Dropins.CertsDir, reg.Host, "ca.crt"), string(reg.CAPEM))
	if _, err := c.Client(t).Pull(context.Background(), ref); err != nil {
		t.Fatalf("pulling %s: %v", ref, err)
	}
	return ref
}

// TestHost_TheMCOsPinsAreFollowedWheneverTheyChange: after ferry loaded a
// bundle, the MCO's file gains an image and loses it again, each time
// reloading CRI-O itself: within 10 s CRI-O pins what the MCO's file says
// and every image of the bundle; the same across a restart of ferry, and
// for a change made while ferry was stopped.
func TestHost_TheMCOsPinsAreFollowedWheneverTheyChange(t *testing.T) {
	c := crioenv.Start(t)
	reg := fixture.NewRegistry(t)
	reg.PushImage(t, "my-company/my-workload", "v1")
	tarPath, meta := createBundleFrom(t, reg, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: 6})
	x := pullIntoStore(t, c, reg, "mco/pinned-image-set")
	mcoFile := filepath.Join(c.Dropins.CRIOConfDir, "50-pinned-images")
	crioenv.Write(t, mcoFile, mcoPinsFile())

	cfg := nodeConfig(t, c)
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, "idle")
	loadAndWait(t, a, tarPath)
	cl := c.Client(t)
	refs := refsOf(meta)
	mco := func(pins ...string) {
		crioenv.Write(t, mcoFile, mcoPinsFile(pins...))
		if err := c.Reloader().Reload(context.Background()); err != nil { // the MCO reloads CRI-O itself
			t.Fatal(err)
		}
	}
	xPinned := func(want bool) func() (bool, string) {
		return func() (bool, string) {
			if pinnedOf(cl, x) != want {
				return false, fmt.Sprintf("%s pinned=%v", x, !want)
			}
			return allPinned(cl, refs)
		}
	}

	mco(x)
	within(t, 10*time.Second, "the MCO's new pin in effect, the bundle still pinned", xPinned(true))
	mco()
	within(t, 10*time.Second, "the MCO's dropped pin gone, the bundle still pinned", xPinned(false))

	mco(x)
	within(t, 10*time.Second, "pinned again", xPinned(true))
	a.Stop()
	a.Restart()
	a.WaitPhase(bound, agent.PhaseClusterReady)
	mco()
	within(t, 10*time.Second, "after ferry's restart, the dropped pin gone, the bundle still pinned", xPinned(false))

	a.Stop()
	mco(x) // while ferry is stopped: CRI-O does not pin X (ferry's file hides it) until ferry is back
	a.Restart()
	within(t, 10*time.Second, "a change made while ferry was stopped followed at its start", xPinned(true))

	if ents, _ := os.ReadDir(c.Dropins.CRIOConfDir); len(ents) != 2 {
		t.Errorf("crio.conf.d holds %d files, want the MCO's and ferry's", len(ents))
	}
	if b, _ := os.ReadFile(mcoFile); string(b) != mcoPinsFile(x) {
		t.Errorf("the MCO's file was changed: %q", b)
	}
}

// TestHost_CleanupOfABundleThatNeverRanKeepsTheRunningReleasePinned: the
// running release A (loaded, upgraded); a bundle B waits extracted (not
// approved) and is taken out with ferry cleanup: every image of A stays
// pinned, B's were never pinned.
func TestHost_CleanupOfABundleThatNeverRanKeepsTheRunningReleasePinned(t *testing.T) {
	c := crioenv.Start(t)
	reg := fixture.NewRegistry(t)
	reg.PushImage(t, "my-company/my-workload", "v1")
	tarA, metaA := createBundleFrom(t, reg, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: 4, Seed: 1})
	tarB, metaB := createBundleFrom(t, reg, fixture.ReleaseOptions{Version: "4.13.8", Arch: "x86_64", PayloadImages: 4, Seed: 2})
	cfg := nodeConfig(t, c)
	cfg.Approval = "required"
	cfg.ApprovedDigests = []string{sidecarDigest(t, tarA)}
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, "idle")
	loadAndWait(t, a, tarA)
	ferryOK(t, a, "cleanup") // no API: the upgrade to A is done
	a.WaitPhase(bound, agent.PhaseUpgraded)
	cl := c.Client(t)
	checkPinned(t, cl, refsOf(metaA), true)

	ferryOK(t, a, "load", tarB)
	a.Wait(bound, "B extracted, waiting for approval", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseExtracted) && s.Reason == agent.ReasonAwaitingApproval
	})
	ferryOK(t, a, "cleanup")
	a.Wait(bound, "B cleaned", func(s agent.Status) bool { return s.Phase != string(agent.PhaseExtracted) })
	checkPinned(t, cl, refsOf(metaA), true)
	onlyB := uniqueTo(refsOf(metaB), refsOf(metaA))
	checkPinned(t, cl, onlyB, false)
	if _, err := os.Stat(filepath.Join(cfg.Paths.ExtractDir, metaA.DirName(), bundle.MetadataName)); err != nil {
		t.Errorf("the running release's kept tree went with B's cleanup: %v", err)
	}
}

// TestHost_SpecCleanupOfALoadedBundleThatNeverRanKeepsTheRunningReleasePinned:
// through a real kube-apiserver, the cluster upgraded to A; B is loaded
// (cluster-ready, the schedule Manual) and the administrator sets its
// UpgradeBundle's spec.cleanup: B is unloaded (cleaned, its own images
// unpinned), every image of A stays pinned.
func TestHost_SpecCleanupOfALoadedBundleThatNeverRanKeepsTheRunningReleasePinned(t *testing.T) {
	c := crioenv.Start(t)
	e := kubeenv.Start(t, runningRelease)
	e.AddNode("node-a", "127.0.0.1")
	e.InstallFerry()
	e.InstallUpgradeBundles(repoFile("packaging/upgradebundle-crd.yaml"))
	reg := fixture.NewRegistry(t)
	reg.PushImage(t, "my-company/my-workload", "v1")
	tarA, metaA := releaseBundle(t, reg, "4.13.7", 1)
	tarB, metaB := releaseBundle(t, reg, "4.13.8", 2)
	e.ApproveRelease(metaA.Release)

	cfg := nodeConfig(t, c)
	cfg.NodeName = "node-a"
	cfg.Cluster.Kubeconfig = e.NodeKubeconfig("node-a")
	cfg.Cluster.Schedule = "Manual"
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, "idle")
	cl := c.Client(t)

	loadAndWait(t, a, tarA)
	ferryOK(t, a, "proceed")
	waitDesired(t, e, metaA.Release)
	e.SetHistory(kubeenv.History{State: "Completed", Image: metaA.Release, Version: metaA.Version}, kubeenv.History{State: "Completed", Image: runningRelease, Version: "old"})
	e.SetConditions(kubeenv.Condition{Type: "Progressing", Status: "False", Message: "Cluster version is " + metaA.Version})
	a.Wait(bound, "A upgraded and retired", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseUpgraded) && s.Reason == agent.ReasonUpgraded
	})
	checkPinned(t, cl, refsOf(metaA), true)

	loadAndWait(t, a, tarB)
	checkPinned(t, cl, refsOf(metaB), true)
	name := agent.ResourceName(metaB.Version, metaB.Arch)
	e.PatchBundleSpec(name, map[string]any{"cleanup": true})
	waitUntil(t, "node-a cleaned in B's UpgradeBundle", func() bool {
		return e.BundleNodes(name)["node-a"].Phase == string(agent.PhaseCleaned)
	})
	checkPinned(t, cl, refsOf(metaA), true)
	checkPinned(t, cl, uniqueTo(refsOf(metaB), refsOf(metaA)), false)
	if e.DesiredUpdate()["version"] != metaA.Version {
		t.Errorf("desiredUpdate %v: B's cleanup must not touch the cluster's upgrade", e.DesiredUpdate())
	}
}

// TestHost_CRIOLosesItsStorageAndTheRunningReleaseComesBack: after the
// upgrade to A is done (ferry cleanup, no API) and the source registry is
// gone, CRI-O is killed, its image store removed and CRI-O started: within
// 2 minutes every image of A is present and pinned again, loaded from the
// tree ferry kept, with nothing fetched from outside the node.
func TestHost_CRIOLosesItsStorageAndTheRunningReleaseComesBack(t *testing.T) {
	c := crioenv.Start(t)
	reg := fixture.NewRegistry(t)
	reg.PushImage(t, "my-company/my-workload", "v1")
	tarPath, meta := createBundleFrom(t, reg, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: 8})
	reg.Close() // the site has no registry

	cfg := nodeConfig(t, c)
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, "idle")
	loadAndWait(t, a, tarPath)
	ferryOK(t, a, "cleanup")
	a.Wait(bound, "upgraded, its registry and mirror gone", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseUpgraded) && s.Reason == agent.ReasonUpgraded
	})
	refs := refsOf(meta)
	cl := c.Client(t)
	checkPinned(t, cl, refs, true)

	c.LoseStorage(t)
	c.Start(t)
	if imgs, err := cl.List(context.Background()); err != nil || len(imgs) > 1 { // the pause image at most
		t.Fatalf("CRI-O's store after the loss: %d images, %v", len(imgs), err)
	}
	within(t, 2*time.Minute, "every image of the running release present and pinned again", func() (bool, string) {
		return allPinned(cl, refs)
	})
	// The images are back before the job has checked them all and taken
	// its mirror out again: its end follows.
	within(t, 30*time.Second, "the status saying so and the mirror gone again", func() (bool, string) {
		s, _ := a.Status(context.Background())
		if !strings.Contains(s.Notice, "loaded and pinned again") {
			return false, "notice " + s.Notice
		}
		if _, err := os.Stat(filepath.Join(c.Dropins.RegistriesConfDir, crio.DropinName)); !os.IsNotExist(err) {
			return false, "the mirror drop-in is still there"
		}
		return true, ""
	})
	if !strings.Contains(a.Logs(), "loading them again from the copy kept on this node") {
		t.Error("the journal does not say that the images were loaded again")
	}
}

// TestHost_ANodeThatComesBackEmptyGetsTheRunningReleaseFromItsPeer: two
// agents, each with its own CRI-O, load A and finish its upgrade; the
// second comes back with an empty disk (state, extracted trees and CRI-O's
// store gone) and no registry anywhere: it fetches A from the first, which
// kept it, and ends with A loaded and pinned, upgraded like its peer.
func TestHost_ANodeThatComesBackEmptyGetsTheRunningReleaseFromItsPeer(t *testing.T) {
	c1, c2 := crioenv.Start(t), crioenv.Start(t)
	reg := fixture.NewRegistry(t)
	reg.PushImage(t, "my-company/my-workload", "v1")
	tarPath, meta := createBundleFrom(t, reg, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", PayloadImages: 6})
	reg.Close()

	addr1, addr2 := freeport.Addr(t), freeport.Addr(t)
	cfg1, cfg2 := nodeConfig(t, c1), nodeConfig(t, c2)
	cfg1.NodeName, cfg2.NodeName = "node-1", "node-2"
	cfg1.Peer.Listen, cfg1.Peer.Peers, cfg1.Peer.Open = addr1, []string{addr2}, true
	cfg2.Peer.Listen, cfg2.Peer.Peers, cfg2.Peer.Open = addr2, []string{addr1}, true
	a1, a2 := ferryenv.Start(t, cfg1), ferryenv.Start(t, cfg2)
	a1.WaitPhase(bound, "idle")
	a2.WaitPhase(bound, "idle")
	ferryOK(t, a1, "load", tarPath)
	a1.WaitPhase(bound, agent.PhaseClusterReady)
	a2.WaitPhase(bound, agent.PhaseClusterReady)
	for _, a := range []*ferryenv.Agent{a1, a2} {
		ferryOK(t, a, "cleanup")
		a.WaitPhase(bound, agent.PhaseUpgraded)
	}

	a2.Stop()
	c2.LoseStorage(t)
	for _, d := range []string{cfg2.Paths.StateDir, cfg2.Paths.ExtractDir} {
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{crio.DropinName} {
		os.Remove(filepath.Join(cfg2.Paths.CRIOConfDir, f))
	}
	c2.Start(t)
	a2.Restart()
	s := a2.Wait(bound, "node-2 loaded A again, upgraded like its peer", func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseUpgraded) && s.Reason == agent.ReasonUpgraded && s.Digest != ""
	})
	if s.Version != meta.Version {
		t.Fatalf("node-2 status %+v", s)
	}
	checkPinned(t, c2.Client(t), refsOf(meta), true)
	if _, err := os.Stat(filepath.Join(cfg2.Paths.ExtractDir, meta.DirName(), bundle.MetadataName)); err != nil {
		t.Errorf("node-2 does not keep the running release it fetched: %v", err)
	}
}

// sidecarDigest is the digest a bundle's .sha256 file names.
func sidecarDigest(t *testing.T, tarPath string) string {
	t.Helper()
	b, err := os.ReadFile(strings.TrimSuffix(tarPath, ".tar") + ".sha256")
	if err != nil {
		t.Fatal(err)
	}
	return "sha256:" + strings.Fields(string(b))[0]
}

// uniqueTo is what of refs other does not hold.
func uniqueTo(refs, other []string) []string {
	var out []string
	for _, r := range refs {
		if !slices.Contains(other, r) {
			out = append(out, r)
		}
	}
	return out
}
