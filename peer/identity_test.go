package peer

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/ferry-edge/ferry/internal/testca"
)

// nodeTLS is a node's NodeTLS: its kubelet certificates from ca, and
// trust in the CAs given.
func nodeTLS(t *testing.T, ca *testca.CA, name string, trust ...*testca.CA) *NodeTLS {
	sc, sk := ca.Serving(t, name, "127.0.0.1")
	cc, ck := ca.Node(t, name)
	serving, client := testca.KeyPair(t, sc, sk), testca.KeyPair(t, cc, ck)
	pool := testca.Pool(trust...)
	return &NodeTLS{
		Serving: func() *tls.Certificate { return &serving }, Client: func() *tls.Certificate { return &client },
		ClientCAs: func() *x509.CertPool { return pool }, ServingCAs: func() *x509.CertPool { return pool },
	}
}

// serveTLS starts a peer server with n's TLS on 127.0.0.1, its status
// naming the node its serving certificate names; its address.
func serveTLS(t *testing.T, n *NodeTLS) string {
	t.Helper()
	self := "server"
	if leaf, err := x509.ParseCertificate(n.Serving().Certificate[0]); err == nil {
		self = cmp.Or(strings.TrimPrefix(leaf.Subject.CommonName, "system:node:"), self)
	}
	return serveTLSAs(t, n, self)
}

// serveTLSAs is serveTLS with a status that names self.
func serveTLSAs(t *testing.T, n *NodeTLS, self string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	srv := NewServer(NewShelf(ShelfOptions{}), ServerOptions{TLS: n.ServerConfig(), Closed: true,
		Status: func() Status { return Status{Node: self} }})
	go func() { defer close(done); srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

// TestNodeTLS_TwoNodesAuthenticateEachOther: node a's server and node b's
// client (and the other way round) take each other's kubelet
// certificates, from the cluster's CA, for a node's.
func TestNodeTLS_TwoNodesAuthenticateEachOther(t *testing.T) {
	ca := testca.New(t, "kube-csr-signer")
	a, b := nodeTLS(t, ca, "a", ca), nodeTLS(t, ca, "b", ca)
	for _, pair := range [][2]*NodeTLS{{a, b}, {b, a}} {
		addr := serveTLS(t, pair[0])
		c := NewNodeClient(pair[1])
		if _, err := c.Offers(t.Context(), addr); err != nil {
			t.Fatalf("a node's client to a node's server: %v", err)
		}
		if st := c.status(t.Context(), addr); st.Err != nil || st.Node != st.Verified || st.Verified == "" {
			t.Fatalf("status: %+v", st)
		}
	}
}

// TestNodeTLS_RefusesANodeTheClusterNoLongerKnows: a deleted Node's
// kubelet certificates still chain to the cluster's CA; with Known, a
// server refuses such a client and a client such a server, and both
// take the node again once it is known.
func TestNodeTLS_RefusesANodeTheClusterNoLongerKnows(t *testing.T) {
	ca := testca.New(t, "kube-csr-signer")
	var gone sync.Map // node name → deleted
	known := func(node string) bool { _, deleted := gone.Load(node); return !deleted }
	a, b := nodeTLS(t, ca, "a", ca), nodeTLS(t, ca, "b", ca)
	a.Known, b.Known = known, known
	addrA, addrB := serveTLS(t, a), serveTLS(t, b)
	gone.Store("b", true)
	// Fresh clients: a kept connection would skip the handshake.
	if _, err := NewNodeClient(b).Offers(t.Context(), addrA); err == nil {
		t.Fatalf("a deleted node's client served: %v", err)
	}
	if _, err := NewNodeClient(a).Offers(t.Context(), addrB); err == nil || !strings.Contains(err.Error(), "node b has no record in the cluster") {
		t.Fatalf("a deleted node's server taken: %v", err)
	}
	gone.Delete("b")
	if _, err := NewNodeClient(b).Offers(t.Context(), addrA); err != nil {
		t.Fatalf("a known node's client refused: %v", err)
	}
	if _, err := NewNodeClient(a).Offers(t.Context(), addrB); err != nil {
		t.Fatalf("a known node's server refused: %v", err)
	}
}

// TestNodeTLS_RefusesAClientThatIsNotANode: no certificate, one from
// another CA, one from the cluster's CA that names no node, or plain
// HTTP: each is refused before a request is served.
func TestNodeTLS_RefusesAClientThatIsNotANode(t *testing.T) {
	ca, other := testca.New(t, "kube-csr-signer"), testca.New(t, "someone-else")
	addr := serveTLS(t, nodeTLS(t, ca, "a", ca))
	withCert := func(c testca.Cert, from *testca.CA) *Client {
		n := nodeTLS(t, ca, "b", ca)
		cert, key := from.Issue(t, c)
		kp := testca.KeyPair(t, cert, key)
		n.Client = func() *tls.Certificate { return &kp }
		return NewNodeClient(n)
	}
	none := nodeTLS(t, ca, "b", ca)
	none.Client = func() *tls.Certificate { return nil }
	node := testca.Cert{CN: "system:node:b", O: []string{"system:nodes"}, Client: true}
	for name, c := range map[string]*Client{
		"no certificate":                 NewNodeClient(none),
		"a node's from another CA":       withCert(node, other),
		"a user's from the cluster's CA": withCert(testca.Cert{CN: "admin", O: []string{"system:masters"}, Client: true}, ca),
		"a node name without the group":  withCert(testca.Cert{CN: "system:node:b", Client: true}, ca),
		"a serving certificate":          withCert(testca.Cert{CN: "system:node:b", O: []string{"system:nodes"}, Server: true}, ca),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := c.Offers(t.Context(), addr); err == nil {
				t.Fatal("served")
			}
		})
	}
	t.Run("plain HTTP with the right token", func(t *testing.T) {
		if _, err := NewClient("sekrit", nil).Offers(t.Context(), addr); err == nil {
			t.Fatal("served")
		}
	})
	t.Run("TLS without a certificate, at the HTTP level", func(t *testing.T) {
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		resp, err := hc.Get("https://" + addr + "/v1/bundles")
		if err == nil {
			resp.Body.Close()
			t.Fatalf("answered %d", resp.StatusCode)
		}
	})
}

// TestNodeTLS_RefusesAServerThatIsNotTheNodeAsked: a client checks that
// the peer's serving certificate is from the cluster's serving CA, names
// the address it asked, and names a node.
func TestNodeTLS_RefusesAServerThatIsNotTheNodeAsked(t *testing.T) {
	ca, other := testca.New(t, "kube-csr-signer"), testca.New(t, "someone-else")
	client := NewNodeClient(nodeTLS(t, ca, "b", ca))
	serving := func(from *testca.CA, c testca.Cert) string {
		n := nodeTLS(t, ca, "a", ca)
		cert, key := from.Issue(t, c)
		kp := testca.KeyPair(t, cert, key)
		n.Serving = func() *tls.Certificate { return &kp }
		return serveTLS(t, n)
	}
	for name, addr := range map[string]string{
		"from another CA":      serving(other, testca.Cert{CN: "system:node:a", O: []string{"system:nodes"}, Hosts: []string{"127.0.0.1"}, Server: true}),
		"for another address":  serving(ca, testca.Cert{CN: "system:node:a", O: []string{"system:nodes"}, Hosts: []string{"10.9.9.9"}, Server: true}),
		"naming no node":       serving(ca, testca.Cert{CN: "evil", Hosts: []string{"127.0.0.1"}, Server: true}),
		"a client certificate": serving(ca, testca.Cert{CN: "system:node:a", O: []string{"system:nodes"}, Hosts: []string{"127.0.0.1"}, Client: true}),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := client.Offers(t.Context(), addr)
			if err == nil {
				t.Fatal("the client took it")
			}
			if !errors.Is(err, ErrNotAPeer) && !strings.Contains(err.Error(), "certificate") {
				t.Errorf("err %v does not say why", err)
			}
		})
	}
}

// TestNodeTLS_AStatusNamesTheNodeOfItsCertificate (issue 41): a peer with
// a valid certificate for node-x whose status says it is node-a is
// refused (nothing acts on it: the gate, the puller's address); one
// whose status names its own node is taken, Verified by its certificate.
func TestNodeTLS_AStatusNamesTheNodeOfItsCertificate(t *testing.T) {
	ca := testca.New(t, "kube-csr-signer")
	f := NewFetcher(FetcherOptions{Client: NewNodeClient(nodeTLS(t, ca, "node-b", ca))})
	liar := serveTLSAs(t, nodeTLS(t, ca, "node-x", ca), "node-a")
	honest := serveTLS(t, nodeTLS(t, ca, "node-a", ca))
	f.SetPeers([]string{liar, honest})
	st := f.Statuses(t.Context())
	if err := st[liar].Err; !errors.Is(err, ErrNodeMismatch) || !strings.Contains(err.Error(), "node-x") || st[liar].Node != "" {
		t.Errorf("node-x saying it is node-a: %+v, want refused naming node-x, its word dropped", st[liar])
	}
	if s := st[honest]; s.Err != nil || s.Node != "node-a" || s.Verified != "node-a" {
		t.Errorf("node-a: %+v", s)
	}
}
