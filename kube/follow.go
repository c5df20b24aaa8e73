package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"sync"
	"time"

	"github.com/ferry-edge/ferry/api/v1alpha1"
	"github.com/ferry-edge/ferry/cluster"
)

// Follower keeps, with watches (watch.go), what one node's agent follows
// in the cluster: its own Node, the nodes' records (Leases in
// openshift-ferry: the peers' addresses and readiness, leases.go),
// ClusterVersion "version", the UpgradeBundles, and its own
// UpgradeBundleNode (every node's only while it writes a summary,
// FollowEntries). Its reads answer from that copy, with no request, once
// the first list came back (before that, and while a watch is refused,
// they ask the API as Client's do); Changes wakes whoever reads them at
// each change.
type Follower struct {
	c       *Client
	node    string
	changed Signal
	// nodeChanged fires at a change of this node's own Node alone.
	nodeChanged Signal
	nodes       *Informer // this node's own Node only
	leases      *Informer
	version     *Informer
	bundles     *Informer
	own         *Informer // this node's own UpgradeBundleNode only

	mu      sync.Mutex
	pools   []pool // every pool, as last listed (their count of nodes)
	poolsAt time.Time
	// poolName is this node's pool as chosen from a list of them, for
	// the labels poolLabels: read alone while the labels stay.
	poolName   string
	poolLabels map[string]string
	runCtx     context.Context
	all        *Informer // every node's UpgradeBundleNode, while FollowEntries(true)
	stopAll    context.CancelFunc
	// puller is the pulling node's UpgradeBundleNode while this node
	// follows its pull (registry mode, FollowPuller).
	puller, pullerName string
	pullerInf          *Informer
	stopPuller         context.CancelFunc
	// entries are this node's entries as it last applied them (nil
	// until read): only this node writes them.
	entries   []v1alpha1.BundleNodeStatus
	reporting string // the UpgradeBundle this node last wrote its entry in
	// leasesDecoded is the records as decoded at the leases' copy's
	// generation leasesGen (leaseList).
	leasesDecoded []lease
	leasesGen     uint64
}

// poolsFor is how long the pools' count of nodes is used before they are
// listed again (the pools are not watched: their status changes as each
// node updates, which would send every node every pool's change). The
// count changes when nodes join or leave the cluster: the gate waits for
// a node without ferry within this; an idle node lists them this often.
const poolsFor = 5 * time.Minute

// Follow makes a Follower for the agent on node; Run runs it.
func (c *Client) Follow(node string) *Follower {
	f := &Follower{c: c, node: node}
	// Its own Node only: a kubelet's credential may read no other
	// (AuthorizeNodeWithSelectors). The peers' addresses and readiness
	// come from their records, renewed every leaseRenew.
	f.nodes = c.Inform("/api/v1/nodes", "metadata.name="+node, &f.changed).Also(&f.nodeChanged, mcoKey)
	f.leases = c.Inform(leasesPath, "", &f.changed)
	f.version = c.Inform("/apis/config.openshift.io/v1/clusterversions", "metadata.name=version", &f.changed)
	f.bundles = c.Inform(bundlesPath, "", &f.changed)
	f.own = c.Inform(bundleNodesPath, "metadata.name="+node, &f.changed)
	return f
}

// Run follows until ctx ends.
func (f *Follower) Run(ctx context.Context) error {
	f.mu.Lock()
	f.runCtx = ctx
	f.mu.Unlock()
	var wg sync.WaitGroup
	for _, i := range []*Informer{f.nodes, f.leases, f.version, f.bundles, f.own} {
		wg.Add(1)
		go func() { defer wg.Done(); i.Run(ctx) }()
	}
	wg.Wait()
	f.FollowEntries(false)
	f.FollowPuller("")
	return nil
}

// FollowEntries watches every node's UpgradeBundleNode while all is true
// (this node writes a summary, agent.summaryWriter), else only this
// node's own: a node's write then reaches the one node that sums them
// up, not every node.
func (f *Follower) FollowEntries(all bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case all && f.all == nil && f.runCtx != nil && f.runCtx.Err() == nil:
		f.all, f.stopAll = f.startBundleNodes("")
	case !all && f.all != nil:
		f.stopAll()
		f.all, f.stopAll = nil, nil
	}
}

// FollowPuller watches node's UpgradeBundleNode (registry mode: the node
// that pulls a release this one follows; "" for none), so that its pull
// record, published as the pull starts, wakes this node at once: the
// others follow a pull as it arrives. One object, whatever the cluster's
// size.
func (f *Follower) FollowPuller(node string) {
	if node == f.node {
		node = ""
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if node == f.pullerName {
		return
	}
	if f.stopPuller != nil {
		f.stopPuller()
		f.pullerInf, f.stopPuller, f.pullerName = nil, nil, ""
	}
	if node == "" || f.runCtx == nil || f.runCtx.Err() != nil {
		return
	}
	f.pullerInf, f.stopPuller = f.startBundleNodes("metadata.name=" + node)
	f.pullerName = node
}

// startBundleNodes watches the UpgradeBundleNodes fieldSelector selects
// until the returned cancel or the end of Run; f.mu held.
func (f *Follower) startBundleNodes(fieldSelector string) (*Informer, context.CancelFunc) {
	ctx, cancel := context.WithCancel(f.runCtx)
	i := f.c.Inform(bundleNodesPath, fieldSelector, &f.changed)
	go i.Run(ctx)
	return i, cancel
}

// Changes is closed at the next change of what the reads return.
func (f *Follower) Changes() <-chan struct{} { return f.changed.C() }

// NodeChanges is closed at the next change of what MachineConfigState
// reads of this node's own Node (the MCO's annotations, its labels but
// ferry's own: mcoKey), not at ferry's own writes to it.
func (f *Follower) NodeChanges() <-chan struct{} { return f.nodeChanged.C() }

// UpgradeBundle is Client.UpgradeBundle, from the copy: with every
// node's entry while FollowEntries(true), else this node's own.
func (f *Follower) UpgradeBundle(ctx context.Context, name string) (cluster.BundleView, bool, error) {
	raw, found, synced := f.bundles.Get(name)
	if !synced {
		var o v1alpha1.UpgradeBundle
		err := f.c.do(ctx, "GET", bundlesPath+"/"+url.PathEscape(name), "", nil, &o)
		if IsNotFound(err) {
			return cluster.BundleView{}, false, nil
		}
		if err != nil {
			return cluster.BundleView{}, false, fmt.Errorf("reading upgradebundle %s: %w", name, err)
		}
		raw, _ = json.Marshal(&o)
	} else if !found {
		return cluster.BundleView{}, false, nil
	}
	var o v1alpha1.UpgradeBundle
	if err := json.Unmarshal(raw, &o); err != nil {
		return cluster.BundleView{}, false, fmt.Errorf("reading upgradebundle %s: %w", name, err)
	}
	objs, err := f.bundleNodes(ctx)
	if err != nil {
		return cluster.BundleView{}, false, err
	}
	return view(&o, entriesFor(objs, name)), true, nil
}

// bundleNodes is every node's UpgradeBundleNode while FollowEntries(true),
// else this node's own, from the copy (asked for before it synced).
func (f *Follower) bundleNodes(ctx context.Context) ([]v1alpha1.UpgradeBundleNode, error) {
	f.mu.Lock()
	all := f.all
	f.mu.Unlock()
	if all != nil {
		objs, err := decodeAll[v1alpha1.UpgradeBundleNode](all, "upgradebundlenodes")
		if objs == nil && err == nil {
			return f.c.listBundleNodes(ctx)
		}
		return objs, err
	}
	raw, found, synced := f.own.Get(f.node)
	if !synced {
		o, err := f.c.bundleNode(ctx, f.node)
		if o == nil || err != nil {
			return nil, err
		}
		return []v1alpha1.UpgradeBundleNode{*o}, nil
	}
	if !found {
		return nil, nil
	}
	var o v1alpha1.UpgradeBundleNode
	if err := json.Unmarshal(raw, &o); err != nil {
		return nil, fmt.Errorf("reading upgradebundlenode %s: %w", f.node, err)
	}
	return []v1alpha1.UpgradeBundleNode{o}, nil
}

// PullRecord is Client.PullRecord, from the copy when it holds node's
// object (this node's own, or every node's while it writes a summary).
func (f *Follower) PullRecord(ctx context.Context, bundle, node string) (*cluster.PullRecord, error) {
	f.mu.Lock()
	all, puller := f.all, f.pullerInf
	if f.pullerName != node {
		puller = nil
	}
	f.mu.Unlock()
	if node != f.node && all == nil && puller != nil {
		raw, found, synced := puller.Get(node)
		if synced {
			if !found {
				return nil, nil
			}
			var o v1alpha1.UpgradeBundleNode
			if err := json.Unmarshal(raw, &o); err != nil {
				return nil, fmt.Errorf("reading upgradebundlenode %s: %w", node, err)
			}
			return entriesFor([]v1alpha1.UpgradeBundleNode{o}, bundle)[node].Pull, nil
		}
	}
	if node != f.node && all == nil {
		return f.c.PullRecord(ctx, bundle, node)
	}
	objs, err := f.bundleNodes(ctx)
	return entriesFor(objs, bundle)[node].Pull, err
}

// PublishBundle writes this node's entry for the UpgradeBundle name into
// its UpgradeBundleNode, then the summary when sum is not nil (this node
// is its writer), and then has this node's record say that it reports on
// name: only the writer's record says so (agent.summaryWriter), so that
// one record, not every node's, is written for each bundle.
func (f *Follower) PublishBundle(ctx context.Context, name string, sum *cluster.BundleSummary, entry cluster.BundleNodeEntry) error {
	if err := f.publishEntry(ctx, name, entry); err != nil {
		return err
	}
	if sum == nil {
		return nil
	}
	f.mu.Lock()
	was := f.reporting
	f.reporting = name
	f.mu.Unlock()
	if was != name {
		f.changed.Fire() // KeepRecord writes the record again
	}
	return f.c.PublishBundleSummary(ctx, name, f.node, *sum)
}

// publishEntry applies this node's UpgradeBundleNode with entry as its
// entry for name: its other entries as it last applied them (read once),
// those of UpgradeBundles that are gone left out.
func (f *Follower) publishEntry(ctx context.Context, name string, entry cluster.BundleNodeEntry) error {
	f.mu.Lock()
	old := f.entries
	f.mu.Unlock()
	if old == nil {
		o, err := f.c.bundleNode(ctx, f.node)
		if err != nil {
			return err
		}
		old = []v1alpha1.BundleNodeStatus{}
		if o != nil {
			old = o.Status.Bundles
		}
	}
	uid := ""
	if rec, ok := f.ownRecord(""); ok {
		uid = rec.uid
	} else {
		var err error
		if uid, err = f.c.nodeUID(ctx, f.node); err != nil {
			return err
		}
	}
	exists := func(string) bool { return true }
	if _, synced := f.bundles.List(); synced {
		exists = func(b string) bool { _, found, _ := f.bundles.Get(b); return found }
	}
	entries, err := f.c.applyBundleNode(ctx, f.node, uid, withEntry(old, name, entryOf(entry, time.Now()), exists))
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.entries = entries
	f.mu.Unlock()
	return nil
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
func (f *Follower) bundleList() ([]v1alpha1.UpgradeBundle, error) {
	return decodeAll[v1alpha1.UpgradeBundle](f.bundles, "upgradebundles")
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
	ls, err := f.leaseList()
	if ls == nil && err == nil {
		return f.c.NodeAddresses(ctx)
	}
	return addressesOfLeases(ls), err
}

// NodeReadiness is Client.NodeReadiness, from the copy.
func (f *Follower) NodeReadiness(ctx context.Context) (map[string]cluster.NodeReady, error) {
	ls, err := f.leaseList()
	if ls == nil && err == nil {
		return f.c.NodeReadiness(ctx)
	}
	return readinessOfLeases(ls, time.Now()), err
}

// leaseList is every record of the copy; nil, nil before the watch synced.
// Decoded once per change of the copy: every peer handshake asks for the
// nodes' addresses (cmd/ferry's recordedNodes), N records each time.
func (f *Follower) leaseList() ([]lease, error) {
	gen := f.leases.Gen()
	f.mu.Lock()
	if f.leasesGen == gen && f.leasesDecoded != nil {
		ls := f.leasesDecoded
		f.mu.Unlock()
		return ls, nil
	}
	f.mu.Unlock()
	ls, err := decodeAll[lease](f.leases, "nodes' records")
	if err == nil && ls != nil {
		f.mu.Lock()
		f.leasesGen, f.leasesDecoded = gen, ls
		f.mu.Unlock()
	}
	return ls, err
}

// Preflight is Client.Preflight on this node's own pods.
func (f *Follower) Preflight(ctx context.Context, target string, images []string) (cluster.Preflight, error) {
	return f.c.Preflight(ctx, f.node, target, images)
}

// PreflightPath is Client.PreflightPath on this node's own pods.
func (f *Follower) PreflightPath(ctx context.Context, path []string, images []string) (cluster.Preflight, error) {
	return f.c.PreflightPath(ctx, f.node, path, images)
}

// MachineConfigState is Client.MachineConfigState, the Node from the
// copy (for the follower's own node) and its one pool read afresh, by
// name: the pools are not watched, and a pool paused since the last
// reading must be the reason this node says it waits at once. The pools
// are listed only to find which is the node's (first, and when its
// labels change or that pool is gone or no longer selects it).
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
	return n.state(ctx, func(ctx context.Context) ([]pool, error) { return f.nodePools(ctx, n.Metadata.Labels) })
}

// nodePools is the pool of a node with labels, alone when known (read by
// name), else every pool (listed, and the node's remembered).
func (f *Follower) nodePools(ctx context.Context, labels map[string]string) ([]pool, error) {
	labels = poolLabels(labels)
	f.mu.Lock()
	name := ""
	if maps.Equal(labels, f.poolLabels) {
		name = f.poolName
	}
	f.mu.Unlock()
	if name != "" {
		p, err := f.c.namedPool(ctx, name)
		if err != nil {
			return nil, err
		}
		if p != nil && p.Spec.NodeSelector.matches(labels) {
			return []pool{*p}, nil
		}
	}
	ps, err := f.c.pools(ctx)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pools, f.poolsAt = ps, time.Now()
	f.poolName, f.poolLabels = "", labels
	if p := poolOf(ps, labels); p != nil {
		f.poolName = p.Metadata.Name
	}
	return ps, nil
}

// MachineCount is Client.MachineCount, from the pools as listed in the
// last poolsFor.
func (f *Follower) MachineCount(ctx context.Context) (int, bool, error) {
	return machineCount(f.cachedPools(ctx))
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
