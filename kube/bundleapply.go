package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"time"

	"github.com/ferry-edge/ferry/api/v1alpha1"
	"github.com/ferry-edge/ferry/cluster"
)

// A node writes with server-side apply, as its own field manager
// (ferry-<node>): its entries in its own UpgradeBundleNode
// (bundlenodes.go), and, when it is the summary's writer, an
// UpgradeBundle's status. The summary moves to whichever node applies it
// (force): fields of the same value become owned by both.
//
// What a write leaves out stays as another manager wrote it: the summary
// moves from node to node. So every field of the summary is stated, an
// empty one as empty: the write says the whole of what it owns.

const applyPatch = "application/apply-patch+yaml"

// The fields of the summary, each with its empty value.
var summaryZeros = map[string]any{"version": "", "arch": "", "release": "", "digest": "", "size": "", "images": 0, "phase": "", "nodesReady": "",
	"approved": "", "warnings": []string{}, "behind": "", "observedGeneration": 0, "excluded": []string{}}

// PublishBundleSummary applies the summary to the UpgradeBundle name's
// status as node's field manager: node is the summary's writer
// (agent.summaryWriter). The nodes' entries are not in it.
func (c *Client) PublishBundleSummary(ctx context.Context, name, node string, sum cluster.BundleSummary) error {
	status := stated(summaryOf(sum, time.Now()), summaryZeros)
	body := map[string]any{"apiVersion": v1alpha1.APIVersion, "kind": v1alpha1.Kind, "metadata": map[string]any{"name": name}, "status": status}
	path := bundlesPath + "/" + url.PathEscape(name) + "/status?force=true&fieldManager=" + url.QueryEscape(FieldManager(node))
	if err := c.do(ctx, "PATCH", path, applyPatch, body, nil); err != nil {
		return fmt.Errorf("writing upgradebundle %s status: %w", name, err)
	}
	return nil
}

// PublishBundleStatus writes node's entry (PublishBundleEntry) and the
// summary (PublishBundleSummary).
func (c *Client) PublishBundleStatus(ctx context.Context, name string, sum cluster.BundleSummary, node string, entry cluster.BundleNodeEntry) error {
	if err := c.PublishBundleEntry(ctx, name, node, entry); err != nil {
		return err
	}
	return c.PublishBundleSummary(ctx, name, node, sum)
}

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
