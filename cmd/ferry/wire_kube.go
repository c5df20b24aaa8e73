package main

import (
	"context"
	"log/slog"

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

// newClusterAPI is the Kubernetes API when a kubeconfig is configured.
func newClusterAPI(cfg agent.Config, log *slog.Logger) (agent.ClusterAPI, error) {
	if cfg.Cluster.Kubeconfig == "" {
		return nil, nil
	}
	c, err := kube.New(cfg.Cluster.Kubeconfig, log)
	if err != nil {
		return nil, usageError("cluster.kubeconfig: %v", err)
	}
	return clusterAPI{c}, nil
}
