package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/registry"
	"github.com/ferry-edge/ferry/registry/registrytest"
)

// fakeRuntime records what the loading asks of CRI-O.
type fakeRuntime struct {
	mu    sync.Mutex
	calls []string
	last  RuntimeRequest
	room  error
}

func (f *fakeRuntime) record(op string, r RuntimeRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, op)
	f.last = r
	if r.Progress != nil {
		r.Progress(len(r.Images), len(r.Images))
	}
	return nil
}
func (f *fakeRuntime) Load(_ context.Context, r RuntimeRequest) error   { return f.record("load", r) }
func (f *fakeRuntime) Unload(_ context.Context, r RuntimeRequest) error { return f.record("unload", r) }
func (f *fakeRuntime) Retire(_ context.Context, r RuntimeRequest) error { return f.record("retire", r) }
func (f *fakeRuntime) Unpin(_ context.Context, r RuntimeRequest) error  { return f.record("unpin", r) }
func (f *fakeRuntime) CheckRoom(int64) error                            { return f.room }

func newLoading(t *testing.T) (*Loading, *fakeRuntime) {
	rt := &fakeRuntime{}
	state := t.TempDir()
	l := &Loading{OpenRegistry: func() (BundleServer, error) { return registry.New(state, 0, nil) }, Runtime: rt}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	for l.parentCtx() == nil {
		time.Sleep(time.Millisecond)
	}
	return l, rt
}

func (l *Loading) parentCtx() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.parent
}

func TestLoading_ServesTheBundleUntilItIsTakenOut(t *testing.T) {
	for _, op := range []string{"retire", "unload"} {
		t.Run(op, func(t *testing.T) {
			l, rt := newLoading(t)
			tree := registrytest.NewTree(t)
			d := tree.Push(t, "openshift-release-dev/ocp-release", "", 256, 1)
			meta := &bundle.Metadata{Version: "4.13.7", Arch: "x86_64", Release: "quay.io/openshift-release-dev/ocp-release@" + d}
			var last int
			if err := l.Load(t.Context(), meta, tree.Root, []string{"quay.io/old@sha256:" + fmt.Sprintf("%064x", 1)}, func(done, _ int) { last = done }); err != nil {
				t.Fatal(err)
			}
			req := rt.last
			if last != 1 || len(req.Keep) != 1 || req.Label != "4.13.7-x86_64" || len(req.Images) != 1 {
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
			if err := l.Resume(t.Context(), meta, tree.Root, nil); err != nil || rt.last.Addr != req.Addr {
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

func TestLoading_RefusesADirectoryWithoutATreeAndAFullStore(t *testing.T) {
	l, rt := newLoading(t)
	meta := &bundle.Metadata{Version: "4.13.7", Arch: "x86_64", Release: fmt.Sprintf("quay.io/a/b@sha256:%064x", 1)}
	if err := l.Load(t.Context(), meta, t.TempDir(), nil, nil); !errors.Is(err, bundle.ErrInvalid) {
		t.Fatalf("got %v, want ErrInvalid", err)
	}
	rt.room = bundle.ErrNoSpace
	if err := l.Load(t.Context(), meta, t.TempDir(), nil, nil); !errors.Is(err, bundle.ErrNoSpace) {
		t.Fatalf("got %v, want ErrNoSpace", err)
	}
	if len(rt.calls) != 0 {
		t.Fatalf("the runtime was asked %v", rt.calls)
	}
}
