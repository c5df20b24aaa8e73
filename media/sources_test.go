package media

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ferry-edge/ferry/internal/fakesys"
)

// TestBundles_NeverReopenAStickPath: a bundle and its sidecar swapped on
// the stick after Open are not what the agent reads: Bundles names the
// files Open opened, not their paths.
func TestBundles_NeverReopenAStickPath(t *testing.T) {
	dir := t.TempDir()
	fakesys.Write(t, dir, map[string]string{
		"upgrade-4.13.7-x86_64.tar":    "checked tar",
		"upgrade-4.13.7-x86_64.sha256": "checked sum",
	})
	cands, err := findCandidates(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := &Medium{Candidates: cands}
	t.Cleanup(func() { m.Close() })
	// Swapped under the same names: what a crafted stick would do.
	fakesys.Write(t, dir, map[string]string{"swap.tar": "swapped tar", "swap.sha256": "swapped sum"})
	for from, to := range map[string]string{"swap.tar": "upgrade-4.13.7-x86_64.tar", "swap.sha256": "upgrade-4.13.7-x86_64.sha256"} {
		if err := os.Rename(filepath.Join(dir, from), filepath.Join(dir, to)); err != nil {
			t.Fatal(err)
		}
	}
	srcs := m.Bundles()
	if len(srcs) != 1 {
		t.Fatalf("%d bundles, want 1", len(srcs))
	}
	s := srcs[0]
	if s.Label != filepath.Join(dir, "upgrade-4.13.7-x86_64.tar") {
		t.Errorf("label %q, want the path on the stick", s.Label)
	}
	for path, want := range map[string]string{s.Path: "checked tar", s.SHA256Path: "checked sum"} {
		b, err := os.ReadFile(path)
		if err != nil || string(b) != want {
			t.Errorf("%s reads %q (%v), want %q: a path on the stick was opened again", path, b, err, want)
		}
	}
}
