package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/ferry-edge/ferry/cluster"
)

// Follower keeps, with watches (watch.go), what one node's agent follows
// in the cluster: the Nodes (its own, the peers' addresses, every Node's
// readiness), ClusterVersion "version" and the UpgradeBundles. Its reads answer from that copy, with
// no request, once the first list came back (before that, and while a
// watch is refused, they ask the API as Client's do); Changes wakes
// whoever reads them at each change.
type Follower struct {
	c       *Client
	node    string
	changed Signal
	nodes   *Informer
	version *Informer
	bundles *Informer

	mu      sync.Mutex
	pools   []pool
	poolsAt time.Time
}

// poolsFor is how long a list of the MachineConfigPools is used before
// it is read again (the pools are not watched: ferry reads them only
// while the MCO works on the node after an upgrade).
const poolsFor = 30 * time.Second

// Follow makes a Follower for the agent on node; Run runs it.
func (c *Client) Follow(node string) *Follower {
	f := &Follower{c: c, node: node}
	// Every Node, not only this one: the peers' addresses and the gate's
	// readiness come from the copy, with no list every half minute. A
	// kubelet writes its Node's status when it changes (or every few
	// minutes), so each agent hears of a few changes a minute.
	f.nodes = c.Inform("/api/v1/nodes", "", &f.changed)
	f.version = c.Inform("/apis/config.openshift.io/v1/clusterversions", "metadata.name=version", &f.changed)
	f.bundles = c.Inform(bundlesPath, "", &f.changed)
	return f
}

// Run follows until ctx ends.
func (f *Follower) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, i := range []*Informer{f.nodes, f.version, f.bundles} {
		wg.Add(1)
		go func() { defer wg.Done(); i.Run(ctx) }()
	}
	wg.Wait()
	return nil
}

// Changes is closed at the next change of what the reads return.
func (f *Follower) Changes() <-chan struct{} { return f.changed.C() }

// UpgradeBundle is Client.UpgradeBundle, from the copy.
func (f *Follower) UpgradeBundle(ctx context.Context, name string) (cluster.BundleView, bool, error) {
	raw, found, synced := f.bundles.Get(name)
	if !synced {
		return f.c.UpgradeBundle(ctx, name)
	}
	if !found {
		return cluster.BundleView{}, false, nil
	}
	var o upgradeBundle
	if err := json.Unmarshal(raw, &o); err != nil {
		return cluster.BundleView{}, false, fmt.Errorf("reading upgradebundle %s: %w", name, err)
	}
	return o.view(), true, nil
}

// Approvals is Client.Approvals, from the copy.
func (f *Follower) Approvals(ctx context.Context) ([]cluster.Approval, error) {
	bs, err := f.bundleList()
	if bs == nil && err == nil {
		return f.c.Approvals(ctx)
	}
	return approvedOf(bs), err
}

// Sources is Client.Sources, from the copy.
func (f *Follower) Sources(ctx context.Context) ([]cluster.RegistrySource, error) {
	bs, err := f.bundleList()
	if bs == nil && err == nil {
		return f.c.Sources(ctx)
	}
	return sourcesOf(bs), err
}

// bundleList is every UpgradeBundle of the copy; nil, nil before the
// watch has synced.
func (f *Follower) bundleList() ([]upgradeBundle, error) {
	return decodeAll[upgradeBundle](f.bundles, "upgradebundles")
}

// decodeAll decodes every object of i's copy; nil, nil before its watch
// has synced.
func decodeAll[T any](i *Informer, what string) ([]T, error) {
	raws, synced := i.List()
	if !synced {
		return nil, nil
	}
	out := []T{}
	for _, raw := range raws {
		var o T
		if err := json.Unmarshal(raw, &o); err != nil {
			return nil, fmt.Errorf("reading the %s: %w", what, err)
		}
		out = append(out, o)
	}
	return out, nil
}

// UpgradeStatus is Client.UpgradeStatus, from the copy.
func (f *Follower) UpgradeStatus(ctx context.Context, release string) (cluster.UpgradeStatus, error) {
	raw, found, synced := f.version.Get("version")
	if !synced {
		return f.c.UpgradeStatus(ctx, release)
	}
	if !found {
		return cluster.UpgradeStatus{}, fmt.Errorf("the cluster has no clusterversion/version")
	}
	var cv clusterVersion
	if err := json.Unmarshal(raw, &cv); err != nil {
		return cluster.UpgradeStatus{}, fmt.Errorf("reading clusterversion/version: %w", err)
	}
	return upgradeOf(&cv, release), nil
}

// NodeAddresses is Client.NodeAddresses, from the copy.
func (f *Follower) NodeAddresses(ctx context.Context) (map[string]string, error) {
	nodes, err := f.nodeList()
	if nodes == nil && err == nil {
		return f.c.NodeAddresses(ctx)
	}
	return addressesOf(nodes), err
}

// NodeReadiness is Client.NodeReadiness, from the copy.
func (f *Follower) NodeReadiness(ctx context.Context) (map[string]cluster.NodeReady, error) {
	nodes, err := f.nodeList()
	if nodes == nil && err == nil {
		return f.c.NodeReadiness(ctx)
	}
	return readinessOf(nodes), err
}

// nodeList is every Node of the copy; nil, nil before the watch synced.
func (f *Follower) nodeList() ([]node, error) { return decodeAll[node](f.nodes, "nodes") }

// MachineConfigState is Client.MachineConfigState, the Node from the
// copy (for the follower's own node) and the pools as read in the last
// poolsFor.
func (f *Follower) MachineConfigState(ctx context.Context, node string) (cluster.NodeUpdate, error) {
	raw, found, synced := f.nodes.Get(node)
	if node != f.node || !synced {
		return f.c.MachineConfigState(ctx, node)
	}
	if !found {
		return cluster.NodeUpdate{}, fmt.Errorf("reading node %s: %w", node, &APIError{Code: 404, Reason: "NotFound", Message: "nodes " + url.PathEscape(node) + " not found"})
	}
	var n mcoNode
	if err := json.Unmarshal(raw, &n); err != nil {
		return cluster.NodeUpdate{}, fmt.Errorf("reading node %s: %w", node, err)
	}
	return n.state(ctx, f.cachedPools)
}

func (f *Follower) cachedPools(ctx context.Context) ([]pool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.poolsAt.IsZero() && time.Since(f.poolsAt) < poolsFor {
		return f.pools, nil
	}
	ps, err := f.c.pools(ctx)
	if err != nil {
		return nil, err
	}
	f.pools, f.poolsAt = ps, time.Now()
	return ps, nil
}
