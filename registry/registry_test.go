package registry_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/ferry-edge/ferry/registry"
	"github.com/ferry-edge/ferry/registry/registrytest"
)

func testLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) { w.t.Log(string(b)); return len(b), nil }

func TestNew_MakesCertForLoopbackAndKeepsKeyPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "registry")
	r, err := registry.New(dir, 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	block, _ := pem.Decode(r.CACertPEM())
	if block == nil {
		t.Fatal("CACertPEM is not PEM")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !c.IsCA {
		t.Error("certificate is not CA:TRUE; CRI-O could not use it as certs.d ca.crt")
	}
	if err := c.VerifyHostname("127.0.0.1"); err != nil {
		t.Error(err)
	}
	if c.PublicKeyAlgorithm != x509.ECDSA {
		t.Errorf("key algorithm %v, want ECDSA", c.PublicKeyAlgorithm)
	}
	fi, err := os.Stat(filepath.Join(dir, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("tls.key mode %v, want 0600", fi.Mode().Perm())
	}
	if _, port, _ := net.SplitHostPort(r.Addr()); port != strconv.Itoa(r.Port()) || r.Port() == 0 {
		t.Errorf("Addr %s, Port %d", r.Addr(), r.Port())
	}
}

func TestNew_KeepsPortAndCertAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	r1, err := registry.New(dir, 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	port, ca := r1.Port(), string(r1.CACertPEM())
	r1.Close()
	r2, err := registry.New(dir, 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if r2.Port() != port {
		t.Errorf("port %d after restart, want the kept %d", r2.Port(), port)
	}
	if string(r2.CACertPEM()) != ca {
		t.Error("certificate changed across restarts")
	}
}

func TestNew_KeptPortTakenIsErrPortInUse(t *testing.T) {
	dir := t.TempDir()
	r1, err := registry.New(dir, 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close() // still holds the port
	_, err = registry.New(dir, 0, testLog(t))
	if !errors.Is(err, registry.ErrPortInUse) {
		t.Fatalf("got %v, want ErrPortInUse", err)
	}
	t.Log(err)
}

func TestNew_ConfiguredPortWins(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	r, err := registry.New(t.TempDir(), port, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Port() != port {
		t.Errorf("port %d, want configured %d", r.Port(), port)
	}
}

func TestServe_RefusesDirectoryWithoutRegistryTree(t *testing.T) {
	r, err := registry.New(t.TempDir(), 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	err = r.Serve(t.Context(), t.TempDir())
	if !errors.Is(err, registry.ErrNotBundle) {
		t.Fatalf("got %v, want ErrNotBundle", err)
	}
}

// serve starts r over root and returns a transport that trusts only the
// registry's own certificate.
func serve(t *testing.T, r *registry.Registry, root string) remote.Option {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, root) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(r.CACertPEM()) {
		t.Fatal("CA not PEM")
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	t.Cleanup(tr.CloseIdleConnections)
	return remote.WithTransport(tr)
}

func TestServe_PullsOverVerifiedTLSAndCounts(t *testing.T) {
	tree := registrytest.NewTree(t)
	d1 := tree.Push(t, "openshift-release-dev/ocp-v4.0-art-dev", "", 1024, 2)
	d2 := tree.Push(t, "my-company/app", "", 1024, 1)

	r, err := registry.New(t.TempDir(), 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	tr := serve(t, r, tree.Root)
	for _, ref := range []string{
		r.Addr() + "/openshift-release-dev/ocp-v4.0-art-dev@" + d1,
		r.Addr() + "/my-company/app@" + d2,
	} {
		img, err := remote.Image(mustRef(t, ref), tr, remote.WithUserAgent("cri-o/1.34.0"))
		if err != nil {
			t.Fatalf("pull %s: %v", ref, err)
		}
		layers, _ := img.Layers()
		for _, l := range layers {
			rc, err := l.Compressed()
			if err != nil {
				t.Fatal(err)
			}
			rc.Close()
		}
	}
	s := r.Stats()
	if s.Manifests < 2 || s.Blobs < 3 {
		t.Errorf("stats %+v: want ≥2 manifests and ≥3 blobs (layers)", s)
	}
	if s.TLS != s.Requests {
		t.Errorf("%d of %d requests over TLS", s.TLS, s.Requests)
	}
	if s.ByRepo["openshift-release-dev/ocp-v4.0-art-dev"] == 0 || s.ByRepo["my-company/app"] == 0 {
		t.Errorf("ByRepo %v", s.ByRepo)
	}
	if s.UserAgents["cri-o"] == 0 {
		t.Errorf("UserAgents %v", s.UserAgents)
	}
}

func TestServe_UntrustedClientCannotPull(t *testing.T) {
	tree := registrytest.NewTree(t)
	d := tree.Push(t, "a/b", "", 512, 1)
	r, err := registry.New(t.TempDir(), 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	serve(t, r, tree.Root)
	_, err = remote.Image(mustRef(t, r.Addr()+"/a/b@"+d)) // system roots only
	var uerr x509.UnknownAuthorityError
	if !errors.As(err, &uerr) {
		t.Fatalf("got %v, want an unknown-authority error", err)
	}
}

func TestServe_RefusesPushAndDelete(t *testing.T) {
	tree := registrytest.NewTree(t)
	d := tree.Push(t, "a/b", "", 512, 1)
	r, err := registry.New(t.TempDir(), 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	tr := serve(t, r, tree.Root)
	img, _ := random.Image(256, 1)
	if err := remote.Write(mustRef(t, r.Addr()+"/a/new:v1"), img, tr); err == nil {
		t.Error("push accepted by a read-only registry")
	}
	if err := remote.Delete(mustRef(t, r.Addr()+"/a/b@"+d), tr); err == nil {
		t.Error("delete accepted by a read-only registry")
	}
	if _, err := remote.Head(mustRef(t, r.Addr()+"/a/b@"+d), tr); err != nil {
		t.Errorf("image gone after refused delete: %v", err)
	}
	if r.Stats().Refused == 0 {
		t.Error("refused writes not counted")
	}
	if _, err := os.Stat(filepath.Join(tree.Root, "docker/registry/v2/repositories/a/new")); err == nil {
		t.Error("push wrote into the bundle tree")
	}
}

func TestServe_KeptTagServedFromMetadataEvenIfTreeLacksIt(t *testing.T) {
	tree := registrytest.NewTree(t)
	d := tree.Push(t, "my-company/workload", "", 512, 1)
	md := fmt.Sprintf(`{"release":"quay.io/x/rel@%s","images":["quay.io/my-company/workload:v2.1@%s"]}`, d, d)
	if err := os.WriteFile(filepath.Join(tree.Root, "metadata.json"), []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := registry.New(t.TempDir(), 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	tr := serve(t, r, tree.Root)
	desc, err := remote.Head(mustRef(t, r.Addr()+"/my-company/workload:v2.1"), tr)
	if err != nil {
		t.Fatal(err)
	}
	if desc.Digest.String() != d {
		t.Errorf("tag v2.1 served %s, want %s", desc.Digest, d)
	}
	if _, err := remote.Head(mustRef(t, r.Addr()+"/my-company/workload:other"), tr); err == nil {
		t.Error("a tag the bundle does not hold was served")
	}
}

// TestServe_OnlyWhatMetadataLists: a tag or repository the tree holds but
// metadata.json does not list is unknown (404, the registry's own error
// codes), so that a mirror for a listed repository never serves more.
func TestServe_OnlyWhatMetadataLists(t *testing.T) {
	tree := registrytest.NewTree(t)
	rel := tree.Push(t, "openshift-release-dev/ocp-release", "", 256, 1)
	app := tree.Push(t, "team/app", "v1", 256, 1)
	tree.Push(t, "team/app", "latest", 256, 1)
	tools := tree.Push(t, "team/app/tools", "latest", 256, 1)
	toolsBlob := blobsOf(t, tree.Root, "team/app/tools")[0]
	md := fmt.Sprintf(`{"release":"quay.io/openshift-release-dev/ocp-release@%s","images":["quay.io/team/app:v1@%s"]}`, rel, app)
	if err := os.WriteFile(filepath.Join(tree.Root, "metadata.json"), []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := registry.New(t.TempDir(), 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	h, shutdown, err := r.Handler(t.Context(), tree.Root)
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown()

	for _, c := range []struct {
		name, method, path string
		status             int
		code               string
	}{
		{"listed tag", "GET", "/v2/team/app/manifests/v1", 200, ""},
		{"listed digest", "HEAD", "/v2/team/app/manifests/" + app, 200, ""},
		{"unlisted tag of a listed repository", "GET", "/v2/team/app/manifests/latest", 404, "MANIFEST_UNKNOWN"},
		{"unlisted repository by tag", "GET", "/v2/team/app/tools/manifests/latest", 404, "NAME_UNKNOWN"},
		{"unlisted repository by digest", "GET", "/v2/team/app/tools/manifests/" + tools, 404, "NAME_UNKNOWN"},
		{"unlisted repository's blob", "GET", "/v2/team/app/tools/blobs/" + toolsBlob, 404, "NAME_UNKNOWN"},
		{"unlisted repository's tags", "GET", "/v2/team/app/tools/tags/list", 404, "NAME_UNKNOWN"},
		{"unknown repository", "HEAD", "/v2/no/such/blobs/" + toolsBlob, 404, "NAME_UNKNOWN"},
		{"dot-dot in the name", "GET", "/v2/team/app/../app/tools/manifests/latest", 404, "NAME_UNKNOWN"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(c.method, c.path, nil))
			if w.Code != c.status {
				t.Fatalf("%s %s: %d, want %d: %s", c.method, c.path, w.Code, c.status, w.Body)
			}
			if c.code == "" {
				return
			}
			var body struct{ Errors []struct{ Code string } }
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || len(body.Errors) != 1 || body.Errors[0].Code != c.code {
				t.Errorf("body %q, want one error %s", w.Body, c.code)
			}
		})
	}
}

func TestServe_RefusesTreeWithoutMetadata(t *testing.T) {
	tree := registrytest.NewTree(t)
	tree.Push(t, "a/b", "v1", 256, 1)
	if err := os.Remove(filepath.Join(tree.Root, "metadata.json")); err != nil {
		t.Fatal(err)
	}
	r, err := registry.New(t.TempDir(), 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, _, err = r.Handler(t.Context(), tree.Root)
	if !errors.Is(err, registry.ErrNotBundle) {
		t.Fatalf("got %v, want ErrNotBundle", err)
	}
	t.Log(err)
}

func TestServe_StopsWhenContextEnds(t *testing.T) {
	tree := registrytest.NewTree(t)
	tree.Push(t, "a/b", "v1", 256, 1)
	r, err := registry.New(t.TempDir(), 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, tree.Root) }()
	// wait until it answers
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(r.CACertPEM())
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	for i := 0; ; i++ {
		resp, err := cl.Get("https://" + r.Addr() + "/v2/")
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Serve returned early: %v", err)
		default:
		}
		if i > 500 {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve returned %v after cancel, want nil", err)
	}
	if _, err := net.Dial("tcp", r.Addr()); err == nil {
		t.Error("still listening after Serve returned")
	}
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	ref, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// The CA CRI-O trusts for the mirror vouches for loopback names only and
// signs no other CA; one made before that is made anew.
func TestNew_CertificateIsConstrainedToLoopback(t *testing.T) {
	dir := t.TempDir()
	r, err := registry.New(dir, 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	block, _ := pem.Decode(r.CACertPEM())
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !c.PermittedDNSDomainsCritical || len(c.PermittedIPRanges) != 2 || !c.MaxPathLenZero {
		t.Fatalf("constraints: critical %v, IP ranges %v, max path len zero %v", c.PermittedDNSDomainsCritical, c.PermittedIPRanges, c.MaxPathLenZero)
	}
	// A leaf for another name, signed with the registry's key, does not
	// verify against it.
	key, err := os.ReadFile(filepath.Join(dir, "tls.key"))
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := pem.Decode(key)
	priv, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), DNSNames: []string{"quay.io"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(c)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "quay.io"}); err == nil {
		t.Fatal("the registry's CA vouches for quay.io")
	}
}

// Connections past MaxConns wait to be accepted.
func TestServe_BoundsConnections(t *testing.T) {
	tree := registrytest.NewTree(t)
	tree.Push(t, "openshift-release-dev/ocp-v4.0-art-dev", "", 1024, 1)
	r, err := registry.New(t.TempDir(), 0, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	r.MaxConns = 2
	serve(t, r, tree.Root)
	var held []*tls.Conn
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(r.CACertPEM())
	dial := func() (*tls.Conn, error) {
		d := &net.Dialer{Timeout: 10 * time.Second}
		return tls.DialWithDialer(d, "tcp", r.Addr(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	}
	for range 2 {
		c, err := dial()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	third := make(chan error, 1)
	go func() {
		c, err := dial() // connects, but its handshake waits for a turn
		if err == nil {
			c.Close()
		}
		third <- err
	}()
	select {
	case err := <-third:
		t.Fatalf("a third connection was served while two were held (%v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	held[0].Close()
	if err := <-third; err != nil {
		t.Fatalf("the third connection, once one closed: %v", err)
	}
	held[1].Close()
}
