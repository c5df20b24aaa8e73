package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"sync"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/kube"
	"github.com/ferry-edge/ferry/metrics"
)

// clusterAPI is the agent's ClusterAPI on the kube client: what the agent
// follows is read from the Follower's copy (kept by its watches), the
// rest (the writes, the preflight) is the Client's.
type clusterAPI struct {
	*kube.Client
	f *kube.Follower
}

// It takes a bundle's path of several releases too.
var _ agent.PathAPI = clusterAPI{}

func (k clusterAPI) Changes() <-chan struct{} { return k.f.Changes() }

// NodeChanges wakes the agent's reading of this node's MCO state at a
// change of its own Node only.
func (k clusterAPI) NodeChanges() <-chan struct{} { return k.f.NodeChanges() }

func (k clusterAPI) Approvals(ctx context.Context) ([]cluster.Approval, error) {
	return k.f.Approvals(ctx)
}

func (k clusterAPI) Sources(ctx context.Context) ([]cluster.RegistrySource, error) {
	return k.f.Sources(ctx)
}

func (k clusterAPI) UpgradeStatus(ctx context.Context, release string) (cluster.UpgradeStatus, error) {
	return k.f.UpgradeStatus(ctx, release)
}

func (k clusterAPI) NodeUpdate(ctx context.Context, node string) (cluster.NodeUpdate, error) {
	return k.f.MachineConfigState(ctx, node)
}

func (k clusterAPI) UpgradeBundle(ctx context.Context, name string) (cluster.BundleView, bool, error) {
	return k.f.UpgradeBundle(ctx, name)
}

func (k clusterAPI) NodeAddresses(ctx context.Context) (map[string]string, error) {
	return k.f.NodeAddresses(ctx)
}

func (k clusterAPI) MachineCount(ctx context.Context) (int, bool, error) {
	return k.f.MachineCount(ctx)
}

func (k clusterAPI) NodeReadiness(ctx context.Context) (map[string]cluster.NodeReady, error) {
	return k.f.NodeReadiness(ctx)
}

func (k clusterAPI) PreflightPath(ctx context.Context, path []string, images []string) (cluster.Preflight, error) {
	return k.f.PreflightPath(ctx, path, images)
}

func (k clusterAPI) Preflight(ctx context.Context, version string, images []string) (cluster.Preflight, error) {
	return k.f.Preflight(ctx, version, images)
}

// PublishBundle writes this node's entry into its UpgradeBundleNode, and
// the summary when this node is its writer (sum not nil).
func (k clusterAPI) PublishBundle(ctx context.Context, name string, sum *cluster.BundleSummary, _ string, e cluster.BundleNodeEntry) error {
	return k.f.PublishBundle(ctx, name, sum, e)
}

func (k clusterAPI) FollowEntries(all bool) { k.f.FollowEntries(all) }

// FollowPuller watches the pulling node's record (registry mode).
func (k clusterAPI) FollowPuller(node string) { k.f.FollowPuller(node) }

func (k clusterAPI) PullRecord(ctx context.Context, bundle, node string) (*cluster.PullRecord, error) {
	return k.f.PullRecord(ctx, bundle, node)
}

// newClusterAPI is the Kubernetes API when a kubeconfig is configured: the
// agent's ClusterAPI, what it must warn of, and the job that follows the
// cluster's objects and keeps ferry's token fresh (nil, nil, nil without a
// kubeconfig), and that writes this node's record for its peers (its
// Lease). With the kubelet's credential, the node is the one its
// certificate names (cfg.NodeName is set to it).
func newClusterAPI(cfg *agent.Config, m *metrics.Metrics, log *slog.Logger) (agent.ClusterAPI, []string, func(context.Context) error, error) {
	if cfg.Cluster.Kubeconfig == "" {
		return nil, nil, nil, nil
	}
	c, err := kube.New(cfg.Cluster.Kubeconfig, log)
	if err != nil {
		return nil, nil, nil, usageError("cluster.kubeconfig: %v", err)
	}
	if err := nodeFromIdentity(cfg, c, log); err != nil {
		return nil, nil, nil, err
	}
	c.WrapTransport(m.Transport)
	// Each node's writes under its own name in managedFields.
	c.FieldManager = kube.FieldManager(cfg.NodeName)
	var warnings []string
	if c.Insecure() {
		warnings = append(warnings, kube.InsecureWarning(c.Server()))
	}
	f := c.Follow(cfg.NodeName)
	run := func(ctx context.Context) error {
		var wg sync.WaitGroup
		wg.Go(func() { f.Run(ctx) })
		wg.Go(func() { f.KeepRecord(ctx, listenIP(cfg.Peer.Listen)) })
		err := c.KeepTokenFresh(ctx)
		wg.Wait()
		return err
	}
	return clusterAPI{c, f}, warnings, run, nil
}

// listenIP is the host of the peer listen address when it names one IP
// (the peers reach the node there), else "" (its InternalIP then).
func listenIP(listen string) string {
	host, _, err := net.SplitHostPort(listen)
	if ip := net.ParseIP(host); err == nil && ip != nil && !ip.IsUnspecified() {
		return host
	}
	return ""
}

// nodeFromIdentity names the node after the kubelet certificate ferry acts
// with (CN system:node:NAME): the API server lets that credential write
// that node's objects only. node_name left at its default (the hostname,
// which on some sites is not the Node's name) gives way to it; a
// node_name set to another node is a mistake to fix.
func nodeFromIdentity(cfg *agent.Config, c *kube.Client, log *slog.Logger) error {
	n, ok := c.NodeIdentity()
	if !ok || n == cfg.NodeName {
		return nil
	}
	if host, _ := os.Hostname(); cfg.NodeName != host {
		return usageError("node_name is %q but cluster.kubeconfig holds the credential of node %q (its certificate's CN): the API server lets it act for %q only; remove node_name or set it to %q", cfg.NodeName, n, n, n)
	}
	log.Info("kube: this node is the one the kubelet's certificate names", "node", n, "hostname", cfg.NodeName)
	cfg.NodeName = n
	return nil
}

// nodeAnnotations reads this node's ferry.io annotations, by node name,
// and the API server they come from: a kubelet's credential reads no
// other Node (the peers' own words come from the peers).
func nodeAnnotations(ctx context.Context, cfg agent.Config) (string, map[string]map[string]string, error) {
	c, err := kube.New(cfg.Cluster.Kubeconfig, nil)
	if err != nil {
		return "", nil, err
	}
	name := cfg.NodeName
	if n, ok := c.NodeIdentity(); ok {
		name = n
	}
	a, err := c.NodeAnnotations(ctx, name)
	if err != nil {
		return c.Server(), nil, err
	}
	return c.Server(), map[string]map[string]string{name: a}, nil
}

// bundleNodes reads every node's UpgradeBundleNode (ferry status
// --cluster): the entries each node wrote, by node name.
func bundleNodes(ctx context.Context, cfg agent.Config) ([]kube.NodeBundle, error) {
	c, err := kube.New(cfg.Cluster.Kubeconfig, nil)
	if err != nil {
		return nil, err
	}
	return c.BundleNodes(ctx)
}
