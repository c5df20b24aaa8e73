package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/freeport"
)

// remake writes a bundle of tree and meta with a .sha256 that agrees with
// it, as a bundle made from a broken registry would be.
func remake(t *testing.T, meta *bundle.Metadata, tree string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "upgrade-4.13.7-x86_64.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	m := *meta
	digest, _, err := bundle.WriteTar(f, &m, tree)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(strings.TrimSuffix(p, ".tar")+".sha256", []byte(bundle.FormatSHA256File(string(digest), filepath.Base(p))), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// extractTree is the registry tree of tarPath in a scratch dir.
func extractTree(t *testing.T, tarPath string) string {
	t.Helper()
	tree := filepath.Join(t.TempDir(), "tree")
	if out, err := exec.Command(ferryenv.Binary(t), "bundle", "extract", "--quiet", tarPath, "--dest", tree).CombinedOutput(); err != nil {
		t.Fatalf("extract: %v\n%s", err, out)
	}
	return tree
}

func blobPath(tree, digest string) string {
	h := strings.TrimPrefix(digest, "sha256:")
	return filepath.Join(tree, bundle.RegistryRoot, "blobs/sha256", h[:2], h, "data")
}

// firstLayer is the first layer of the image ref (by digest) in tree.
func firstLayer(t *testing.T, tree, ref string) string {
	t.Helper()
	_, _, d := bundle.SplitRef(ref)
	b, err := os.ReadFile(blobPath(tree, d))
	if err != nil {
		t.Fatal(err)
	}
	var m struct{ Layers []struct{ Digest string } }
	if err := json.Unmarshal(b, &m); err != nil || len(m.Layers) == 0 {
		t.Fatalf("manifest of %s: %v %s", ref, err, b)
	}
	return m.Layers[0].Digest
}

// TestHost_ABundleThatLiesIsRefusedAtOnce: bundles whose tar and .sha256
// agree but whose tree does not hold what metadata.json says are refused
// by `ferry bundle verify`, by `ferry bundle extract` and by a real agent
// given them with `ferry load`, naming the missing or lying item; the
// agent shares nothing with peers, writes no drop-in and pulls nothing
// into the real CRI-O (docs/design.md, "The tree check").
func TestHost_ABundleThatLiesIsRefusedAtOnce(t *testing.T) {
	c := crioenv.Start(t)
	good, meta := makeBundle(t, 3, 0)
	base := extractTree(t, good)
	release, image := meta.Release, meta.Images[1]
	layer := firstLayer(t, base, meta.Images[0])

	cases := []struct {
		name   string
		break_ func(tree string) error
		naming []string
	}{
		{"an image listed but absent from the tree", func(tree string) error {
			name, _, d := bundle.SplitRef(image)
			return os.RemoveAll(filepath.Join(tree, bundle.RegistryRoot, "repositories", bundle.RepoPath(name), "_manifests/revisions/sha256", strings.TrimPrefix(d, "sha256:")))
		}, []string{"the image " + image, "not in the bundle"}},
		{"the release absent", func(tree string) error {
			_, _, d := bundle.SplitRef(release)
			return os.RemoveAll(filepath.Dir(blobPath(tree, d)))
		}, []string{"the release image " + release, "not in the bundle"}},
		{"a layer blob missing", func(tree string) error {
			return os.RemoveAll(filepath.Dir(blobPath(tree, layer)))
		}, []string{"blob " + layer, "not in the bundle"}},
		{"a blob whose bytes do not hash to its path", func(tree string) error {
			p := blobPath(tree, layer)
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b[len(b)/2] ^= 0xff
			return os.WriteFile(p, b, 0o644)
		}, []string{"blob " + layer, "does not hash to its name"}},
	}

	cfg := nodeConfig(t, c)
	cfg.Peer.Listen, cfg.Peer.Open = freeport.Addr(t), true
	a := ferryenv.Start(t, cfg)
	a.WaitPhase(bound, "idle")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tree := filepath.Join(t.TempDir(), "tree")
			if out, err := exec.Command("cp", "-a", base, tree).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v %s", err, out)
			}
			if err := tc.break_(tree); err != nil {
				t.Fatal(err)
			}
			tarPath := remake(t, meta, tree)
			says := func(what, out string) {
				for _, s := range append(tc.naming, "make it again") {
					if !strings.Contains(out, s) {
						t.Errorf("%s does not say %q:\n%s", what, s, out)
					}
				}
			}

			out, err := exec.Command(ferryenv.Binary(t), "bundle", "verify", tarPath).CombinedOutput()
			if exitCode(err) != 1 {
				t.Fatalf("bundle verify: exit %v, want 1\n%s", err, out)
			}
			says("bundle verify", string(out))
			dest := filepath.Join(t.TempDir(), "out")
			out, err = exec.Command(ferryenv.Binary(t), "bundle", "extract", tarPath, "--dest", dest).CombinedOutput()
			if exitCode(err) != 1 {
				t.Fatalf("bundle extract: exit %v, want 1\n%s", err, out)
			}
			says("bundle extract", string(out))
			if _, err := os.Stat(dest); !os.IsNotExist(err) {
				t.Errorf("bundle extract left %s", dest)
			}

			if out, err := a.Ferry("load", tarPath); err != nil {
				t.Fatalf("ferry load: %v\n%s", err, out)
			}
			s := a.Wait(bound, "this bundle refused", func(s agent.Status) bool {
				return s.Phase == string(agent.PhaseRejected)
			})
			says("the agent's status", s.Message)
			t.Logf("%s", s.Line)
			if shared := sharedBundles(t, cfg.Peer.Listen); len(shared) != 0 {
				t.Errorf("shared with peers: %v", shared)
			}
			for _, d := range []string{cfg.Paths.RegistriesConfDir, cfg.Paths.CRIOConfDir, cfg.Paths.CertsDir} {
				if ents, _ := os.ReadDir(d); len(ents) != 0 {
					t.Errorf("%s holds %s", d, ents[0].Name())
				}
			}
			cl := c.Client(t)
			for _, ref := range refsOf(meta) {
				if present, _, err := cl.Status(t.Context(), ref); err != nil || present {
					t.Errorf("%s: present=%v err=%v: pulled", ref, present, err)
				}
			}
		})
	}
	// The same agent then takes the whole bundle: shared, mirrored, pulled.
	if out, err := a.Ferry("load", good); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	a.WaitPhase(bound, agent.PhaseClusterReady)
	if len(sharedBundles(t, cfg.Peer.Listen)) != 1 {
		t.Error("the whole bundle is not shared")
	}
	checkPinned(t, c.Client(t), refsOf(meta), true)
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// sharedBundles lists what the agent's peer server offers.
func sharedBundles(t *testing.T, addr string) []json.RawMessage {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://%s/v1/bundles", addr))
	if err != nil {
		t.Fatalf("peer server: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("peer server: %s", resp.Status)
	}
	var list []json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatalf("peer server: %v", err)
	}
	return list
}
