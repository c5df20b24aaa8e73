package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/diskspace"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/fixture"
)

// smallFS makes an ext4 filesystem of size bytes on a loop device and
// mounts it; both go when the test ends.
func smallFS(t *testing.T, size int64) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "small.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	return mnt
}

// TestHost_ALoadThatWouldCrossTheKubeletsThresholdsIsRefused (issue 16):
// CRI-O's image store on a small filesystem (256 MiB); the bundle's images
// (about 64 MiB) need twice their size there. With the kubelet's image GC
// threshold at 50% that crosses it: the bundle is refused before anything
// is written, saying how much to free, where and why, and nothing is
// pulled. With the threshold at 95% (the kubelet's config changed) the
// same bundle loads into the real CRI-O with every image pinned.
func TestHost_ALoadThatWouldCrossTheKubeletsThresholdsIsRefused(t *testing.T) {
	store := smallFS(t, 256<<20)
	c := crioenv.StartOn(t, store)
	tarPath, meta := makeBundle(t, 2, 32<<20)
	kubelet := filepath.Join(t.TempDir(), "kubelet.conf")
	crioenv.Write(t, kubelet, "kind: KubeletConfiguration\nimageGCHighThresholdPercent: 50\nevictionHard:\n  imagefs.available: 5%\n")
	cfg := nodeConfig(t, c)
	cfg.CRIO.KubeletConfig = kubelet
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, agent.PhaseIdle)

	if out, err := a.Ferry("load", tarPath); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	s := a.WaitPhase(bound, agent.PhaseRejected)
	for _, want := range []string{"not enough space in " + store, "imageGCHighThresholdPercent", "free ", "crictl rmi --prune", "then run ferry load again"} {
		if s.Reason != agent.ReasonNotEnoughSpace || !strings.Contains(s.Message, want) {
			t.Errorf("the refusal does not say %q: %s: %s", want, s.Reason, s.Message)
		}
	}
	t.Logf("%s", s.Line)
	checkPinned(t, c.Client(t), refsOf(meta), false)
	if _, err := os.Stat(filepath.Join(cfg.Paths.ExtractDir, meta.DirName())); !os.IsNotExist(err) {
		t.Error("extracted although refused")
	}

	crioenv.Write(t, kubelet, "kind: KubeletConfiguration\nimageGCHighThresholdPercent: 95\nevictionHard:\n  imagefs.available: 5%\n")
	if out, err := a.Ferry("load", tarPath); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	a.WaitPhase(bound, agent.PhaseClusterReady)
	checkPinned(t, c.Client(t), refsOf(meta), true)
	total, free, err := diskspace.Usage(store)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image store after the load: %s of %s used", diskspace.Human(total-free), diskspace.Human(total))
}

// TestHost_RoomOnOneFilesystemAsOnRHCOS (issue 16): /var/lib/upgrade and
// CRI-O's image store on one small filesystem, as both are /var on RHCOS,
// with the kubelet's eviction threshold given as a quantity in a JSON
// kubelet config. The check before extraction counts the bundle's tree
// with its load:
//
//  1. a bundle whose load alone would fit, but not with its tree, is
//     refused before a byte is written, naming the filesystem, the
//     threshold and how much to free;
//  2. a smaller bundle loads;
//  3. after that upgrade is done, the next bundle shares its payload
//     images with what CRI-O already holds: room is asked for the images
//     CRI-O lacks only (from the sizes bundle create wrote), and it loads
//     with room in which the whole bundle twice over would not fit.
func TestHost_RoomOnOneFilesystemAsOnRHCOS(t *testing.T) {
	const mib = 1 << 20
	fs := smallFS(t, 256*mib)
	store := filepath.Join(fs, "containers", "storage")
	if err := os.MkdirAll(store, 0o700); err != nil {
		t.Fatal(err)
	}
	c := crioenv.StartOn(t, store)
	big, bigMeta := makeBundleOf(t, 32*mib, 32*mib)
	small, smallMeta := makeBundleOf(t, 12*mib, 12*mib)
	next, nextMeta := makeBundleOf(t, 12*mib, 12*mib, 20*mib) // the first two: small's
	for _, m := range []*bundle.Metadata{bigMeta, smallMeta, nextMeta} {
		if len(m.ImageBytes) != len(m.AllImages()) {
			t.Fatalf("bundle create wrote no per-image sizes: %v", m.ImageBytes)
		}
	}
	kubelet := filepath.Join(t.TempDir(), "kubelet.conf")
	cfg := nodeConfig(t, c)
	cfg.CRIO.KubeletConfig = kubelet
	cfg.Paths.ExtractDir = filepath.Join(fs, "upgrade")
	floor := cfg.CRIO.StorageFloorBytes
	// evictAt sets imagefs.available so that room bytes can be written
	// before it (the GC threshold out of the way).
	evictAt := func(room int64) {
		_, free, err := diskspace.Usage(fs)
		if err != nil {
			t.Fatal(err)
		}
		if free-room < 0 {
			t.Fatalf("the filesystem has %s free, the test wants %s of room", diskspace.Human(free), diskspace.Human(room))
		}
		crioenv.Write(t, kubelet, fmt.Sprintf(`{"kind":"KubeletConfiguration","apiVersion":"kubelet.config.k8s.io/v1beta1","imageGCHighThresholdPercent":100,"evictionHard":{"imagefs.available":"%dKi","memory.available":"100Mi"}}`, (free-room)>>10))
	}
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, agent.PhaseIdle)

	// 1. Room for the load twice over, not for the tree as well.
	s := bigMeta.SizeBytes
	evictAt(2*s + floor + s/2)
	if out, err := a.Ferry("load", big); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	st := a.WaitPhase(bound, agent.PhaseRejected)
	for _, want := range []string{"not enough space in " + store + " (the filesystem mounted on " + fs + ")", "writing the bundle (" + bundle.HumanSize(s) + ")",
		"loading the 4 images CRI-O does not hold", "evictionHard imagefs.available", "free ", "crictl rmi --prune"} {
		if st.Reason != agent.ReasonNotEnoughSpace || !strings.Contains(st.Message, want) {
			t.Errorf("the refusal does not say %q: %s: %s", want, st.Reason, st.Message)
		}
	}
	t.Logf("%s", st.Line)
	if ents, _ := os.ReadDir(cfg.Paths.ExtractDir); len(ents) != 0 {
		t.Errorf("wrote %s although refused", ents[0].Name())
	}
	checkPinned(t, c.Client(t), refsOf(bigMeta), false)

	// 2. The smaller bundle fits, tree and load.
	if out, err := a.Ferry("load", small); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	a.WaitPhase(bound, agent.PhaseClusterReady)
	checkPinned(t, c.Client(t), refsOf(smallMeta), true)
	if out, err := a.Ferry("cleanup"); err != nil {
		t.Fatalf("ferry cleanup: %v\n%s", err, out)
	}
	a.WaitPhase(bound, agent.PhaseUpgraded)

	// 3. The next bundle: CRI-O holds two of its payload images and its
	// workload image; it lacks the release and the new payload image.
	var lacks int64
	for _, ref := range nextMeta.AllImages() {
		if ref == nextMeta.Release || strings.Contains(ref, fixture.PayloadRepo) && nextMeta.ImageBytes[ref] > 16*mib {
			lacks += nextMeta.ImageBytes[ref]
		}
	}
	s = nextMeta.SizeBytes
	room := s + 2*lacks + floor + 8*mib
	if whole := s + 2*s + floor; room >= whole {
		t.Fatalf("the test is wrong: %s of room would fit the whole bundle (%s)", diskspace.Human(room), diskspace.Human(whole))
	}
	evictAt(room)
	if out, err := a.Ferry("load", next); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	a.WaitPhase(bound, agent.PhaseClusterReady)
	checkPinned(t, c.Client(t), refsOf(nextMeta), true)
	total, free, err := diskspace.Usage(fs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("room %s for a bundle of %s lacking %s; the filesystem after its load: %s of %s used",
		diskspace.Human(room), diskspace.Human(s), diskspace.Human(lacks), diskspace.Human(total-free), diskspace.Human(total))
}

// makeBundleOf is makeBundle with one payload image of each size: the
// same sizes in the same places give the same images, so two bundles
// made this way share them.
func makeBundleOf(t *testing.T, sizes ...int64) (tarPath string, meta *bundle.Metadata) {
	t.Helper()
	return createBundle(t, fixture.ReleaseOptions{Version: "4.13.7", Arch: "x86_64", ImageSizes: sizes})
}
