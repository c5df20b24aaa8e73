package pull_test

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/ferry-edge/ferry/bundle/create"
	"github.com/ferry-edge/ferry/internal/testca"
	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/pull"
	"github.com/ferry-edge/ferry/test/fixture"
	"github.com/ferry-edge/ferry/test/releasesig"
)

const shareToken = "cluster"

// gate holds one blob's download (a payload image's own layer) at its
// half until opened: the pull has then resolved everything, and that
// blob lies half in .partial/.
type gate struct {
	base   http.RoundTripper
	digest string
	open   chan struct{}
	once   sync.Once
}

func (g *gate) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := g.base.RoundTrip(r)
	if err != nil || !strings.HasSuffix(r.URL.Path, "/blobs/"+g.digest) || resp.ContentLength <= 1 {
		return resp, err
	}
	resp.Body = &gatedBody{ReadCloser: resp.Body, left: resp.ContentLength / 2, open: g.open}
	return resp, nil
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

type gatedBody struct {
	io.ReadCloser
	left int64 // bytes before the gate
	open chan struct{}
}

func (b *gatedBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		<-b.open
		return b.ReadCloser.Read(p)
	}
	n, err := b.ReadCloser.Read(p[:min(int64(len(p)), b.left)])
	b.left -= int64(n)
	return n, err
}

// sharing is a pull of a release (with two signatures in the node's
// signature store) and an extra image by tag, one of its layers held at
// its half, served on a peer server with a token.
type sharing struct {
	*harness
	reg     *fixture.Registry
	gate    *gate
	sigs    [][]byte // the release's signatures in the puller's store
	srv     *httptest.Server
	req     pull.Request
	layer   string // the held blob
	size    int64  // its size
	extra   string // the extra image's digest
	partial string
}

func newSharing(t *testing.T, wait time.Duration) *sharing {
	return newSharingOf(t, 256<<10, pull.Options{ShareWait: wait})
}

// newSharingOf is newSharing with images of imageSize and o's share
// options.
func newSharingOf(t *testing.T, imageSize int64, o pull.Options) *sharing {
	t.Helper()
	reg := fixture.NewRegistry(t)
	extra := reg.PushImage(t, "my/app", "v1")
	release, payload := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 3, ImageSize: imageSize, Seed: 7})
	ref, err := name.ParseReference(reg.Local(payload[0]))
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(ref, remote.WithTransport(reg.Transport()))
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	big := slices.MaxFunc(m.Layers, func(a, b v1.Descriptor) int { return cmp.Compare(a.Size, b.Size) })
	s := &sharing{reg: reg, layer: big.Digest.String(), size: big.Size, extra: extra[strings.LastIndex(extra, "@")+1:]}
	base, err := create.NewTransport(reg.CertsDir, true)
	if err != nil {
		t.Fatal(err)
	}
	s.gate = &gate{base: base, digest: s.layer, open: make(chan struct{})}
	s.sigs = append(releasesig.Signatures(release, "4.13.7"), releasesig.NewKey().SignRelease(release, "4.13.7", "x86_64"))
	relHex := release[strings.LastIndex(release, ":")+1:]
	store := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i, b := range s.sigs {
			if r.URL.Path == fmt.Sprintf("/sha256=%s/signature-%d", relHex, i+1) {
				w.Write(b)
				return
			}
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(store.Close)
	s.harness = newHarness(t, reg, pull.Options{ShareWait: o.ShareWait, ShareStall: o.ShareStall, SignatureStore: store.URL,
		Transport: func() (http.RoundTripper, error) { return s.gate, nil }})
	s.partial = filepath.Join(s.dir, "work", ".partial", strings.TrimPrefix(s.layer, "sha256:"))
	s.srv = httptest.NewServer(peer.NewServer(nil, peer.ServerOptions{Token: shareToken, Pull: s.p.Handler()}))
	t.Cleanup(s.srv.Close)
	s.req = pull.Request{Release: release, Extras: []string{"quay.io/my/app:v1"}, Created: time.Date(2026, 11, 27, 6, 0, 0, 0, time.UTC)}
	return s
}

// start runs the pull through the gate and waits until the held blob
// lies half in .partial/.
func (s *sharing) start(t *testing.T) {
	t.Helper()
	h := s.harness
	h.run(t)
	t.Cleanup(s.gate.release) // before the run's end, which waits for it
	if err := h.p.Start(s.req); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the held blob half in .partial/", func() bool {
		fi, err := os.Stat(s.partial)
		return err == nil && fi.Size() > 0
	})
}

// followed waits until f has every blob of the pull but the held one,
// and asks for that one, waiting for it: the pull cannot end before.
func (s *sharing) followed(t *testing.T, f *harness) {
	t.Helper()
	waitUntil(t, "the follower to hold all but the held blob, and wait for it", func() bool {
		fs := f.p.Status()
		return fs.ToFetch > 0 && fs.Bytes+s.size == fs.ToFetch && s.p.Status().Waiting > 0
	})
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get asks the peer server for path, with the token unless bare.
func (s *sharing) get(t *testing.T, path string, bare bool) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.URL.Opaque = path // sent as written: the server sees the tricks
	if !bare {
		req.Header.Set("Authorization", "Bearer "+shareToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

// The pulling node serves what its pull resolved, to the peers only:
// manifests by digest and the extra image's tag as it resolved it;
// anything else, a bad digest or a path trick is 404 or refused, and a
// blob that lies only half downloaded is not served: the follower is
// told to ask again.
func TestShare_ServesWhatThePullResolvedNotPartsNotOthers(t *testing.T) {
	s := newSharing(t, 100*time.Millisecond)
	s.start(t)
	relDigest := s.req.Release[strings.LastIndex(s.req.Release, "@")+1:]
	rel := "/v2/quay.io/openshift-release-dev/ocp-release"

	if code, _, _ := s.get(t, "/v2/", true); code != http.StatusUnauthorized {
		t.Errorf("/v2/ without the token: %d, want 401", code)
	}
	if code, _, _ := s.get(t, rel+"/manifests/"+relDigest, true); code != http.StatusUnauthorized {
		t.Errorf("a manifest without the token: %d, want 401", code)
	}
	if code, _, _ := s.get(t, "/v2/", false); code != http.StatusOK {
		t.Errorf("/v2/ with the token: %d, want 200", code)
	}
	code, hdr, body := s.get(t, rel+"/manifests/"+relDigest, false)
	if code != http.StatusOK || sum(body) != relDigest || hdr.Get("Docker-Content-Digest") != relDigest {
		t.Errorf("the release's manifest: %d, %s (header %s), want %s", code, sum(body), hdr.Get("Docker-Content-Digest"), relDigest)
	}
	if code, _, body := s.get(t, "/v2/quay.io/my/app/manifests/v1", false); code != http.StatusOK || sum(body) != s.extra {
		t.Errorf("the extra image by tag: %d, %s, want the digest the pull resolved, %s", code, sum(body), s.extra)
	}
	unknown := "sha256:" + strings.Repeat("0", 64)
	for _, path := range []string{
		"/v2/quay.io/my/app/manifests/v2",
		"/v2/quay.io/my/app/manifests/" + unknown,
		"/v2/quay.io/my/app/blobs/" + unknown,
		"/v2/quay.io/my/app/blobs/sha256:ABC",
		"/v2/quay.io/my/app/blobs/sha256:" + strings.Repeat("a", 63),
		"/v2/quay.io/my/app/referrers/" + relDigest,
		"/v2/quay.io/my/app/tags/list",
		"/v1/pull/signatures/sha256=" + strings.Repeat("0", 64) + "/signature-1",
	} {
		if code, _, _ := s.get(t, path, false); code != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", path, code)
		}
	}
	for _, path := range []string{
		"/v2/../../../../etc/passwd",
		"/v2/quay.io/my/app/blobs/../../../../../etc/passwd",
		"/v2/quay.io/my/app/blobs/..%2F..%2F..%2F..%2Fetc%2Fpasswd",
		"/v2/quay.io/my/app/blobs/sha256:..%2F..%2F..%2Fetc%2Fpasswd",
		"/v2/%2E%2E/%2E%2E/blobs/" + s.layer,
		"/v2/quay.io/my/app/blobs/" + s.layer + "/../../../../.partial/" + strings.TrimPrefix(s.layer, "sha256:"),
		"/v2/.partial/blobs/" + strings.TrimPrefix(s.layer, "sha256:"),
	} {
		code, _, body := s.get(t, path, false)
		if code == http.StatusOK || strings.Contains(string(body), "root:") {
			t.Errorf("%s: %d %q: a path trick was answered", path, code, body)
		}
	}
	code, hdr, body = s.get(t, "/v2/quay.io/my/app/blobs/"+s.layer, false)
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Errorf("a blob half downloaded: %d (Retry-After %q), %d bytes; want 503 with Retry-After", code, hdr.Get("Retry-After"), len(body))
	}
}

// A blob the pull still fetches is waited for and served once it
// arrives, whole and verified; once the pull has ended, nothing is
// served and the follower is told to ask again.
func TestShare_AWaitedBlobIsServedOnceItArrives(t *testing.T) {
	s := newSharing(t, time.Minute)
	entered := make(chan struct{})
	once := sync.OnceFunc(func() { close(entered) })
	srv := s.srv.Config.Handler
	s.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/blobs/"+s.layer) {
			once()
		}
		srv.ServeHTTP(w, r)
	})
	s.start(t)
	type answer struct {
		code int
		body []byte
	}
	got := make(chan answer, 1)
	go func() {
		code, _, body := s.get(t, "/v2/quay.io/openshift-release-dev/x/blobs/"+s.layer, false)
		got <- answer{code, body}
	}()
	<-entered // asked while the blob lies half downloaded: it waits
	s.gate.release()
	a := <-got
	if a.code != http.StatusOK || sum(a.body) != s.layer {
		t.Fatalf("the awaited blob: %d, %s, want 200 with %s", a.code, sum(a.body), s.layer)
	}
	st := s.wait(t, "the pull's end", func(st *pull.Status) bool { return st.State == pull.StateDone })
	if st.Shared < int64(len(a.body)) {
		t.Errorf("shared %d bytes, want at least the %d sent", st.Shared, len(a.body))
	}
	if code, _, _ := s.get(t, "/v2/quay.io/my/app/blobs/"+s.layer, false); code != http.StatusServiceUnavailable {
		t.Errorf("a blob after the pull's end: %d, want 503 (no pull under way)", code)
	}
}

// A node following the pull makes the same bundle from it, byte for
// byte, while the pull still runs, and never asks the registry.
func TestFollow_MakesTheSameBundleWhileThePullRuns(t *testing.T) {
	s := newSharing(t, time.Minute)
	s.start(t)
	client := peer.NewClient(shareToken, nil)
	f := newHarness(t, s.reg, pull.Options{Backoff: 300 * time.Millisecond,
		Peers: &pull.PeerAccess{Transport: client.Transport()},
		Mirrors: func() ([]create.Mirror, error) {
			return []create.Mirror{{Prefix: "quay.io/", Location: "127.0.0.1:1/"}}, nil
		}})
	f.run(t)
	follow := s.req
	follow.From, follow.FromNode = strings.TrimPrefix(s.srv.URL, "http://"), "node-a"
	if err := f.p.Ensure(follow); err != nil {
		t.Fatal(err)
	}
	// Served while the pull holds a blob at its half: not yet done.
	s.followed(t, f)
	if st := s.p.Status(); st.State != pull.StateFetching || st.Shared == 0 {
		t.Fatalf("the pull is %s having served %d bytes, want still fetching, having served", st.State, st.Shared)
	}
	fs := s.bothDone(t, f)
	if fs.From != "node-a" || !strings.Contains(fs.Line(), "node node-a") {
		t.Errorf("the follower's status does not name the node it follows: %+v / %q", fs, fs.Line())
	}
}

// A node following a pull that is not under way (the pulling node not
// started yet, or restarting) keeps asking, never failing for good, and
// makes the bundle once the pull runs.
func TestFollow_KeepsAskingUntilThePullRuns(t *testing.T) {
	s := newSharing(t, time.Minute)
	f := newHarness(t, s.reg, pull.Options{Backoff: 300 * time.Millisecond,
		Peers: &pull.PeerAccess{Transport: peer.NewClient(shareToken, nil).Transport()}})
	f.run(t)
	follow := s.req
	follow.From, follow.FromNode = strings.TrimPrefix(s.srv.URL, "http://"), "node-a"
	if err := f.p.Ensure(follow); err != nil {
		t.Fatal(err)
	}
	f.wait(t, "the follower's second failed try", func(st *pull.Status) bool { return st.State == pull.StateRetrying && st.Attempts >= 2 })
	s.start(t)
	s.followed(t, f)
	s.bothDone(t, f)
}

// nodeTLS is a node's peer TLS with node identities (peer.identity =
// "node"): its kubelet certificates from ca, serving for 127.0.0.1, and
// trust in ca.
func nodeTLS(t *testing.T, ca *testca.CA, node string) *peer.NodeTLS {
	t.Helper()
	sc, sk := ca.Serving(t, node, "127.0.0.1")
	cc, ck := ca.Node(t, node)
	serving, client := testca.KeyPair(t, sc, sk), testca.KeyPair(t, cc, ck)
	pool := testca.Pool(ca)
	return &peer.NodeTLS{
		Serving: func() *tls.Certificate { return &serving }, Client: func() *tls.Certificate { return &client },
		ClientCAs: func() *x509.CertPool { return pool }, ServingCAs: func() *x509.CertPool { return pool },
	}
}

// asked is what a peer server's pull handler was asked, by the node
// each request's certificate names.
type asked struct {
	mu    sync.Mutex
	paths map[string][]string
}

func (a *asked) by(node string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.paths[node])
}

func (a *asked) all() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, p := range a.paths {
		n += len(p)
	}
	return n
}

// serveTLS serves s's pull on a peer server with n's TLS, on 127.0.0.1
// (an address go-containerregistry takes for plain HTTP), as the agent
// does with peer.identity = "node"; its address and what it was asked.
func (s *sharing) serveTLS(t *testing.T, n *peer.NodeTLS) (string, *asked) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &asked{paths: map[string][]string{}}
	h := s.p.Handler()
	srv := peer.NewServer(nil, peer.ServerOptions{TLS: n.ServerConfig(), Closed: true,
		Pull: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			a.mu.Lock()
			a.paths[peer.PeerNode(r)] = append(a.paths[peer.PeerNode(r)], r.URL.Path)
			a.mu.Unlock()
			h.ServeHTTP(w, r)
		})})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String(), a
}

// On OpenShift the peers speak TLS with the kubelets' certificates: a
// node following the pull over it makes the same bundle, its manifests,
// blobs and release signatures all asked over TLS with its certificate.
func TestFollow_OverTLSWithNodeIdentities(t *testing.T) {
	s := newSharing(t, time.Minute)
	ca := testca.New(t, "kube-csr-signer")
	addr, a := s.serveTLS(t, nodeTLS(t, ca, "node-a"))
	// As for a node's 10.x or 192.168.x address: what the follower's
	// create.Run asks is built on "http", and only the scheme the ping
	// found (https) makes it reach the peer.
	if reg, err := name.NewRegistry(addr); err != nil || reg.Scheme() != "http" {
		t.Fatalf("go-containerregistry takes %s for %v (%v), want http: this test no longer covers the scheme it guards", addr, reg.Scheme(), err)
	}
	s.start(t)
	f := s.followOverTLS(t, addr, nodeTLS(t, ca, "node-b"))
	s.followed(t, f)
	s.bothDone(t, f)
	f.mu.Lock()
	res := f.delivered[len(f.delivered)-1]
	f.mu.Unlock()
	if got := res.Metadata.ReleaseSignatures; len(got) != len(s.sigs) || string(got[0]) != string(s.sigs[0]) || string(got[1]) != string(s.sigs[1]) {
		t.Errorf("the follower's bundle carries signatures %q, want %q", got, s.sigs)
	}
	count := map[string]int{}
	for _, p := range a.by("node-b") {
		for _, kind := range []string{"/manifests/", "/blobs/", pull.SignaturePath + "/"} {
			if strings.Contains(p, kind) {
				count[kind]++
			}
		}
	}
	if count["/manifests/"] == 0 || count["/blobs/"] == 0 || count[pull.SignaturePath+"/"] < len(s.sigs) {
		t.Errorf("asked over TLS by node-b: %v, want manifests, blobs and the signatures", count)
	}
	if n := a.all() - len(a.by("node-b")); n != 0 {
		t.Errorf("%d requests came without node-b's certificate", n)
	}
}

// A node without a client certificate, or with one from another CA,
// gets nothing of the pull over TLS: it keeps asking, and the pull's
// handler is never reached.
func TestFollow_OverTLSRefusesWhoIsNotANode(t *testing.T) {
	ca, other := testca.New(t, "kube-csr-signer"), testca.New(t, "someone-else")
	for name, client := range map[string]func() *peer.NodeTLS{
		"no certificate": func() *peer.NodeTLS {
			n := nodeTLS(t, ca, "node-b")
			n.Client = func() *tls.Certificate { return nil }
			return n
		},
		"a node's from another CA": func() *peer.NodeTLS {
			n := nodeTLS(t, ca, "node-b")
			cert, key := other.Node(t, "node-b")
			kp := testca.KeyPair(t, cert, key)
			n.Client = func() *tls.Certificate { return &kp }
			return n
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := newSharing(t, time.Minute)
			addr, a := s.serveTLS(t, nodeTLS(t, ca, "node-a"))
			s.start(t)
			f := s.followOverTLS(t, addr, client())
			fs := f.wait(t, "the follower's second failed try", func(st *pull.Status) bool { return st.State == pull.StateRetrying && st.Attempts >= 2 })
			if fs.Bytes != 0 || !strings.Contains(fs.Error, "node-a") {
				t.Errorf("refused follower: %d bytes, error %q (want none, naming the node)", fs.Bytes, fs.Error)
			}
			if n, st := a.all(), s.p.Status(); n != 0 || st.Shared != 0 {
				t.Errorf("the pull's handler was asked %d times, sent %d bytes; want none", n, st.Shared)
			}
		})
	}
}

// followOverTLS starts a follower of the pull served at addr (node-a),
// over the peers' TLS as n, whose site registry cannot be reached.
func (s *sharing) followOverTLS(t *testing.T, addr string, n *peer.NodeTLS) *harness {
	t.Helper()
	c := peer.NewNodeClient(n)
	f := newHarness(t, s.reg, pull.Options{Backoff: 300 * time.Millisecond,
		Peers: &pull.PeerAccess{Transport: c.Transport(), TLS: c.TLS()},
		Mirrors: func() ([]create.Mirror, error) {
			return []create.Mirror{{Prefix: "quay.io/", Location: "127.0.0.1:1/"}}, nil
		}})
	f.run(t)
	follow := s.req
	follow.From, follow.FromNode = addr, "node-a"
	if err := f.p.Ensure(follow); err != nil {
		t.Fatal(err)
	}
	return f
}

// bothDone lets the held pull go on, waits until it and follower f are
// done, and checks that they made the same bundle; f's last status.
func (s *sharing) bothDone(t *testing.T, f *harness) *pull.Status {
	t.Helper()
	s.gate.release()
	ps := s.wait(t, "the pull's end", func(st *pull.Status) bool { return st.State == pull.StateDone })
	fs := f.wait(t, "the follower's end", func(st *pull.Status) bool { return st.State == pull.StateDone })
	if fs.Digest != ps.Digest || fs.Digest == "" {
		t.Errorf("the follower made %s, the puller %s: want the same bundle", fs.Digest, ps.Digest)
	}
	return fs
}

// A follower that reads 1 KiB of a blob and stops holds neither the pull
// nor the others (issue 41): the pull is delivered while its response
// still hangs, another follower makes the same bundle, and the stalled
// response is cut once it has sent nothing for ShareStall, after which
// the pull's tree goes.
func TestShare_AFollowerThatStopsReadingHoldsNothing(t *testing.T) {
	// The held blob is larger than what the sockets' buffers take in.
	s := newSharingOf(t, 8<<20, pull.Options{ShareWait: time.Minute, ShareStall: time.Second})
	s.start(t)
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.DialContext(t.Context(), "tcp", s.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /v2/quay.io/any/blobs/%s HTTP/1.1\r\nHost: peer\r\nAuthorization: Bearer %s\r\n\r\n", s.layer, shareToken)
	client := peer.NewClient(shareToken, nil)
	f := newHarness(t, s.reg, pull.Options{Backoff: 300 * time.Millisecond, Peers: &pull.PeerAccess{Transport: client.Transport()}})
	f.run(t)
	follow := s.req
	follow.From, follow.FromNode = strings.TrimPrefix(s.srv.URL, "http://"), "node-a"
	if err := f.p.Ensure(follow); err != nil {
		t.Fatal(err)
	}
	s.followed(t, f)
	waitUntil(t, "the stalled request to wait for the held blob too", func() bool { return s.p.Status().Waiting >= 2 })
	s.gate.release()
	head := make([]byte, 1024)
	if _, err := io.ReadFull(conn, head); err != nil || !strings.HasPrefix(string(head), "HTTP/1.1 200") {
		t.Fatalf("the stalled follower's first KiB: %q, %v", head, err)
	}
	// It reads no more: the pull is delivered all the same.
	s.bothDone(t, f)
	waitUntil(t, "the pull's tree to go once the stalled response is cut", func() bool {
		_, err := os.Stat(filepath.Join(s.dir, "work"))
		return os.IsNotExist(err)
	})
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, conn)
	if n+int64(len(head)) >= s.size {
		t.Fatalf("the stalled follower got %d bytes of a %d-byte blob (%v): its response was not cut", n+int64(len(head)), s.size, err)
	}
}

// A followed node that sends 1 KiB of a blob and then nothing (it, or
// the link to it, stalled) holds the follower only for FollowStall: the
// follower drops the response, asks for the rest, and makes the same
// bundle as the pull.
func TestFollow_AFollowedNodeThatStopsSendingIsAskedAgain(t *testing.T) {
	s := newSharing(t, time.Minute)
	s.start(t)
	inner := peer.NewServer(nil, peer.ServerOptions{Token: shareToken, Pull: s.p.Handler()})
	var claimed atomic.Bool
	gone := make(chan struct{}) // the stalled response's client hung up
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A large blob other than the held one: the pull still runs when
		// the follower asks again.
		if strings.Contains(r.URL.Path, "/blobs/") && !strings.HasSuffix(r.URL.Path, s.layer) && r.Header.Get("Range") == "" {
			w = &stallingWriter{ResponseWriter: w, claim: &claimed, client: r.Context().Done(), gone: gone}
		}
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	f := newHarness(t, s.reg, pull.Options{Backoff: 300 * time.Millisecond, FollowStall: 500 * time.Millisecond,
		Peers: &pull.PeerAccess{Transport: peer.NewClient(shareToken, nil).Transport()}})
	f.run(t)
	follow := s.req
	follow.From, follow.FromNode = strings.TrimPrefix(srv.URL, "http://"), "node-a"
	if err := f.p.Ensure(follow); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone:
	case <-time.After(time.Minute):
		t.Fatal("the follower never dropped the stalled response")
	}
	s.followed(t, f)
	s.bothDone(t, f)
}

// stallingWriter, on the first response of 64 KiB or more to claim it,
// sends 1 KiB, then blocks every write until the client hangs up.
type stallingWriter struct {
	http.ResponseWriter
	claim    *atomic.Bool
	stalling bool
	sent     int
	client   <-chan struct{}
	gone     chan struct{}
}

func (w *stallingWriter) Write(b []byte) (int, error) {
	if w.sent == 0 && !w.stalling {
		size, _ := strconv.Atoi(w.Header().Get("Content-Length"))
		w.stalling = size >= 64<<10 && w.claim.CompareAndSwap(false, true)
	}
	if !w.stalling {
		return w.ResponseWriter.Write(b)
	}
	if w.sent < 1024 {
		// The rest of b is taken and never sent: the server goes on as
		// with a client that reads slower than it writes.
		n, err := w.ResponseWriter.Write(b[:min(len(b), 1024-w.sent)])
		w.sent += n
		if err == nil && w.sent == 1024 {
			err = http.NewResponseController(w.ResponseWriter).Flush()
		}
		if err != nil {
			return n, err
		}
		return len(b), nil
	}
	<-w.client
	close(w.gone)
	return 0, errors.New("the client hung up")
}

func (w *stallingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
