package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/kube"
)

// clusterAPI is the agent's ClusterAPI on the kube client, what the agent
// follows read from the Follower's watches: type conversions only.
type clusterAPI struct {
	*kube.Client
	f *kube.Follower
}

func (k clusterAPI) Changes() <-chan struct{} { return k.f.Changes() }

func (k clusterAPI) ApprovedDigests(ctx context.Context) ([]string, error) {
	return k.f.ApprovedDigests(ctx)
}

func (k clusterAPI) Sources(ctx context.Context) ([]agent.RegistrySource, error) {
	srcs, err := k.f.Sources(ctx)
	var out []agent.RegistrySource
	for _, s := range srcs {
		out = append(out, agent.RegistrySource{Bundle: s.Bundle, Release: s.Release, Extras: s.ExtraImages,
			Node: s.Node, RateLimit: s.RateLimit, Window: s.Window})
	}
	return out, err
}

func (k clusterAPI) StartUpgrade(ctx context.Context, u agent.Upgrade) error {
	return k.Client.StartUpgrade(ctx, kube.UpgradeRequest(u))
}

func (k clusterAPI) UpgradeStatus(ctx context.Context, release string) (agent.UpgradeStatus, error) {
	u, err := k.f.UpgradeStatus(ctx, release)
	return agent.UpgradeStatus{State: agent.UpgradeState(u.State), Message: u.Message, Reason: u.Reason}, err
}

func (k clusterAPI) NodeUpdate(ctx context.Context, node string) (agent.NodeUpdate, error) {
	st, err := k.f.MachineConfigState(ctx, node)
	return agent.NodeUpdate(st), err
}

func (k clusterAPI) Preflight(ctx context.Context, version string, images []string) (agent.Preflight, error) {
	p, err := k.Client.Preflight(ctx, kube.PreflightRequest{Version: version, Images: images})
	return agent.Preflight(p), err
}

func (k clusterAPI) UpgradeBundle(ctx context.Context, name string) (agent.BundleView, bool, error) {
	ub, ok, err := k.f.UpgradeBundle(ctx, name)
	if err != nil || !ok {
		return agent.BundleView{}, ok, err
	}
	v := agent.BundleView{UID: ub.UID, Nodes: map[string]agent.BundleNodeEntry{}, Policy: agent.BundlePolicy{
		ApprovedDigest: ub.Spec.ApprovedDigest, Schedule: ub.Spec.Schedule, Proceed: ub.Spec.Proceed, ExcludedNodes: ub.Spec.ExcludedNodes, Cleanup: ub.Spec.Cleanup}}
	if ub.Spec.NotReadyTimeout != "" {
		// The CRD's pattern admits only Go durations.
		v.Policy.NotReadyTimeout, _ = time.ParseDuration(ub.Spec.NotReadyTimeout)
	}
	for n, e := range ub.Nodes {
		v.Nodes[n] = agent.BundleNodeEntry{Phase: e.Phase, Digest: e.Digest, Reason: e.Reason, Excluded: e.Excluded}
	}
	return v, true, nil
}

func (k clusterAPI) PublishBundle(ctx context.Context, name string, s *agent.BundleSummary, node string, e agent.BundleNodeEntry) error {
	entry := kube.BundleNode{Phase: e.Phase, Digest: e.Digest, Reason: e.Reason, Excluded: e.Excluded}
	for _, c := range e.Conditions {
		bc := kube.BundleCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message}
		if !c.Since.IsZero() {
			bc.LastTransitionTime = c.Since.UTC().Format(time.RFC3339)
		}
		entry.Conditions = append(entry.Conditions, bc)
	}
	if s == nil {
		return k.Client.PublishBundleEntry(ctx, name, node, entry)
	}
	return k.Client.PublishBundleStatus(ctx, name, kube.BundleSummary(*s), node, entry)
}

func (k clusterAPI) NodeReadiness(ctx context.Context) (map[string]agent.NodeReady, error) {
	rs, err := k.Client.NodeReadiness(ctx)
	out := map[string]agent.NodeReady{}
	for n, r := range rs {
		out[n] = agent.NodeReady(r)
	}
	return out, err
}

// newClusterAPI is the Kubernetes API when a kubeconfig is configured: the
// agent's ClusterAPI, what it must warn of, and the job that follows the
// cluster's objects and keeps ferry's token fresh (nil, nil, nil without a
// kubeconfig). With the kubelet's credential, the node is the one its
// certificate names (cfg.NodeName is set to it).
func newClusterAPI(cfg *agent.Config, log *slog.Logger) (agent.ClusterAPI, []string, func(context.Context) error, error) {
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
	// Each node's writes under its own name in managedFields.
	c.FieldManager = kube.FieldManager(cfg.NodeName)
	var warnings []string
	if c.Insecure() {
		warnings = append(warnings, kube.InsecureWarning(c.Server()))
	}
	f := c.Follow(cfg.NodeName)
	run := func(ctx context.Context) error {
		done := make(chan struct{})
		go func() { defer close(done); f.Run(ctx) }()
		err := c.KeepTokenFresh(ctx)
		<-done
		return err
	}
	return clusterAPI{c, f}, warnings, run, nil
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

// printNodeAnnotations prints every Node's ferry.io annotations, as an
// administrator sees them with oc get nodes.
func printNodeAnnotations(ctx context.Context, cfg agent.Config) {
	c, err := kube.New(cfg.Cluster.Kubeconfig, nil)
	if err == nil {
		var nodes map[string]map[string]string
		if nodes, err = c.NodeAnnotations(ctx); err == nil {
			names := slices.Sorted(maps.Keys(nodes))
			fmt.Printf("\nin the cluster's API (%s):\n%-24s %-14s %-16s %-24s %s\n", c.Server(), "NODE", "PHASE", "BUNDLE", "PROGRESS", "REASON")
			for _, n := range names {
				a := nodes[n]
				fmt.Printf("%-24s %-14s %-16s %-24s %s\n", n, cmp.Or(a[agent.AnnotationPhase], "-"), cmp.Or(a[agent.AnnotationBundle], "-"),
					cmp.Or(a[agent.AnnotationProgress], "-"), a[agent.AnnotationReason])
			}
			return
		}
	}
	fmt.Printf("\nthe cluster's API cannot be read: %v\n", err)
}
