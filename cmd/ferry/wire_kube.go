package main

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/kube"
)

// clusterAPI is the agent's ClusterAPI on the kube client: type
// conversions only.
type clusterAPI struct{ *kube.Client }

func (k clusterAPI) StartUpgrade(ctx context.Context, u agent.Upgrade) error {
	return k.Client.StartUpgrade(ctx, kube.UpgradeRequest(u))
}

func (k clusterAPI) UpgradeStatus(ctx context.Context, release string) (agent.UpgradeStatus, error) {
	u, err := k.Client.UpgradeStatus(ctx, release)
	return agent.UpgradeStatus{State: agent.UpgradeState(u.State), Message: u.Message, Reason: u.Reason}, err
}

func (k clusterAPI) NodeUpdate(ctx context.Context, node string) (agent.NodeUpdate, error) {
	st, err := k.Client.MachineConfigState(ctx, node)
	return agent.NodeUpdate(st), err
}

// newClusterAPI is the Kubernetes API when a kubeconfig is configured: the
// agent's ClusterAPI, what it must warn of, and the job that keeps ferry's
// token fresh (nil, nil, nil without a kubeconfig).
func newClusterAPI(cfg agent.Config, log *slog.Logger) (agent.ClusterAPI, []string, func(context.Context) error, error) {
	if cfg.Cluster.Kubeconfig == "" {
		return nil, nil, nil, nil
	}
	c, err := kube.New(cfg.Cluster.Kubeconfig, log)
	if err != nil {
		return nil, nil, nil, usageError("cluster.kubeconfig: %v", err)
	}
	var warnings []string
	if c.Insecure() {
		warnings = append(warnings, kube.InsecureWarning(c.Server()))
	}
	return clusterAPI{c}, warnings, c.KeepTokenFresh, nil
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
				fmt.Printf("%-24s %-14s %-16s %-24s %s\n", n, or(a[agent.AnnotationPhase], "-"), or(a[agent.AnnotationBundle], "-"),
					or(a[agent.AnnotationProgress], "-"), a[agent.AnnotationReason])
			}
			return
		}
	}
	fmt.Printf("\nthe cluster's API cannot be read: %v\n", err)
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
