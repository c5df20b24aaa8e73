package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/fixture"
)

// upgradeToolBundle makes a bundle the way the seed's prototype,
// upgrade-tool, does: every image copied with skopeo into Debian's
// docker-registry (distribution 2.8) storage, metadata.json in the seed's
// exact shape (no formatVersion, no sizeBytes, one image listed twice)
// written first, the tar made with GNU tar (zero record padding to 10 KiB)
// and its .sha256 by sha256sum. It returns the tar, its digest and the
// images the metadata lists.
func upgradeToolBundle(t *testing.T) (tarPath, digest string, images []string, release string) {
	t.Helper()
	for _, tool := range []string{"docker-registry", "skopeo", "tar", "sha256sum"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: run test/setup/install-deps.sh", tool)
		}
	}
	reg := fixture.NewRegistry(t)
	release, payload := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 3})
	custom := reg.PushImage(t, "my-company/my-workload", "v1")
	multi, _ := reg.PushIndex(t, "my-company/multi", "", "amd64", "arm64")

	root := t.TempDir() // the registry's storage: root/docker/registry/v2
	addr, stop := fixture.ServeDistribution(t, root, false)
	images = append(append([]string{}, payload...), custom, multi)
	for _, ref := range append([]string{release}, images...) {
		name, _, _ := bundle.SplitRef(ref)
		args := []string{"copy", "--quiet", "--preserve-digests", "--all",
			"--src-cert-dir", filepath.Join(reg.CertsDir, reg.Host), "--dest-tls-verify=false",
			"docker://" + reg.Local(ref), "docker://" + addr + "/" + bundle.RepoPath(name) + ":latest"}
		if out, err := exec.Command("skopeo", args...).CombinedOutput(); err != nil {
			t.Fatalf("skopeo %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	stop()

	listed := append(slices.Clone(images), payload[0]) // upgrade-tool sometimes lists an image twice
	meta, err := json.MarshalIndent(map[string]any{
		"version": "4.13.7", "arch": "x86_64", "size": "16 MiB", "release": release, "images": listed,
	}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "metadata.json"), meta, 0o644); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	tarPath = filepath.Join(out, "upgrade-4.13.7-x86_64.tar")
	if b, err := exec.Command("tar", "-C", root, "-cf", tarPath, "metadata.json", "docker").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, b)
	}
	cmd := exec.Command("sha256sum", filepath.Base(tarPath))
	cmd.Dir = out
	sum, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "upgrade-4.13.7-x86_64.sha256"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(tarPath)
	if fi.Size()%10240 != 0 {
		t.Fatalf("GNU tar wrote %d bytes, not whole 10 KiB records", fi.Size())
	}
	return tarPath, "sha256:" + string(sum[:64]), images, release
}

// TestHost_AnUpgradeToolBundleIsVerifiedExtractedAndLoaded (issue 14): a
// bundle made by upgrade-tool's recipe is read by `ferry bundle inspect`
// (which says which shape it read), verified, extracted, and loaded into a
// real CRI-O by a real agent with every image pinned, the duplicate warned
// about; and so is the same tar written onto a block device.
func TestHost_AnUpgradeToolBundleIsVerifiedExtractedAndLoaded(t *testing.T) {
	tarPath, digest, images, release := upgradeToolBundle(t)
	refs := bundle.PullRefs(append([]string{release}, images...))
	ferry := ferryenv.Binary(t)

	out, err := exec.Command(ferry, "bundle", "inspect", tarPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), bundle.ShapeSeed) {
		t.Fatalf("inspect: %v\n%s", err, out)
	}
	out, err = exec.Command(ferry, "bundle", "verify", tarPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), digest) {
		t.Fatalf("verify: %v\n%s", err, out)
	}
	dest := filepath.Join(t.TempDir(), "x")
	if out, err := exec.Command(ferry, "bundle", "extract", tarPath, "--dest", dest, "--quiet").CombinedOutput(); err != nil {
		t.Fatalf("extract: %v\n%s", err, out)
	}

	t.Run("a file", func(t *testing.T) {
		c := crioenv.Start(t)
		a := ferryenv.Start(t, nodeConfig(t, c))
		a.WaitPhase(bound, agent.PhaseIdle)
		if out, err := a.Ferry("load", tarPath); err != nil {
			t.Fatalf("ferry load: %v\n%s", err, out)
		}
		if s := a.WaitPhase(bound, agent.PhaseClusterReady); string(s.Digest) != digest {
			t.Fatalf("loaded %s, want %s", s.Digest, digest)
		}
		checkPinned(t, c.Client(t), refs, true)
		if !strings.Contains(a.Logs(), "more than once") {
			t.Error("the image listed twice was not warned about")
		}
	})
	t.Run("the same tar on a block device", func(t *testing.T) {
		dev := attachLoop(t, tarPath)
		c := crioenv.Start(t)
		cfg := nodeConfig(t, c)
		cfg.ApprovedDigests = []string{digest} // a raw device has no .sha256: sha256sum's digest is approved
		cfg.Approval = "required"
		cfg.Media.Detect = "manual" // ferry load reads it, not the startup scan
		a := ferryenv.Start(t, cfg)
		a.WaitPhase(bound, agent.PhaseIdle)
		if out, err := a.Ferry("load", dev); err != nil {
			t.Fatalf("ferry load %s: %v\n%s", dev, err, out)
		}
		if s := a.WaitPhase(bound, agent.PhaseClusterReady); string(s.Digest) != digest {
			t.Fatalf("loaded %s, want %s", s.Digest, digest)
		}
		checkPinned(t, c.Client(t), refs, true)
	})
}

// attachLoop makes file a block device (read-only), as dd onto a stick
// would, detached when the test ends.
func attachLoop(t *testing.T, file string) string {
	t.Helper()
	out, err := exec.Command("losetup", "-f", "-r", "--show", file).Output()
	if err != nil {
		t.Fatalf("losetup: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command("losetup", "-d", dev).Run() })
	return dev
}
