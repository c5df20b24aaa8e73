package kube

import (
	"context"
	"fmt"
	"net/url"
	"reflect"
	"time"

	"github.com/ferry-edge/ferry/api/v1alpha1"
	"github.com/ferry-edge/ferry/cluster"
)

// A node writes its part of an UpgradeBundle's status with server-side
// apply, as its own field manager (ferry-<node>): status.nodes is a
// granular map, so each node owns its entry and nothing else, and what a
// write leaves out of what that node wrote before (a reason from an
// earlier phase, the summary it no longer writes) is taken out by the API
// server, not left behind.
//
// The pulling node's record of its pull (registry mode) is the one part
// that stays once written though later writes leave it out: the others
// bind the pull to it after the pull too. It is applied as a field
// manager of its own (ferry-pull-<node>), which later entry writes do
// not touch.

const applyPatch = "application/apply-patch+yaml"

// applyBundleStatus applies node's entry, and the summary when sum is not
// nil, to the UpgradeBundle name's status.
func (c *Client) applyBundleStatus(ctx context.Context, name string, sum *cluster.BundleSummary, node string, e cluster.BundleNodeEntry) error {
	now := time.Now()
	var status v1alpha1.UpgradeBundleStatus
	if sum != nil {
		status = summaryOf(*sum, now)
	}
	entry := entryOf(e, now)
	if pull := entry.Pull; pull != nil {
		if err := c.applyPull(ctx, name, node, pull); err != nil {
			return err
		}
		entry.Pull = nil
	}
	status.Nodes = map[string]v1alpha1.NodeStatus{node: entry}
	if err := c.applyStatus(ctx, name, FieldManager(node), status); err != nil {
		return fmt.Errorf("writing upgradebundle %s status: %w", name, err)
	}
	return nil
}

// applyPull applies node's pull record as its own field manager, once
// per change in this process.
func (c *Client) applyPull(ctx context.Context, name, node string, pull *v1alpha1.PullStatus) error {
	key := name + "/" + node
	if last, ok := c.pulls.Load(key); ok && reflect.DeepEqual(last, pull) {
		return nil
	}
	status := v1alpha1.UpgradeBundleStatus{Nodes: map[string]v1alpha1.NodeStatus{node: {Pull: pull}}}
	if err := c.applyStatus(ctx, name, pullFieldManager(node), status); err != nil {
		return fmt.Errorf("writing upgradebundle %s's pull record: %w", name, err)
	}
	c.pulls.Store(key, pull)
	return nil
}

// applyStatus applies status to the UpgradeBundle name as manager,
// forcing: a node's entry is its own, and the summary moves to whichever
// node writes it now.
func (c *Client) applyStatus(ctx context.Context, name, manager string, status v1alpha1.UpgradeBundleStatus) error {
	body := map[string]any{"apiVersion": v1alpha1.APIVersion, "kind": v1alpha1.Kind, "metadata": map[string]any{"name": name}, "status": status}
	path := bundlesPath + "/" + url.PathEscape(name) + "/status?force=true&fieldManager=" + url.QueryEscape(manager)
	return c.do(ctx, "PATCH", path, applyPatch, body, nil)
}

// pullFieldManager is the field manager of node's pull record.
func pullFieldManager(node string) string {
	return FieldManager("pull-" + node)
}
