package load

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/crio"
	"github.com/ferry-edge/ferry/internal/imagetree"
	"github.com/ferry-edge/ferry/registry"
	"github.com/ferry-edge/ferry/registry/registrytest"
)

// fakeRuntime records what the loading asks of CRI-O and its image store.
type fakeRuntime struct {
	mu      sync.Mutex
	calls   []string
	last    crio.Request
	room    error
	present map[string]bool
	noList  error           // Present's error
	apart   map[string]bool // dirs not on the image store's filesystem
	need    int64           // asked of CheckRoom
	what    string
}

func (f *fakeRuntime) record(op string, r crio.Request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, op)
	f.last = r
	if r.Progress != nil {
		r.Progress(len(r.Pull), len(r.Pull))
	}
	return nil
}
func (f *fakeRuntime) Load(_ context.Context, r crio.Request) (crio.Result, error) {
	return crio.Result{}, f.record("load", r)
}
func (f *fakeRuntime) Unload(_ context.Context, r crio.Request) error { return f.record("unload", r) }
func (f *fakeRuntime) Retire(_ context.Context, r crio.Request) error { return f.record("retire", r) }
func (f *fakeRuntime) Unpin(_ context.Context, r crio.Request) error  { return f.record("unpin", r) }
func (f *fakeRuntime) CheckRoom(need int64, what string) error {
	f.need, f.what = need, what
	return f.room
}
func (f *fakeRuntime) SameFilesystem(dir string) bool { return !f.apart[dir] }
func (f *fakeRuntime) Present(_ context.Context, refs []string) (map[string]bool, error) {
	if f.noList != nil {
		return nil, f.noList
	}
	out := map[string]bool{}
	for _, r := range refs {
		out[r] = f.present[r]
	}
	return out, nil
}

func newLoader(t *testing.T) (*Loader, *fakeRuntime) {
	rt := &fakeRuntime{}
	state := t.TempDir()
	l := &Loader{OpenRegistry: func() (BundleServer, error) { return registry.New(state, 0, nil) }, Runtime: rt, Store: rt}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	for l.parentCtx() == nil {
		time.Sleep(time.Millisecond)
	}
	return l, rt
}

func (l *Loader) parentCtx() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.parent
}

func TestLoader_ServesTheBundleUntilItIsTakenOut(t *testing.T) {
	for _, op := range []string{"retire", "unload"} {
		t.Run(op, func(t *testing.T) {
			l, rt := newLoader(t)
			tree := registrytest.NewTree(t)
			d := tree.Push(t, "openshift-release-dev/ocp-release", "", 256, 1)
			meta := &bundle.Metadata{Version: "4.13.7", Arch: "x86_64", Release: "quay.io/openshift-release-dev/ocp-release@" + d}
			var last int
			if err := l.Load(t.Context(), meta, meta.AllImages(), tree.Root, []string{"quay.io/old@sha256:" + fmt.Sprintf("%064x", 1)}, func(done, _ int) { last = done }); err != nil {
				t.Fatal(err)
			}
			req := rt.last
			if last != 1 || len(req.Keep) != 1 || req.Label != "4.13.7-x86_64" || len(req.Pull) != 1 {
				t.Fatalf("runtime asked %+v (progress %d)", req, last)
			}
			// The registry serves the bundle over TLS with the CA given to CRI-O.
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(req.CACert)
			cl := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 10 * time.Second}
			resp, err := cl.Get("https://" + req.Addr + "/v2/openshift-release-dev/ocp-release/manifests/" + d)
			if err != nil {
				t.Fatalf("registry not serving with its CA: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("manifest: %s", resp.Status)
			}
			// Loading again (a restart) keeps the same registry.
			if err := l.Resume(t.Context(), meta, meta.AllImages(), tree.Root, nil); err != nil || rt.last.Addr != req.Addr {
				t.Fatalf("resume: %v, addr %s → %s", err, req.Addr, rt.last.Addr)
			}
			take := l.Retire
			if op == "unload" {
				take = l.Cleanup
			}
			if err := take(t.Context(), meta, tree.Root); err != nil {
				t.Fatal(err)
			}
			if got := rt.calls[len(rt.calls)-1]; got != op || rt.last.Addr != req.Addr {
				t.Fatalf("last runtime call %s at %s, want %s at %s", got, rt.last.Addr, op, req.Addr)
			}
			if c, err := net.DialTimeout("tcp", req.Addr, time.Second); err == nil {
				c.Close()
				t.Error("registry still up after it was taken out")
			}
		})
	}
}

func TestLoader_RefusesADirectoryWithoutATreeAndAFullStore(t *testing.T) {
	l, rt := newLoader(t)
	meta := &bundle.Metadata{Version: "4.13.7", Arch: "x86_64", Release: fmt.Sprintf("quay.io/a/b@sha256:%064x", 1)}
	if err := l.Load(t.Context(), meta, meta.AllImages(), t.TempDir(), nil, nil); !errors.Is(err, bundle.ErrInvalid) {
		t.Fatalf("got %v, want ErrInvalid", err)
	}
	tree := imagetree.Tree{}
	meta.Release = tree.Add("quay.io/a/b", imagetree.Layer("b", 0))
	rt.room = bundle.ErrNoSpace
	if err := l.Load(t.Context(), meta, meta.AllImages(), writeTree(t, tree), nil, nil); !errors.Is(err, bundle.ErrNoSpace) {
		t.Fatalf("got %v, want ErrNoSpace", err)
	}
	if len(rt.calls) != 0 {
		t.Fatalf("the runtime was asked %v", rt.calls)
	}
}

// writeTree writes tree as an extracted bundle's dir.
func writeTree(t *testing.T, tree imagetree.Tree) string {
	dir := t.TempDir()
	for p, b := range tree {
		p = filepath.Join(dir, bundle.RegistryRoot, p)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, b, 0o644))
	}
	return dir
}

// CRI-O is asked for every image by digest and, for one that kept its tag,
// by tag too; each repository is mirrored where the bundle stores it.
func TestRequestFor_DigestForEveryImageAndTagForTaggedOnes(t *testing.T) {
	d := func(c byte) string { return "sha256:" + strings.Repeat(string(c), 64) }
	images := []string{
		"quay.io/openshift-release-dev/ocp-release@" + d('a'),
		"quay.io/openshift-release-dev/ocp-v4.0-art-dev@" + d('b'),
		"quay.io/openshift-release-dev/ocp-v4.0-art-dev@" + d('c'),
		"quay.io/my-company/my-workload:v2.1@" + d('d'),
	}
	got := RequestFor(images)
	want := []string{
		"quay.io/openshift-release-dev/ocp-release@" + d('a'),
		"quay.io/openshift-release-dev/ocp-v4.0-art-dev@" + d('b'),
		"quay.io/openshift-release-dev/ocp-v4.0-art-dev@" + d('c'),
		"quay.io/my-company/my-workload@" + d('d'),
		"quay.io/my-company/my-workload:v2.1",
	}
	if !slices.Equal(got.Pull, want) {
		t.Errorf("got %q\nwant %q", got.Pull, want)
	}
	if p := got.Mirrors["quay.io/my-company/my-workload"]; p != "my-company/my-workload" || len(got.Mirrors) != 3 {
		t.Errorf("mirrors %q: want each of the 3 repositories at its path in the bundle (my-company/my-workload)", got.Mirrors)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
