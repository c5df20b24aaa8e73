package kube

import (
	"context"
	"encoding/json"
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
// write leaves out of what that node alone wrote before (a pull record's
// absence aside, below) is taken out by the API server, not left behind.
// The summary moves to whichever node applies it (force): fields of the
// same value become owned by both. Should the former writer write its
// entry alone before the new writer wrote, the summary fields it still
// owns alone go until the new writer's write (agent.summaryWriter: at
// its next reading).
//
// What a write leaves out, though, stays as another manager wrote it: the
// summary moves from node to node, and an entry written before ferry
// applied was written by a merge patch. So every field of the summary, and
// of the node's entry, is stated, an empty one as empty: the write says
// the whole of what it owns.
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
	entry := entryOf(e, now)
	if pull := entry.Pull; pull != nil {
		if err := c.applyPull(ctx, name, node, pull); err != nil {
			return err
		}
		entry.Pull = nil
	}
	status := map[string]any{}
	if sum != nil {
		status = stated(summaryOf(*sum, now), summaryZeros)
	}
	status["nodes"] = map[string]any{node: stated(entry, entryZeros)}
	if err := c.applyStatus(ctx, name, FieldManager(node), status); err != nil {
		return fmt.Errorf("writing upgradebundle %s status: %w", name, err)
	}
	return nil
}

// The fields of the summary and of an entry, each with its empty value.
var (
	summaryZeros = map[string]any{"version": "", "arch": "", "release": "", "digest": "", "size": "", "images": 0, "phase": "", "nodesReady": "",
		"approved": "", "warnings": []string{}, "behind": "", "observedGeneration": 0, "excluded": []string{},
		"path": "", "hop": "", "hops": []any{}}
	entryZeros = map[string]any{"phase": "", "digest": "", "reason": "", "message": "", "excluded": ""}
)

// stated is v's JSON fields, each of zeros' fields that v leaves out
// (omitempty) stated as its empty value.
func stated(v any, zeros map[string]any) map[string]any {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // the API's own types always marshal
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		panic(err)
	}
	for k, z := range zeros {
		if _, ok := m[k]; !ok {
			m[k] = z
		}
	}
	return m
}

// applyPull applies node's pull record as its own field manager, once
// per change in this process.
func (c *Client) applyPull(ctx context.Context, name, node string, pull *v1alpha1.PullStatus) error {
	key := name + "/" + node
	if last, ok := c.pulls.Load(key); ok && reflect.DeepEqual(last, pull) {
		return nil
	}
	status := map[string]any{"nodes": map[string]any{node: map[string]any{"pull": pull}}}
	if err := c.applyStatus(ctx, name, pullFieldManager(node), status); err != nil {
		return fmt.Errorf("writing upgradebundle %s's pull record: %w", name, err)
	}
	c.pulls.Store(key, pull)
	return nil
}

// applyStatus applies status to the UpgradeBundle name as manager,
// forcing: a node's entry is its own, and the summary moves to whichever
// node writes it now.
func (c *Client) applyStatus(ctx context.Context, name, manager string, status map[string]any) error {
	body := map[string]any{"apiVersion": v1alpha1.APIVersion, "kind": v1alpha1.Kind, "metadata": map[string]any{"name": name}, "status": status}
	path := bundlesPath + "/" + url.PathEscape(name) + "/status?force=true&fieldManager=" + url.QueryEscape(manager)
	return c.do(ctx, "PATCH", path, applyPatch, body, nil)
}

// pullFieldManager is the field manager of node's pull record.
func pullFieldManager(node string) string {
	return FieldManager("pull-" + node)
}
