package crio_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/registry"
	"github.com/ferry-edge/ferry/registry/registrytest"
)

func TestBundleLoader_ServesUntilCleanup(t *testing.T) {
	l, f, ds := newLoader(t)
	tree := registrytest.NewTree(t)
	d := tree.Push(t, "openshift-release-dev/ocp-release", "", 256, 1)
	meta := &bundle.Metadata{Version: "4.13.7", Arch: "x86_64", Release: "quay.io/openshift-release-dev/ocp-release@" + d,
		Images: []string{fmt.Sprintf("quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:%064x", 9)}}
	bl := &crio.BundleLoader{Loader: l, RegistryStateDir: t.TempDir(), Log: testLog(t)}
	defer bl.Close()
	var last int
	if err := bl.Load(t.Context(), meta, tree.Root, nil, func(done, total int) { last = done }); err != nil {
		t.Fatal(err)
	}
	if last != 2 || !f.present[meta.Release] {
		t.Errorf("progress ended at %d; release present %v", last, f.present[meta.Release])
	}
	conf, err := os.ReadFile(filepath.Join(ds.d.RegistriesConfDir, crio.DropinName))
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.Fields(strings.SplitN(string(conf), "registry on ", 2)[1])[0]
	ca, _ := os.ReadFile(filepath.Join(ds.d.CertsDir, addr, "ca.crt"))
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 10 * time.Second}
	resp, err := cl.Get("https://" + addr + "/v2/openshift-release-dev/ocp-release/manifests/" + d)
	if err != nil {
		t.Fatalf("registry not serving the bundle with the installed CA: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("manifest: %s", resp.Status)
	}

	// Loading again (an agent restart) keeps the same registry.
	if err := bl.Load(t.Context(), meta, tree.Root, nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := bl.Cleanup(t.Context(), meta, tree.Root); err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Error("registry still up after cleanup")
	}
	if _, err := os.Stat(filepath.Join(ds.d.CertsDir, addr)); err == nil {
		t.Error("CA left after cleanup")
	}
}

func TestBundleLoader_RefusesDirectoryWithoutTree(t *testing.T) {
	l, _, _ := newLoader(t)
	bl := &crio.BundleLoader{Loader: l, RegistryStateDir: t.TempDir()}
	defer bl.Close()
	meta := &bundle.Metadata{Version: "4.13.7", Arch: "x86_64", Release: fmt.Sprintf("quay.io/a/b@sha256:%064x", 1)}
	if err := bl.Load(t.Context(), meta, t.TempDir(), nil, nil); !errors.Is(err, registry.ErrNotBundle) {
		t.Fatalf("got %v, want ErrNotBundle", err)
	}
}
