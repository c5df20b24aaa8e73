package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/internal/imagetree"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/fixture"
)

// TestHost_SigstorePolicyOfAnOpenShift421Node: a real CRI-O whose
// policy.json requires a sigstore signature by a key for the release
// repository (and registries.d with use-sigstore-attachments for it, as
// the MCO writes them). A bundle made from a source holding the signed
// release carries the signature; ferry serves it through its mirror and
// says so in registries.d, and CRI-O verifies it on the pull: every image
// pulled and pinned. The same release unsigned gives a bundle that the
// agent refuses before anything is loaded, naming the image and the key,
// with nothing pinned and no drop-in written; loaded anyway (the node's
// check pointed elsewhere), CRI-O itself refuses it, the way the agent
// said it would.
func TestHost_SigstorePolicyOfAnOpenShift421Node(t *testing.T) {
	key, pub := imagetree.NewSigningKey()
	// Each case on its own CRI-O: pins outlive a cleanup by design.
	node := func(t *testing.T) (*crioenv.CRIO, *crio.Client) {
		c := crioenv.Start(t)
		c.RequireSigstore(t, fixture.Upstream+"/"+fixture.ReleaseRepo, pub)
		return c, c.Client(t)
	}
	ctx := context.Background()

	t.Run("SignedLoadsAndPins", func(t *testing.T) {
		c, cl := node(t)
		reg := fixture.NewRegistry(t)
		reg.PushImage(t, "my-company/my-workload", "v1")
		release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.21.3", Arch: "x86_64", PayloadImages: 4})
		sig := reg.Sign(t, release, key, "")
		tarPath, meta := createBundleOf(t, reg, release)
		if len(meta.Signatures) != 1 || meta.Signatures[0] != sig {
			t.Fatalf("bundle signatures %v, want [%s]", meta.Signatures, sig)
		}
		cfg := nodeConfig(t, c)
		a := ferryenv.Start(t, cfg)
		a.WaitPhase(bound, "idle")
		if out, err := a.Ferry("load", tarPath); err != nil {
			t.Fatalf("ferry load: %v\n%s", err, out)
		}
		a.WaitPhase(bound, agent.PhaseClusterReady)
		checkPinned(t, cl, refsOf(meta), true)
		ours := filepath.Join(c.Dropins.RegistriesD, crio.AttachmentsName)
		b, err := os.ReadFile(ours)
		if err != nil || !strings.Contains(string(b), "127.0.0.1:") || !strings.Contains(string(b), "use-sigstore-attachments: true") {
			t.Fatalf("ferry's registries.d file: %v\n%s", err, b)
		}

		// Without ferry's registries.d entry CRI-O does not read the
		// signatures through the mirror, and refuses the release: why
		// ferry writes it.
		keep := string(b)
		os.Remove(ours)
		if err := cl.Remove(ctx, meta.Release); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Pull(ctx, meta.Release); err == nil || !strings.Contains(err.Error(), "signature") {
			t.Fatalf("pull through the mirror without ferry's registries.d: %v; want a signature refusal", err)
		}
		crioenv.Write(t, ours, keep)
		if _, err := cl.Pull(ctx, meta.Release); err != nil {
			t.Fatalf("pull with ferry's registries.d back: %v", err)
		}

		if out, err := a.Ferry("cleanup"); err != nil {
			t.Fatalf("ferry cleanup: %v\n%s", err, out)
		}
		if _, err := os.Stat(ours); !os.IsNotExist(err) {
			t.Errorf("ferry's registries.d file after cleanup: %v", err)
		}
	})

	t.Run("UnsignedIsRefusedAtPlugTime", func(t *testing.T) {
		c, cl := node(t)
		reg := fixture.NewRegistry(t)
		reg.PushImage(t, "my-company/my-workload", "v1")
		release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.21.4", Arch: "x86_64", PayloadImages: 4})
		tarPath, meta := createBundleOf(t, reg, release)
		if len(meta.Signatures) != 0 {
			t.Fatalf("bundle signatures %v, want none", meta.Signatures)
		}
		cfg := nodeConfig(t, c)
		a := ferryenv.Start(t, cfg)
		a.WaitPhase(bound, "idle")
		a.Ferry("load", tarPath)
		s := a.WaitPhase(bound, agent.PhaseRejected)
		for _, want := range []string{meta.Release, "sigstore signature by the key in " + filepath.Join(c.Root, "etc", "containers", "release.pub"), "carries none"} {
			if s.Reason != agent.ReasonSignaturePolicy || !strings.Contains(s.Message, want) {
				t.Errorf("%s: %q lacks %q", s.Reason, s.Message, want)
			}
		}
		checkPinned(t, cl, refsOf(meta), false)
		for _, p := range []string{filepath.Join(c.Dropins.CRIOConfDir, crio.DropinName), filepath.Join(c.Dropins.RegistriesConfDir, crio.DropinName),
			filepath.Join(c.Dropins.RegistriesD, crio.AttachmentsName), filepath.Join(cfg.Paths.ExtractDir, meta.DirName())} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("%s exists after the refusal (%v)", p, err)
			}
		}
		a.Stop()

		// The node's check pointed at a file that does not exist: ferry
		// loads, and the real CRI-O refuses the release on its own.
		cfg = nodeConfig(t, c)
		cfg.Paths.SignaturePolicy = filepath.Join(t.TempDir(), "none.json")
		b := ferryenv.Start(t, cfg)
		b.WaitPhase(bound, "idle")
		if out, err := b.Ferry("load", tarPath); err != nil {
			t.Fatalf("ferry load: %v\n%s", err, out)
		}
		s = b.WaitPhase(bound, agent.PhaseFailed)
		if s.Reason != agent.ReasonLoadFailed || !strings.Contains(s.Message, meta.Release) || !strings.Contains(s.Message, "signature") {
			t.Errorf("CRI-O's refusal: %+v", s)
		}
		t.Logf("CRI-O refused the unsigned release: %s", s.Message)
	})
}
