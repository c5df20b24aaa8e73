package packaging

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ferry-edge/ferry/internal/testca"
	"github.com/ferry-edge/ferry/peer"
)

// offeringPeer is a peer that offers a ferry build; fetched counts the
// requests for its bytes.
type offeringPeer struct {
	addr    string
	fetched atomic.Int32
}

// cluster is the cluster's kubelet CA, which signs every node's serving
// and client certificates (the peers take what chains to it), and the
// joining node's kubelet kubeconfig naming its client certificate.
type cluster struct {
	ca      *testca.CA
	kubelet string
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	ca := testca.New(t, "kube-csr-signer")
	dir := t.TempDir()
	cert, key := ca.Node(t, "joining")
	pem := testca.WriteCurrent(t, dir, "kubelet-client", cert, key)
	kubeconfig := filepath.Join(dir, "kubeconfig")
	// As the kubelet writes it: one file holds its certificate and key.
	body := fmt.Sprintf("apiVersion: v1\nkind: Config\nusers:\n- name: default-auth\n  user:\n    client-certificate: %s\n    client-key: %s\n", pem, pem)
	if err := os.WriteFile(kubeconfig, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return &cluster{ca: ca, kubelet: kubeconfig}
}

// serve starts node name's real peer server (peer.Server, node
// identities) offering build, a fake ferry's bytes, as the agent running
// that build offers itself.
func (c *cluster) serve(t *testing.T, name, build, version string) *offeringPeer {
	t.Helper()
	exe := filepath.Join(t.TempDir(), "ferry")
	if err := os.WriteFile(exe, []byte(build), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := peer.OpenBuild(exe, version)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	sc, sk := c.ca.Serving(t, name, "127.0.0.1")
	cc, ck := c.ca.Node(t, name)
	serving, client := testca.KeyPair(t, sc, sk), testca.KeyPair(t, cc, ck)
	pool := testca.Pool(c.ca)
	nt := &peer.NodeTLS{Serving: func() *tls.Certificate { return &serving }, Client: func() *tls.Certificate { return &client },
		ClientCAs: func() *x509.CertPool { return pool }, ServingCAs: func() *x509.CertPool { return pool }}
	srv := peer.NewServer(peer.NewShelf(peer.ShelfOptions{}), peer.ServerOptions{TLS: nt.ServerConfig(), Closed: true, Build: b})
	p := &offeringPeer{}
	p.addr = c.listen(t, nt.ServerConfig(), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/ferry/") {
			p.fetched.Add(1)
		}
		srv.ServeHTTP(w, r)
	}))
	return p
}

// liar offers build (its digest, size and version) but sends other
// bytes: a compromised node, or a disk that flipped a bit.
func (c *cluster) liar(t *testing.T, build, version, sends string) *offeringPeer {
	t.Helper()
	sc, sk := c.ca.Serving(t, "liar", "127.0.0.1")
	serving := testca.KeyPair(t, sc, sk)
	cfg := &tls.Config{Certificates: []tls.Certificate{serving}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: testca.Pool(c.ca)}
	offer, _ := json.Marshal(peer.BuildOffer{Arch: peer.UnameArch(runtime.GOARCH), SHA256: sha(build), Size: int64(len(build)), Version: version})
	p := &offeringPeer{}
	p.addr = c.listen(t, cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/ferry" {
			w.Write(offer)
			return
		}
		p.fetched.Add(1)
		w.Write([]byte(sends))
	}))
	return p
}

// listen serves h over TLS on 127.0.0.1 until the test ends.
func (c *cluster) listen(t *testing.T, cfg *tls.Config, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: h}
	go hs.Serve(tls.NewListener(ln, cfg))
	t.Cleanup(func() { hs.Shutdown(context.Background()) })
	return ln.Addr().String()
}

// config is the node's /etc/ferry/config.toml naming peers, as ferry's
// MachineConfig ships it (node identities, the kubelet's kubeconfig).
func (c *cluster) config(peers ...*offeringPeer) string {
	var q []string
	for _, p := range peers {
		q = append(q, fmt.Sprintf("%q", p.addr))
	}
	return fmt.Sprintf(`approved_digests = []

[peer]
listen = ":8090"
# every node
peers = [
  %s,
]
identity = "node"

[cluster]
kubeconfig = %q
`, strings.Join(q, ",\n  "), c.kubelet)
}

// TestInstaller_FromPeers runs ferry-install --peers, as its timer does on
// a node, against real peer servers with node identities: the newest
// build a peer runs that this node's own trust list names is fetched,
// checked and installed as a stick's would be; a build the list lacks is
// refused by its digest, with the peer named, and never fetched, whatever
// version it claims; bytes that do not match the digest offered are
// refused and another peer is asked; an offer no newer than the
// installed build is not fetched.
func TestInstaller_FromPeers(t *testing.T) {
	c := newCluster(t)
	v140, v150, v1100 := fakeFerry("v1.4.0"), fakeFerry("v1.5.0"), fakeFerry("v1.10.0")
	rogue := fakeFerry("v99.0.0") // no one's list has it
	trust := "# trusted builds\n" + sha(v140) + "  ferry-x86_64 v1.4.0\n" + sha(v150) + "  ferry-x86_64 v1.5.0\n" + sha(v1100) + "  ferry-x86_64 v1.10.0\n"
	etc := func(peers ...*offeringPeer) map[string]string {
		return map[string]string{"trusted-binaries.sha256": trust, "config.toml": c.config(peers...)}
	}

	t.Run("a node with no ferry takes the newest trusted build", func(t *testing.T) {
		old, newer := c.serve(t, "node1", v140, "v1.4.0"), c.serve(t, "node2", v1100, "v1.10.0")
		res := installerRun{peers: true, etcFerry: etc(old, newer)}.run(t)
		t.Logf("journal:\n%s", res.journal)
		if res.rc != 0 || res.installed != v1100 || !strings.Contains(res.journal, "installed ferry (sha256 "+sha(v1100)+") from peer "+newer.addr) {
			t.Errorf("rc %d, installed %q: want v1.10.0 from %s", res.rc, res.installed, newer.addr)
		}
		if !strings.Contains(res.log, "restart ferry.service") {
			t.Errorf("ferry.service not restarted:\n%s", res.log)
		}
		if old.fetched.Load() != 0 || newer.fetched.Load() != 1 {
			t.Errorf("fetched %d times from the older peer, %d from the newer: want 0 and 1", old.fetched.Load(), newer.fetched.Load())
		}
		if res.leftovers != "" {
			t.Errorf("/usr/local/bin holds %q besides ferry", res.leftovers)
		}
	})

	t.Run("a build the trust list lacks is never fetched", func(t *testing.T) {
		bad, good := c.serve(t, "node1", rogue, "v99.0.0"), c.serve(t, "node2", v150, "v1.5.0")
		res := installerRun{peers: true, etcFerry: etc(bad, good), installed: v140}.run(t)
		t.Logf("journal:\n%s", res.journal)
		want := "refused ferry (sha256 " + sha(rogue) + ", version 99.0.0) offered by peer " + bad.addr + ": its sha256 is not in /etc/ferry/trusted-binaries.sha256"
		if !strings.Contains(res.journal, want) || !strings.Contains(res.journal, "<3>") {
			t.Errorf("journal lacks the refusal at priority err: %q", want)
		}
		if bad.fetched.Load() != 0 {
			t.Errorf("the untrusted build was fetched %d times", bad.fetched.Load())
		}
		// The trusted one still comes; the run fails so that systemctl
		// --failed shows the refusal.
		if res.installed != v150 || res.rc != 1 {
			t.Errorf("rc %d, installed %q: want v1.5.0 installed and exit 1", res.rc, res.installed)
		}
	})

	t.Run("bytes that are not the offered build", func(t *testing.T) {
		liar := c.liar(t, v150, "v1.5.0", rogue)
		honest := c.serve(t, "node2", v150, "v1.5.0")
		res := installerRun{peers: true, etcFerry: etc(liar, honest), installed: v140}.run(t)
		t.Logf("journal:\n%s", res.journal)
		if !strings.Contains(res.journal, "refused what peer "+liar.addr+" sent for ferry sha256 "+sha(v150)+": its sha256 is "+sha(rogue)) {
			t.Error("journal lacks the refusal of the liar's bytes")
		}
		if res.installed != v150 || honest.fetched.Load() != 1 || res.leftovers != "" {
			t.Errorf("installed %q, fetched from the honest peer %d times, leftovers %q: want v1.5.0 from it, nothing left over", res.installed, honest.fetched.Load(), res.leftovers)
		}
		alone := installerRun{peers: true, etcFerry: etc(liar), installed: v140}.run(t)
		if alone.installed != v140 || alone.rc == 0 || alone.leftovers != "" || strings.Contains(alone.log, "restart") {
			t.Errorf("the liar alone: rc %d, installed %q, leftovers %q, %s: want nothing changed, exit 1", alone.rc, alone.installed, alone.leftovers, alone.log)
		}
	})

	t.Run("nothing newer than the installed build", func(t *testing.T) {
		older, same := c.serve(t, "node1", v140, "v1.4.0"), c.serve(t, "node2", v150, "v1.5.0")
		res := installerRun{peers: true, etcFerry: etc(older, same), installed: v150}.run(t)
		t.Logf("journal:\n%s", res.journal)
		if res.rc != 0 || res.installed != v150 || older.fetched.Load()+same.fetched.Load() != 0 || strings.Contains(res.log, "restart") {
			t.Errorf("rc %d, installed %q, fetched %d+%d, %s: want nothing fetched or changed", res.rc, res.installed, older.fetched.Load(), same.fetched.Load(), res.log)
		}
	})

	t.Run("a development build, a commit and no version, only to a node without one", func(t *testing.T) {
		// A commit that starts with a letter sorts after any release: taken
		// as a version, it would be fetched and refused at every check.
		dev := fakeFerry("abcdef012345-dirty")
		e := etc()
		e["trusted-binaries.sha256"] += sha(dev) + "  ferry-x86_64 a development build\n"
		p := c.serve(t, "node1", dev, "abcdef012345-dirty")
		e["config.toml"] = c.config(p)
		res := installerRun{peers: true, etcFerry: e, installed: v150}.run(t)
		t.Logf("journal:\n%s", res.journal)
		if res.rc != 0 || res.installed != v150 || p.fetched.Load() != 0 || strings.Contains(res.log, "restart") {
			t.Errorf("rc %d, installed %q, fetched %d, %s: want v1.5.0 kept, nothing fetched", res.rc, res.installed, p.fetched.Load(), res.log)
		}
		bare := installerRun{peers: true, etcFerry: e}.run(t)
		if bare.rc != 0 || bare.installed != dev || p.fetched.Load() != 1 {
			t.Errorf("a node with no ferry: rc %d, installed %q, fetched %d: want the development build", bare.rc, bare.installed, p.fetched.Load())
		}
	})

	t.Run("a peer that lies about its version gains nothing", func(t *testing.T) {
		// v1.4.0's bytes offered as v2.0.0: fetched, then refused by the
		// copy's own version, as a stick's would be.
		liar := c.serve(t, "node1", v140, "v2.0.0")
		res := installerRun{peers: true, etcFerry: etc(liar), installed: v150}.run(t)
		t.Logf("journal:\n%s", res.journal)
		if res.installed != v150 || res.rc != 1 || !strings.Contains(res.journal, "version 1.4.0 is older than the installed 1.5.0") {
			t.Errorf("rc %d, installed %q: want v1.5.0 kept and the refusal said", res.rc, res.installed)
		}
	})

	t.Run("no node certificate in the kubeconfig", func(t *testing.T) {
		p := c.serve(t, "node1", v150, "v1.5.0")
		e := etc(p)
		e["config.toml"] = strings.Replace(e["config.toml"], c.kubelet, "/etc/ferry/trusted-binaries.sha256", 1)
		res := installerRun{peers: true, etcFerry: e}.run(t)
		if res.rc != 1 || res.installed != "" || !strings.Contains(res.journal, "names no client-certificate and client-key files") {
			t.Errorf("rc %d, installed %q, journal %q: want a refusal naming what to fix", res.rc, res.installed, res.journal)
		}
	})
}
