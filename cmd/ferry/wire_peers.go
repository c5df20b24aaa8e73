package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/internal/pacing"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/metrics"
	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/pull"
)

// peerSide is the peer side of the agent: serve runs its HTTP server
// until ctx ends (nil when no listen address is configured), with the
// registry pull under way; access is how a node following another's
// pull reaches it.
type peerSide struct {
	peers  agent.Peers
	serve  func(ctx context.Context, a *agent.Agent, pull http.Handler) error
	access *pull.PeerAccess
}

// newPeers builds the peer side; nil when no peer is configured. With
// node identities, known says which nodes the cluster has now.
func newPeers(cfg agent.Config, gov *pacing.Governor, known func(string) bool, m *metrics.Metrics, log *slog.Logger) (*peerSide, error) {
	if cfg.Peer.Listen == "" && len(cfg.Peer.Peers) == 0 {
		return nil, nil
	}
	token := ""
	if cfg.Peer.TokenFile != "" {
		b, err := os.ReadFile(cfg.Peer.TokenFile)
		if err != nil {
			return nil, usageError("peer.token_file: %v", err)
		}
		token = strings.TrimSpace(string(b))
		if token == "" {
			return nil, usageError("peer.token_file %s is empty", cfg.Peer.TokenFile)
		}
	}
	shelf := peer.NewShelf(peer.ShelfOptions{CacheDir: filepath.Join(cfg.Paths.StateDir, "pieces"), Log: log})
	var pacer peer.Pacer
	if gov != nil {
		pacer = gov
	}
	fopts := peer.FetcherOptions{Peers: cfg.Peer.Peers, Token: token, Shelf: shelf, Log: log, Pacer: pacer}
	sopts := peer.ServerOptions{Token: token, Closed: cfg.Peer.Closed(), Log: log, Pacer: pacer,
		Metrics: m.Handler(), Served: m.ServedAs(metrics.SourcePeer)}
	if cfg.Peer.NodeIdentity() {
		nt, err := newNodeTLS(cfg, log)
		if err != nil {
			return nil, err
		}
		nt.Known, nt.Monitoring = known, true
		fopts.Client, sopts.TLS = peer.NewNodeClient(nt), nt.ServerConfig()
	}
	if fopts.Client == nil {
		fopts.Client = peer.NewClient(token, nil)
	}
	client := fopts.Client
	client.Received = m.FetchedFrom(metrics.SourcePeer)
	f := peer.NewFetcher(fopts)
	side := &peerSide{peers: peer.Node{Shelf: shelf, Fetcher: f},
		access: &pull.PeerAccess{Transport: client.Transport(), TLS: client.TLS()}}
	if cfg.Peer.Listen != "" {
		// The build this process runs, for the peers' installers
		// (ferry-install --peers): without it the node still serves bundles.
		build, err := peer.OpenBuild("/proc/self/exe", buildVersion())
		if err != nil {
			log.Warn("peers: this node's ferry build is not offered", "err", err)
		} else {
			sopts.Build = build
		}
		side.serve = func(ctx context.Context, a *agent.Agent, pull http.Handler) error {
			defer shelf.Close()
			if build != nil {
				defer build.Close()
			}
			sopts.Status, sopts.Pull = a.PeerStatus, pull
			srv := peer.NewServer(shelf, sopts)
			if err := srv.ListenAndServe(ctx, cfg.Peer.Listen); err != nil {
				return fmt.Errorf("peer server on %s: %w", cfg.Peer.Listen, err)
			}
			return nil
		}
	}
	return side, nil
}

// caRefresh is how often the CA bundles read from the API are read again:
// the cluster adds a new CA to a bundle well before it signs with it.
const caRefresh = 10 * time.Minute

// newNodeTLS is the peers' TLS with node identities (peer.identity =
// "node"): the kubelet's client certificate as the kubeconfig names it,
// its serving certificate, and the CA bundles from files or the API.
func newNodeTLS(cfg agent.Config, log *slog.Logger) (*peer.NodeTLS, error) {
	c, err := kube.New(cfg.Cluster.Kubeconfig, log)
	if err != nil {
		return nil, usageError("cluster.kubeconfig: %v", err)
	}
	client := c.Identity()
	node, ok := c.NodeIdentity()
	if !ok {
		return nil, usageError("peer.identity = \"node\": cluster.kubeconfig %s holds no node's client certificate (CN system:node:NAME, O system:nodes); name the kubelet's, /var/lib/kubelet/kubeconfig", cfg.Cluster.Kubeconfig)
	}
	certFile := cmp.Or(cfg.Peer.Cert, agent.DefaultPeerCert)
	serving, err := kube.LoadKeyPair(certFile, cfg.Peer.Key)
	if err != nil {
		return nil, usageError("peer.cert: %v (the kubelet's serving certificate; on OpenShift %s)", err, agent.DefaultPeerCert)
	}
	if sn, err := serving.Node(); err != nil || sn != node {
		return nil, usageError("peer.cert %s is not node %s's serving certificate (%v, node %q): name this node's kubelet-server-current.pem", certFile, node, err, sn)
	}
	ctx := context.Background()
	clientCAs, err := caBundle(ctx, c, cfg.Peer.ClientCA, "kube-system", "extension-apiserver-authentication", "client-ca-file")
	if err != nil {
		return nil, usageError("peer.client_ca: %v", err)
	}
	servingCAs, err := caBundle(ctx, c, cfg.Peer.ServingCA, "openshift-config-managed", "kubelet-serving-ca", "ca-bundle.crt")
	if err != nil {
		return nil, usageError("peer.serving_ca: %v", err)
	}
	log.Info("peers: TLS with node identities", "node", node, "cert", certFile)
	return &peer.NodeTLS{Serving: serving.Get, Client: client.Get, ClientCAs: clientCAs.Get, ServingCAs: servingCAs.Get}, nil
}

// caBundle is the CA bundle in file, or, with none, in the API's
// ConfigMap ns/name under key.
func caBundle(ctx context.Context, c *kube.Client, file, ns, name, key string) (*kube.CAPool, error) {
	if file != "" {
		return kube.CAFile(file)
	}
	return c.CABundle(ctx, ns, name, key, caRefresh), nil
}

// recordedNodes tells whether a node has a record in the cluster's API
// (its Lease: the garbage collector takes it with its Node), asked at
// each peer handshake; nil without an API.
func recordedNodes(api agent.ClusterAPI) func(string) bool {
	if api == nil {
		return nil
	}
	return func(node string) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		nodes, err := api.NodeAddresses(ctx)
		_, ok := nodes[node]
		return err == nil && ok
	}
}
