package netns

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/internal/testca"
	"github.com/ferry-edge/ferry/pull"
	"github.com/ferry-edge/ferry/test/fixture"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// TestAgents_RegistryModeAStalledFollowerHoldsNoPull (issue 41): three
// agents in registry mode; the third reaches the pulling node through a
// stalling link (stallLink), which passes 1 KiB of the first large blob
// the pull serves it and then neither reads the puller's response nor
// sends the follower a byte more. The pull is delivered all the same:
// the puller loads its bundle and the second node loads it too while
// that response stands unread; the stalled node loads it within 2
// minutes of the last byte crossing the site's link, on the same digest
// (the puller's bundle from the peers, or its own pull resumed once it
// cuts the silent response: whichever comes first).
func TestAgents_RegistryModeAStalledFollowerHoldsNoPull(t *testing.T) {
	e := kubeenv.Start(t, runningRelease)
	e.InstallFerry()
	e.InstallUpgradeBundles(repoFile("packaging/upgradebundle-crd.yaml"))
	reg := fixture.NewRegistry(t)
	reg.PushImage(t, "my-company/my-workload", "v1")
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{Version: "4.13.8", PayloadImages: 6, ImageSize: 1 << 20, Seed: 42})
	link := fixture.NewLink(t, reg, fixture.LinkOptions{Rate: 4 << 20})
	_, servingCA := nodeIdentities(t, e)

	// The lab names its nodes node0, node1, node2: node0 pulls, node2
	// reaches it through the stalling link.
	const puller, stalled = "node0", "node2"
	sl := newStallLink(t, e, servingCA, puller, stalled)
	toStall := forwardPort(t, sl.port)
	f := registryFleet(t, e, link, 3, func(n *Node, cfg *agent.Config) {
		switch n.Name {
		case puller:
			sl.reach(n)
		case stalled:
			toStall(n)
			for i, p := range cfg.Peer.Peers {
				if p == sl.upstream {
					cfg.Peer.Peers[i] = sl.addr()
				}
			}
		}
	})
	first, second, third := f.nodes[0], f.nodes[1], f.nodes[2]
	if first.Name != puller || third.Name != stalled || sl.upstream != first.Addr(peerPort) {
		t.Fatalf("the lab's nodes are %s, %s, %s: the stalling link is not where the test puts it", first.Name, second.Name, third.Name)
	}

	// A node takes a peer's certificate only once it has read that
	// peer's record: until then the first asks fail and are tried again
	// a little later. The pull starts once the stalled node and the
	// puller know each other, so that the stalled node follows it from
	// its start rather than taking the whole bundle from the second node.
	select {
	case <-sl.answered:
	case <-time.After(agentBound):
		t.Fatalf("%s never answered %s through the stalling link", puller, stalled)
	}

	name := "4.13.8-x86-64"
	e.PatchBundleSpec(name, map[string]any{"source": map[string]any{"release": release, "node": puller,
		"extraImages": []string{"quay.io/my-company/my-workload:v1"}}})
	select {
	case <-sl.stalled:
	case <-time.After(agentBound):
		t.Fatalf("%s asked %s for no large blob through the stalling link", stalled, puller)
	}
	t.Logf("%s read 1 KiB of a blob from %s and stopped", stalled, puller)

	// Delivered while that response stands unread: the puller loads its
	// bundle, the second node loads it too.
	loaded := func(s agent.Status) bool {
		return s.Phase == string(agent.PhaseLoaded) || s.Phase == string(agent.PhaseClusterReady) || s.Phase == string(agent.PhaseUpgrading)
	}
	ps := first.A.Wait(agentBound, puller+"'s pull delivered and loaded", func(s agent.Status) bool {
		return s.Pull != nil && s.Pull.State == pull.StateDone && loaded(s)
	})
	ss := second.A.Wait(agentBound, second.Name+" loaded", loaded)
	if !sl.holding() {
		t.Fatal("the stalled response was let go before the pull was delivered: the test shows nothing")
	}
	if ss.Digest != ps.Digest || ps.Digest == "" {
		t.Fatalf("%s holds %s, %s %s", second.Name, ss.Digest, puller, ps.Digest)
	}
	sl.letGo()

	last := link.LastByte()
	t.Logf("the last byte crossed the site's link %s before both were loaded", time.Since(last).Round(time.Millisecond))
	ts := third.A.Wait(time.Until(last.Add(2*time.Minute)), stalled+" loaded within 2 minutes of the last byte crossing the link", loaded)
	if ts.Digest != ps.Digest {
		t.Fatalf("%s holds %s, %s %s", stalled, ts.Digest, puller, ps.Digest)
	}
	t.Logf("%s loaded %s after the link's last byte; its pull: %s", stalled, time.Since(last).Round(time.Millisecond), pullText(ts.Pull))
}

// stallLink is the link between one node (the follower) and another
// (the pulling node), terminating each side's TLS as that node would:
// the follower sees the puller's certificate (issued for the link's
// address) and the puller the follower's. It passes every response
// whole except one: the first blob of 64 KiB or more asked without a
// Range, of which it passes 1 KiB and then reads no more of the
// puller's response until letGo, and sends the follower no byte more
// until it hangs up.
type stallLink struct {
	port     int
	upstream string        // the puller's peer address
	sock     string        // the unix socket socat in the puller's namespace answers
	stalled  chan struct{} // closed once the stalled response sent its 1 KiB
	answered chan struct{} // closed once the puller answered the follower
	answer   sync.Once
	release  chan struct{}
	claimed  atomic.Bool
	held     atomic.Bool
	// Toward the puller: the follower's client certificate.
	client tls.Certificate
	roots  *x509.CertPool
	up     *http.Transport
}

func newStallLink(t *testing.T, e *kubeenv.Env, servingCA *testca.CA, puller, follower string) *stallLink {
	t.Helper()
	dir, err := os.MkdirTemp("", "ferry-stall")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl := &stallLink{port: ln.Addr().(*net.TCPAddr).Port, sock: filepath.Join(dir, "peer.sock"),
		stalled: make(chan struct{}), answered: make(chan struct{}), release: make(chan struct{})}
	cert, key := servingCA.Serving(t, puller, "127.0.0.1")
	serving := testca.KeyPair(t, cert, key)
	ccert, ckey := e.ClientCA.Node(t, follower)
	sl.client, sl.roots = testca.KeyPair(t, ccert, ckey), testca.Pool(servingCA)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { sl.serve(t, w, r) }),
		ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{serving}, ClientAuth: tls.RequireAnyClientCert}))
	t.Cleanup(func() {
		sl.letGo()
		srv.Close()
		if sl.up != nil {
			sl.up.CloseIdleConnections()
		}
	})
	return sl
}

// reach starts, in the puller's namespace, what carries the link's
// connections to its peer port, and notes that address.
func (sl *stallLink) reach(n *Node) {
	sl.upstream = n.Addr(peerPort)
	sl.up = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sl.sock)
		},
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{sl.client}, RootCAs: sl.roots, ServerName: n.IP},
	}
	n.Start("stall-link", "socat", "UNIX-LISTEN:"+sl.sock+",fork", "TCP:"+sl.upstream)
}

// addr is the link's address in the follower's namespace.
func (sl *stallLink) addr() string { return "127.0.0.1:" + strconv.Itoa(sl.port) }

func (sl *stallLink) holding() bool { return sl.held.Load() }

func (sl *stallLink) letGo() {
	if sl.claimed.Load() && sl.held.CompareAndSwap(true, false) {
		close(sl.release)
	}
}

func (sl *stallLink) serve(t *testing.T, w http.ResponseWriter, r *http.Request) {
	out := r.Clone(r.Context())
	out.URL.Scheme, out.URL.Host, out.RequestURI, out.Host = "https", sl.upstream, "", ""
	resp, err := sl.up.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	if resp.StatusCode == http.StatusOK {
		sl.answer.Do(func() { close(sl.answered) })
	}
	stall := strings.Contains(r.URL.Path, "/blobs/") && r.Header.Get("Range") == "" &&
		resp.StatusCode == http.StatusOK && resp.ContentLength >= 64<<10 && sl.claimed.CompareAndSwap(false, true)
	if !stall {
		io.Copy(w, resp.Body)
		return
	}
	sl.held.Store(true)
	if _, err := io.CopyN(w, resp.Body, 1024); err != nil {
		t.Errorf("the stalling link's first KiB: %v", err)
	}
	http.NewResponseController(w).Flush()
	close(sl.stalled)
	<-sl.release
	// The puller's side let go, the follower's stays silent until the
	// follower hangs up: it must notice by itself.
	resp.Body.Close()
	<-r.Context().Done()
}
