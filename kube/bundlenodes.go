package kube

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"slices"
	"time"

	"github.com/ferry-edge/ferry/api/v1alpha1"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
)

// Each node's UpgradeBundleNode: one object per Node, named after it,
// owned by it, holding that node's entry for each UpgradeBundle it knows
// (docs/design.md, "The UpgradeBundle"). A node applies the whole of its
// object as its own field manager: what it leaves out (the entry of a
// bundle that is gone) the API server takes out.

const bundleNodesPath = "/apis/" + v1alpha1.APIVersion + "/" + v1alpha1.NodeResource

// MaxBundleEntries is how many entries an UpgradeBundleNode holds (the
// CRD's bound): the newest first, the oldest dropped beyond it.
const MaxBundleEntries = 8

// NodeBundle is one node's entry for one UpgradeBundle, as ferry status
// --cluster lists them.
type NodeBundle struct {
	Node, Bundle string
	Entry        cluster.BundleNodeEntry
}

// entryView is e as ferry reads it.
func entryView(e v1alpha1.NodeStatus) cluster.BundleNodeEntry {
	return cluster.BundleNodeEntry{Phase: e.Phase, Digest: digest.Digest(e.Digest), Reason: e.Reason, Message: e.Message, Excluded: e.Excluded,
		Pull: pullRecord(e.Pull), Conditions: conditionsOf(e.Conditions)}
}

// entriesFor is every node's entry for the UpgradeBundle name in objs, by
// node.
func entriesFor(objs []v1alpha1.UpgradeBundleNode, name string) map[string]cluster.BundleNodeEntry {
	out := map[string]cluster.BundleNodeEntry{}
	for _, o := range objs {
		for _, b := range o.Status.Bundles {
			if b.Name == name {
				out[o.Name] = entryView(b.NodeStatus)
			}
		}
	}
	return out
}

// withEntry is the entries old with e as the entry for the UpgradeBundle
// name, first: the others after it as they were, but those exists says
// are gone (exists nil: none is), at most MaxBundleEntries. A pull record
// stays once written (the other nodes bind the pull to it after the pull
// too): e without one keeps the one old has.
func withEntry(old []v1alpha1.BundleNodeStatus, name string, e v1alpha1.NodeStatus, exists func(string) bool) []v1alpha1.BundleNodeStatus {
	out := []v1alpha1.BundleNodeStatus{{Name: name, NodeStatus: e}}
	for _, o := range old {
		switch {
		case o.Name == name:
			if e.Pull == nil {
				out[0].Pull = o.Pull
			}
		case exists == nil || exists(o.Name):
			out = append(out, o)
		}
	}
	return out[:min(len(out), MaxBundleEntries)]
}

// bundleNode reads node's UpgradeBundleNode (nil when there is none, or
// no CRD).
func (c *Client) bundleNode(ctx context.Context, node string) (*v1alpha1.UpgradeBundleNode, error) {
	var o v1alpha1.UpgradeBundleNode
	err := c.do(ctx, "GET", bundleNodesPath+"/"+url.PathEscape(node), "", nil, &o)
	if IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading upgradebundlenode %s: %w", node, err)
	}
	return &o, nil
}

// listBundleNodes is every node's UpgradeBundleNode (none without the
// CRD), from the API server's watch cache.
func (c *Client) listBundleNodes(ctx context.Context) ([]v1alpha1.UpgradeBundleNode, error) {
	var list v1alpha1.UpgradeBundleNodeList
	err := c.do(ctx, "GET", bundleNodesPath+"?resourceVersion=0", "", nil, &list)
	if IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the upgradebundlenodes: %w", err)
	}
	return list.Items, nil
}

// BundleNodes is every node's entry for every UpgradeBundle it knows, by
// node name, then as each node orders them (the one it reports on now
// first): ferry status --cluster.
func (c *Client) BundleNodes(ctx context.Context) ([]NodeBundle, error) {
	objs, err := c.listBundleNodes(ctx)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(objs, func(a, b v1alpha1.UpgradeBundleNode) int { return cmp.Compare(a.Name, b.Name) })
	var out []NodeBundle
	for _, o := range objs {
		for _, b := range o.Status.Bundles {
			out = append(out, NodeBundle{Node: o.Name, Bundle: b.Name, Entry: entryView(b.NodeStatus)})
		}
	}
	return out, nil
}

// PullRecord is what node published of its pull for the UpgradeBundle
// bundle, in its own UpgradeBundleNode (nil when nothing).
func (c *Client) PullRecord(ctx context.Context, bundle, node string) (*cluster.PullRecord, error) {
	o, err := c.bundleNode(ctx, node)
	if err != nil || o == nil {
		return nil, err
	}
	return entriesFor([]v1alpha1.UpgradeBundleNode{*o}, bundle)[node].Pull, nil
}

// PublishBundleEntry writes node's entry for the UpgradeBundle name into
// node's UpgradeBundleNode, creating it owned by the Node: its other
// entries stay, but those of UpgradeBundles that are gone.
func (c *Client) PublishBundleEntry(ctx context.Context, name, node string, entry cluster.BundleNodeEntry) error {
	o, err := c.bundleNode(ctx, node)
	if err != nil {
		return err
	}
	var old []v1alpha1.BundleNodeStatus
	if o != nil {
		old = o.Status.Bundles
	}
	uid, err := c.nodeUID(ctx, node)
	if err != nil {
		return err
	}
	_, err = c.applyBundleNode(ctx, node, uid, withEntry(old, name, entryOf(entry, time.Now()), nil))
	return err
}

// nodeUID is the uid of the Node node, its UpgradeBundleNode's owner.
func (c *Client) nodeUID(ctx context.Context, node string) (string, error) {
	var n struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
	}
	if err := c.do(ctx, "GET", "/api/v1/nodes/"+url.PathEscape(node), "", nil, &n); err != nil {
		return "", fmt.Errorf("reading node %s, the owner of its upgradebundlenode: %w", node, err)
	}
	return n.Metadata.UID, nil
}

// applyBundleNode applies node's UpgradeBundleNode, owned by its Node
// (uid), holding entries; it returns the entries as applied.
func (c *Client) applyBundleNode(ctx context.Context, node, uid string, entries []v1alpha1.BundleNodeStatus) ([]v1alpha1.BundleNodeStatus, error) {
	body := map[string]any{"apiVersion": v1alpha1.APIVersion, "kind": v1alpha1.NodeKind,
		"metadata": map[string]any{"name": node, "ownerReferences": []map[string]any{{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}}},
		"status":   map[string]any{"bundles": entries}}
	path := bundleNodesPath + "/" + url.PathEscape(node) + "?force=true&fieldManager=" + url.QueryEscape(FieldManager(node))
	if err := c.do(ctx, "PATCH", path, applyPatch, body, nil); err != nil {
		return nil, fmt.Errorf("writing upgradebundlenode %s: %w", node, err)
	}
	return entries, nil
}
