package e2e

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/internal/imagetree"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/fixture"
)

// TestHost_AManifestListIsJudgedAsCRIOJudgesIt (issue 34, finding 5): a
// custom image pushed as a manifest list, on a real CRI-O whose policy
// requires a sigstore signature for its repository. containers/image
// checks the instance it picks for the node, not the list: signed at the
// instance only, ferry admits it and CRI-O pulls and pins it; signed at the
// list only, ferry refuses it at plug time, and CRI-O, given it anyway
// (ferry's check pointed elsewhere), refuses it too.
func TestHost_AManifestListIsJudgedAsCRIOJudgesIt(t *testing.T) {
	key, pub := imagetree.NewSigningKey()
	const repo = "my-company/listed"
	for _, tc := range []struct {
		name     string
		instance bool // sign the amd64 instance; else the list
	}{{"signed at the instance", true}, {"signed at the list", false}} {
		t.Run(tc.name, func(t *testing.T) {
			c := crioenv.Start(t)
			c.RequireSigstore(t, fixture.Upstream+"/"+repo, pub)
			reg := fixture.NewRegistry(t)
			reg.PushImage(t, "my-company/my-workload", "v1")
			index, children := reg.PushIndex(t, repo, "v1", "amd64")
			if tc.instance {
				reg.Sign(t, children["amd64"], key, "")
			} else {
				reg.Sign(t, index, key, "")
			}
			release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.21.5", Arch: "x86_64", PayloadImages: 2})
			tarPath, meta := createBundleOf(t, reg, release, "--extra-image", fixture.Upstream+"/"+repo+":v1")

			cfg := nodeConfig(t, c)
			a := ferryenv.Start(t, cfg)
			a.WaitPhase(bound, "idle")
			if out, err := a.Ferry("load", tarPath); err != nil {
				t.Fatalf("ferry load: %v\n%s", err, out)
			}
			s := a.Wait(bound, "admitted and loaded, or refused", func(s agent.Status) bool {
				return s.Phase == string(agent.PhaseClusterReady) || s.Phase == string(agent.PhaseRejected)
			})
			if tc.instance {
				if s.Phase != string(agent.PhaseClusterReady) {
					t.Fatalf("an instance-signed list refused: %s", s.Reason)
				}
				checkPinned(t, c.Client(t), refsOf(meta), true) // CRI-O checked the instance's signature itself
				return
			}
			if s.Phase != string(agent.PhaseRejected) || s.Reason != agent.ReasonSignaturePolicy || !strings.Contains(s.Message, repo) {
				t.Fatalf("a list signed at the list level only: %s %s: %s", s.Phase, s.Reason, s.Message)
			}
			a.Stop()
			cfg = nodeConfig(t, c)
			cfg.Paths.SignaturePolicy = filepath.Join(t.TempDir(), "none.json")
			b := ferryenv.Start(t, cfg)
			b.WaitPhase(bound, "idle")
			b.Ferry("load", tarPath)
			s = b.Wait(bound, "CRI-O's own verdict", func(s agent.Status) bool {
				return s.Phase == string(agent.PhaseClusterReady) || s.Reason == agent.ReasonLoadFailed || s.Phase == string(agent.PhaseFailed)
			})
			if s.Phase == string(agent.PhaseClusterReady) {
				t.Fatal("CRI-O pulled the list signed at the list level only: ferry's refusal disagrees with it")
			}
			t.Logf("CRI-O refuses it too: %s: %s", s.Reason, s.Message)
		})
	}
}
