//go:build faults

package faults

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/test/ferryenv"
)

// TestInvariants_CatchABrokenNode proves the campaign's checks can fail:
// a published dir with a damaged blob, one missing a blob, and a record
// that says extracted with the wrong digest are each caught.
func TestInvariants_CatchABrokenNode(t *testing.T) {
	tarPath, digest, blobs := bigBundle(t, 32, 8)
	good := filepath.Join(t.TempDir(), "good")
	src, err := bundle.FindSource(tarPath, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bundle.Extract(t.Context(), src, good, bundle.Options{Policy: bundle.Policy{SpaceFactor: -1}}); err != nil {
		t.Fatal(err)
	}
	firstBlob := func(dir string) string {
		m, _ := filepath.Glob(filepath.Join(dir, "docker/registry/v2/blobs/sha256/*/*/data"))
		if len(m) == 0 {
			t.Fatal("no blob")
		}
		return m[0]
	}
	tests := []struct {
		name    string
		breakIt func(n *node, dir string)
		want    string
	}{
		{"a complete tree passes", func(*node, string) {}, ""},
		{"a damaged blob in a published dir", func(_ *node, dir string) {
			p := firstBlob(dir)
			b, _ := os.ReadFile(p)
			b[len(b)/2] ^= 1
			os.WriteFile(p, b, 0o644)
		}, "does not match its digest"},
		{"a blob missing from a published dir", func(_ *node, dir string) {
			os.Remove(firstBlob(dir))
		}, "not a complete bundle"},
		{"a record that says extracted with another digest", func(n *node, dir string) {
			store, err := agent.OpenStore(n.cfg.Paths.StateDir)
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Save(&agent.Record{ID: strings.Repeat("0", 64), Digest: zeroDigest, Name: "x.tar", Dir: dir, Phase: agent.PhaseExtracted}); err != nil {
				t.Fatal(err)
			}
		}, "want " + string(digest)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ferryenv.Config(t.TempDir())
			n := &node{cfg: cfg, digest: digest, wantBlobs: blobs}
			dir := filepath.Join(cfg.Paths.ExtractDir, "0.1.32-x86_64")
			if err := os.MkdirAll(cfg.Paths.ExtractDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.CopyFS(dir, os.DirFS(good)); err != nil {
				t.Fatal(err)
			}
			tc.breakIt(n, dir)
			err := n.invariants(context.Background())
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("a good node fails the checks: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// zeroDigest is a bundle digest no test makes.
var zeroDigest = digest.Digest("sha256:" + strings.Repeat("0", 64))

// The CRI-O log check fails a broken drop-in, and a vanished one only
// when no reload completed after it.
func TestReloadsFailed_ABrokenDropinNotARaceARecovered(t *testing.T) {
	const (
		broken   = `level=error msg="Unable to reload configuration: parsing /etc/crio/crio.conf.d/pin-upgrade.conf: toml: expected '='"`
		vanished = `level=error msg="Unable to reload configuration: update config from path: walk path: lstat /etc/crio/crio.conf.d/pin-upgrade.conf: no such file or directory"`
		done     = `level=info msg="Configuration reload completed"`
	)
	for log, bad := range map[string]bool{
		done:                                 false,
		broken + "\n" + done:                 true,
		vanished + "\n" + done:               false,
		done + "\n" + vanished:               true,
		done + "\n" + vanished + "\n" + done: false,
	} {
		if err := reloadsFailed(log); (err != nil) != bad {
			t.Errorf("log %q: got %v, want failure %v", log, err, bad)
		}
	}
}
