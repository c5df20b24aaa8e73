package clusterbench

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/crio/critest"
	"github.com/ferry-edge/ferry/test/fixture"
)

// TestCRI_StandInPassesTheImageServiceSuite: the benchmark's CRI-O
// stand-in passes the suite the loader's expectations of CRI-O are
// written in (crio/critest, which a real CRI-O passes in test/crio):
// pulls through the mirror its registries.conf.d names, pins as its
// crio.conf.d says, and a repository with no mirror refused; and it
// serves its pins at /config, as CRI-O's live configuration.
func TestCRI_StandInPassesTheImageServiceSuite(t *testing.T) {
	reg := fixture.NewRegistry(t)
	a, b := reg.PushImage(t, "bench/a", ""), reg.PushImage(t, "bench/b", "v1")
	dir := t.TempDir()
	confDir, regDir := filepath.Join(dir, "crio.conf.d"), filepath.Join(dir, "registries.conf.d")
	for _, d := range []string{confDir, regDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var mirrors strings.Builder
	for _, repo := range []string{"bench/a", "bench/b"} {
		fmt.Fprintf(&mirrors, "[[registry]]\nprefix = %q\nlocation = %q\n[[registry.mirror]]\nlocation = %q\n\n",
			fixture.Upstream+"/"+repo, fixture.Upstream+"/"+repo, reg.Host+"/"+repo)
	}
	write(t, filepath.Join(regDir, "ferry.conf"), mirrors.String())
	// An earlier file's pins are replaced by a later one's, as in CRI-O.
	write(t, filepath.Join(confDir, "10-crio.conf"), "[crio.image]\npinned_images = [\"quay.io/other\"]\n")
	pin := func(t *testing.T, refs ...string) {
		q := make([]string, len(refs))
		for i, r := range refs {
			q[i] = fmt.Sprintf("%q", r)
		}
		write(t, filepath.Join(confDir, "pin-upgrade.conf"), "[crio]\n[crio.image]\npinned_images = ["+strings.Join(q, ", ")+"]\n")
	}

	cri := StartCRI(t, filepath.Join(dir, "run"), confDir, regDir, 0)
	c, err := crio.Dial(cri.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	critest.RunImageServiceSuite(t, c, critest.Env{
		Pullable: []string{a, b},
		Absent:   fixture.Upstream + "/bench/unmirrored@sha256:" + strings.Repeat("3", 64),
		Pin:      pin,
	})

	pin(t, a)
	pins, err := c.PinnedImages(t.Context())
	if err != nil || len(pins) != 1 || pins[0] != a {
		t.Fatalf("/config says pinned_images %v (%v), want [%s]", pins, err, a)
	}
	if n := len(reg.Requests()); n == 0 {
		t.Fatal("the stand-in pulled without asking the mirror")
	}
	for _, r := range reg.Requests() {
		if r.Method != http.MethodGet || !strings.Contains(r.Path, "/manifests/sha256:") {
			t.Errorf("the stand-in asked the mirror %s %s, want manifests by digest", r.Method, r.Path)
		}
	}
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
