package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/internal/diskspace"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
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
	for _, want := range []string{"not enough space in " + store, "imageGCHighThresholdPercent", "free ", "crictl rmi --prune"} {
		if !strings.Contains(s.Reason, want) {
			t.Errorf("the refusal does not say %q: %s", want, s.Reason)
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
