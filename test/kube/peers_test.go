package kube

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/internal/testca"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/test/ferryenv"
	"github.com/ferry-edge/ferry/test/freeport"
	"github.com/ferry-edge/ferry/test/kubeenv"
)

// peerNode is one node's peer side with node identities, put together as
// ferry does with peer.identity = "node": its kubelet client certificate
// (from the API server's client CA), a kubelet serving certificate for
// 127.0.0.1, and the CA bundles read through the API with that same
// kubelet credential and ferry's RBAC.
func peerNode(t *testing.T, e *kubeenv.Env, servingCA *testca.CA, name string) (*peer.NodeTLS, string) {
	t.Helper()
	c, err := kube.New(e.NodeCertKubeconfig(name), nil)
	if err != nil {
		t.Fatal(err)
	}
	cert, key := servingCA.Serving(t, name, "127.0.0.1")
	dir := t.TempDir()
	serving, err := kube.LoadKeyPair(testca.WriteCurrent(t, dir, "kubelet-server", cert, key), "")
	if err != nil {
		t.Fatal(err)
	}
	clientCAs := c.CABundle(t.Context(), "kube-system", "extension-apiserver-authentication", "client-ca-file", time.Hour)
	servingCAs := c.CABundle(t.Context(), "openshift-config-managed", "kubelet-serving-ca", "ca-bundle.crt", time.Hour)
	if clientCAs.Get() == nil || servingCAs.Get() == nil {
		t.Fatalf("node %s cannot read the CA bundles through the API with its kubelet credential", name)
	}
	n := &peer.NodeTLS{Serving: serving.Get, Client: c.Identity().Get, ClientCAs: clientCAs.Get, ServingCAs: servingCAs.Get}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	srv := peer.NewServer(peer.NewShelf(peer.ShelfOptions{}), peer.ServerOptions{TLS: n.ServerConfig(), Closed: true,
		Status: func() peer.Status { return peer.Status{Node: name} }})
	go func() { defer close(done); srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return n, ln.Addr().String()
}

// TestPeers_TwoNodesAuthenticateWithTheirKubeletCertificates: two nodes'
// peers, with certificates from the real API server's client CA and the
// CA bundles read through the API, take each other, and refuse a client
// without a certificate, with one from another CA, or with one of the
// cluster's CA that names no node.
func TestPeers_TwoNodesAuthenticateWithTheirKubeletCertificates(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "127.0.0.1")
	e.AddNode("node-b", "127.0.0.1")
	e.InstallFerry()
	// The test plays OpenShift's operator that publishes the kubelets'
	// serving CA.
	servingCA := testca.New(t, "kubelet-signer")
	e.Create("/api/v1/namespaces/openshift-config-managed/configmaps", map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "kubelet-serving-ca"}, "data": map[string]any{"ca-bundle.crt": string(servingCA.PEM)}})
	a, addrA := peerNode(t, e, servingCA, "node-a")
	b, addrB := peerNode(t, e, servingCA, "node-b")
	ctx := t.Context()

	for _, p := range []struct {
		from *peer.NodeTLS
		to   string
		want string
	}{{a, addrB, "node-b"}, {b, addrA, "node-a"}} {
		st, err := peer.NewNodeClient(p.from).Status(ctx, p.to)
		if err != nil || st.Node != p.want {
			t.Fatalf("asking %s: %+v, %v", p.want, st, err)
		}
	}

	// The kubelet rotates its client certificate: the next connection
	// presents the new one, which the peer takes as well.
	e.RotateNodeCert("node-b")
	if _, err := peer.NewNodeClient(b).Offers(ctx, addrA); err != nil {
		t.Fatalf("after node-b's kubelet rotated its certificate: %v", err)
	}

	other := testca.New(t, "not-the-cluster")
	withClient := func(from *testca.CA, c testca.Cert) *peer.Client {
		cert, key := from.Issue(t, c)
		kp := testca.KeyPair(t, cert, key)
		n := *b
		n.Client = func() *tls.Certificate { return &kp }
		return peer.NewNodeClient(&n)
	}
	none := *b
	none.Client = func() *tls.Certificate { return nil }
	node := testca.Cert{CN: "system:node:node-b", O: []string{"system:nodes"}, Client: true}
	for what, c := range map[string]*peer.Client{
		"no certificate":                          peer.NewNodeClient(&none),
		"a node's certificate from another CA":    withClient(other, node),
		"the cluster's CA, not a node":            withClient(e.ClientCA, testca.Cert{CN: "admin", O: []string{"system:masters"}, Client: true}),
		"the cluster's CA, a node without O":      withClient(e.ClientCA, testca.Cert{CN: "system:node:node-b", Client: true}),
		"a node's serving certificate as its own": withClient(servingCA, testca.Cert{CN: "system:node:node-b", O: []string{"system:nodes"}, Hosts: []string{"127.0.0.1"}, Server: true}),
	} {
		if _, err := c.Offers(ctx, addrA); err == nil {
			t.Errorf("%s: served", what)
		}
	}
	if _, err := peer.NewClient("", nil).Offers(ctx, addrA); err == nil {
		t.Error("plain HTTP: served")
	}
	// A certificate the peers refuse is refused by the API server too.
	cert, key := other.Node(t, "node-b")
	dir := t.TempDir()
	cur := testca.WriteCurrent(t, dir, "kubelet-client", cert, key)
	kc := filepath.Join(dir, "kubeconfig")
	os.WriteFile(kc, []byte("clusters: [{name: t, cluster: {server: "+e.Server+", insecure-skip-tls-verify: true}}]\nusers: [{name: u, user: {client-certificate: "+cur+", client-key: "+cur+"}}]\ncontexts: [{name: t, context: {cluster: t, user: u}}]\ncurrent-context: t\n"), 0o600)
	stranger, err := kube.New(kc, nil)
	if err != nil {
		t.Fatal(err)
	}
	stranger.Attempts = 1
	if err := stranger.Annotate(ctx, "node-b", map[string]string{"ferry.io/phase": "x"}, nil); err == nil {
		t.Error("the API server took a certificate from another CA")
	}
}

// twoNodeCluster is the real API server with Nodes node-a and node-b,
// ferry's RBAC, admission policies and UpgradeBundle CRD: where the
// two-agent tests start.
func twoNodeCluster(t *testing.T) *kubeenv.Env {
	t.Helper()
	e := kubeenv.Start(t, current)
	e.AddNode("node-a", "127.0.0.1")
	e.AddNode("node-b", "127.0.0.1")
	e.InstallFerry()
	installBundles(e)
	return e
}

// kubeletAgents starts the real agents of nodes (already in e), each with
// only its kubelet's kubeconfig (client certificate) and serving
// certificate and peer.identity = "node" (no token anywhere), peers of
// each other, the kubelets' serving CA published as OpenShift's operator
// does. configure (nil: nothing) sets each one up further before it
// starts. It waits for them idle, and shows their logs when t fails.
func kubeletAgents(t *testing.T, e *kubeenv.Env, nodes []string, configure func(node string, cfg *agent.Config)) map[string]*ferryenv.Agent {
	t.Helper()
	servingCA := testca.New(t, "kubelet-signer")
	e.Create("/api/v1/namespaces/openshift-config-managed/configmaps", map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "kubelet-serving-ca"}, "data": map[string]any{"ca-bundle.crt": string(servingCA.PEM)}})
	ports := map[string]int{}
	for _, n := range nodes {
		ports[n] = freeport.Port(t, "127.0.0.1")
	}
	agents := map[string]*ferryenv.Agent{}
	for _, n := range nodes {
		cfg := ferryenv.Config(t.TempDir())
		cfg.NodeName = n
		// Given bundles by ferry load only: a loop device another test
		// plugs is no stick of theirs.
		cfg.Media.Detect = "manual"
		cfg.Cluster.Kubeconfig = e.NodeCertKubeconfig(n)
		cert, key := servingCA.Serving(t, n, "127.0.0.1")
		cfg.Peer.Cert = testca.WriteCurrent(t, t.TempDir(), "kubelet-server", cert, key)
		cfg.Peer.Identity = "node"
		cfg.Peer.Listen = "127.0.0.1:" + strconv.Itoa(ports[n])
		for _, m := range nodes {
			if m != n {
				cfg.Peer.Peers = append(cfg.Peer.Peers, "127.0.0.1:"+strconv.Itoa(ports[m]))
			}
		}
		if configure != nil {
			configure(n, &cfg)
		}
		// As on a node (CRI-O's certs.d exists there).
		if err := os.MkdirAll(cfg.Paths.CertsDir, 0o755); err != nil {
			t.Fatal(err)
		}
		agents[n] = ferryenv.Start(t, cfg)
	}
	for _, a := range agents {
		a.WaitPhase(bound, "idle")
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range nodes {
				t.Logf("%s's log:\n%s", n, agents[n].Logs())
			}
		}
	})
	return agents
}

// TestAgents_TwoNodesShareABundleOverTLSWithTheirKubeletIdentities: two
// real agents, each with only its kubelet's kubeconfig and serving
// certificate and peer.identity = "node" (no token anywhere), the CA
// bundles read through the real API server: the bundle given to node-a
// reaches node-b through the peers.
func TestAgents_TwoNodesShareABundleOverTLSWithTheirKubeletIdentities(t *testing.T) {
	e := twoNodeCluster(t)
	tarPath, meta := releaseBundle(t)
	agents := kubeletAgents(t, e, []string{"node-a", "node-b"}, nil)
	if out, err := agents["node-a"].Ferry("load", tarPath); err != nil {
		t.Fatalf("ferry load: %v\n%s", err, out)
	}
	s := agents["node-b"].Wait(bound, "node-b to fetch the bundle from node-a", func(s agent.Status) bool {
		return s.Bundle != "" && s.Phase != string(agent.PhaseFetching) && s.Phase != string(agent.PhaseDetected)
	})
	if s.Version != meta.Version {
		t.Errorf("node-b holds %+v", s)
	}
	for n, a := range agents {
		if !strings.Contains(a.Logs(), "peers: TLS with node identities") {
			t.Errorf("%s does not say its peers use node identities", n)
		}
	}
}
