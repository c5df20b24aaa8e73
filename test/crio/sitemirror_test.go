package crio_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/test/crioenv"
	"github.com/ferry-edge/ferry/test/fixture"
)

// TestRealCRIO_SiteMirrorKeepsServingWhileTheBundleIsInstalled: a node
// whose registries.conf (and a drop-in) mirror the bundle's repositories
// to the site's own registry, with the original registry blocked (an
// ImageDigestMirrorSet with NeverContactSource). While the bundle is
// installed, its images come from the embedded registry although the
// site's mirror holds them too, and images of the same repositories that
// the bundle lacks still pull through the site's mirror, by digest and by
// tag. Cleanup leaves the node's files as they were, and the site's
// mirror still serves.
func TestRealCRIO_SiteMirrorKeepsServingWhileTheBundleIsInstalled(t *testing.T) {
	c := crioenv.Start(t)
	const payload, size = 4, 4096
	b := makeBundle(t, payload, size)
	ctx := t.Context()
	cl := c.Client(t)

	// The site's mirror: the same release (same digests) and images the
	// bundle does not have.
	site := fixture.NewRegistry(t)
	site.PushRelease(t, fixture.ReleaseOptions{PayloadImages: payload, ImageSize: size})
	site.PushImage(t, "my-company/app", "v9") // the bundle has my-company/app:v1
	var outside []string
	for i := range 2 {
		ref, err := site.Image(ctx, fixture.PayloadRepo, "", "amd64", int64(8192+i))
		if err != nil {
			t.Fatal(err)
		}
		outside = append(outside, ref)
	}
	regConf := filepath.Join(c.Root, "etc", "containers", "registries.conf")
	siteDropin := filepath.Join(c.Dropins.RegistriesConfDir, "10-site.conf")
	crioenv.Write(t, regConf, fmt.Sprintf(`unqualified-search-registries = []

[[registry]]
  prefix = "quay.io/openshift-release-dev"
  location = "quay.io/openshift-release-dev"
  blocked = true

  [[registry.mirror]]
    location = "%s/openshift-release-dev"
    pull-from-mirror = "digest-only"
`, site.Host))
	crioenv.Write(t, siteDropin, fmt.Sprintf(`[[registry]]
location = "quay.io/my-company/app"
blocked = true

[[registry.mirror]]
location = "%s/my-company/app"
`, site.Host))
	crioenv.Write(t, filepath.Join(c.Dropins.CertsDir, site.Host, "ca.crt"), string(site.CAPEM))
	before := snapshot(t, filepath.Join(c.Root, "etc", "containers"))

	log, _ := newTestLog(t)
	l := &crio.Runtime{CRI: cl, Dropins: c.Dropins, Reloader: c.Reloader(), Log: log}
	if _, err := l.Load(ctx, b.request()); err != nil {
		t.Fatal(err)
	}
	conf, _ := os.ReadFile(filepath.Join(c.Dropins.RegistriesConfDir, crio.DropinName))
	t.Logf("ferry's drop-in:\n%s", conf)

	refs := bundle.PullRefs(b.Images)
	if s := b.Reg.Stats(); s.Manifests < int64(len(refs)) {
		t.Errorf("the embedded registry served %d manifests, want ≥ %d (one per reference)", s.Manifests, len(refs))
	}
	if n := manifestRequests(site); len(n) != 0 {
		t.Errorf("the site's mirror was asked for manifests during the load: %v; the embedded registry must come first", n)
	}

	site.ResetRequests()
	for _, ref := range []string{outside[0], "quay.io/my-company/app:v9"} {
		if _, err := cl.Pull(ctx, ref); err != nil {
			t.Fatalf("pull %s (not in the bundle) while the bundle is installed: %v", ref, err)
		}
	}
	if got := manifestRequests(site); !hasSuffixIn(got, "/manifests/"+strings.SplitN(outside[0], "@", 2)[1]) || !hasSuffixIn(got, "/manifests/v9") {
		t.Errorf("the site's mirror served manifests %v; want %s and the tag v9", got, outside[0])
	}

	if err := l.Unload(ctx, b.request()); err != nil {
		t.Fatal(err)
	}
	after := snapshot(t, filepath.Join(c.Root, "etc", "containers"))
	for p, content := range before {
		if after[p] != content {
			t.Errorf("%s changed by load and cleanup", p)
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("%s left after cleanup", p)
		}
	}
	if _, err := cl.Pull(ctx, outside[1]); err != nil {
		t.Errorf("pull %s through the site's mirror after cleanup: %v", outside[1], err)
	}
}

// manifestRequests lists the manifest paths r answered 2xx.
func manifestRequests(r *fixture.Registry) []string {
	var out []string
	for _, q := range r.Requests() {
		if strings.Contains(q.Path, "/manifests/") && q.Status < 300 {
			out = append(out, q.Method+" "+q.Path)
		}
	}
	return out
}

func hasSuffixIn(list []string, suffix string) bool {
	for _, s := range list {
		if strings.HasSuffix(s, suffix) {
			return true
		}
	}
	return false
}

// snapshot maps every file under root to its content.
func snapshot(t *testing.T, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		m[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}
