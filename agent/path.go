package agent

import (
	"context"

	"github.com/ferry-edge/ferry/cluster"
)

// A bundle whose metadata holds a path of several releases (bundle.Hop)
// is upgraded to hop by hop: the cluster API that knows how (kube's)
// takes the path one step further each time the agent asks for the
// upgrade or reads how it stands, and reports the path as one upgrade
// to the bundle's release, so that the agent's phases stay as they are.

// PathAPI is what a cluster API that takes a bundle's path has.
type PathAPI interface {
	// AdvancePath takes the path one step further (pause the pools, ask
	// the next hop once the one before is Completed, unpause the pools)
	// and says how it stands: Completed once its last hop is.
	AdvancePath(ctx context.Context, p cluster.Path) (cluster.UpgradeStatus, error)
	// PathStatus says how the path stands without taking a step.
	PathStatus(ctx context.Context, p cluster.Path) (cluster.UpgradeStatus, error)
	// PreflightPath is Preflight for every hop of the path, in order.
	PreflightPath(ctx context.Context, path []string, images []string) (cluster.Preflight, error)
}

// pathOf is r's path as the cluster API takes it; false when r's bundle
// has no path of several releases or the API cannot take one.
func (a *Agent) pathOf(r *Record) (PathAPI, cluster.Path, bool) {
	api, ok := a.deps.API.(PathAPI)
	if !ok || r == nil || r.Metadata == nil || len(r.Metadata.Path) < 2 {
		return nil, cluster.Path{}, false
	}
	p := cluster.Path{Bundle: ResourceName(r.Metadata.Version, r.Metadata.Arch), Node: a.cfg.NodeName}
	for _, h := range r.Metadata.Hops() {
		p.Hops = append(p.Hops, cluster.Upgrade{Release: h.Release, Version: h.Version, Signatures: h.ReleaseSignatures, Force: a.cfg.Cluster.ForceUnsigned})
	}
	return api, p, true
}

// startUpgrade asks the cluster for r's upgrade: its release, or the
// first step of its path.
func (a *Agent) startUpgrade(ctx context.Context, r *Record, u cluster.Upgrade) error {
	if api, p, ok := a.pathOf(r); ok {
		_, err := api.AdvancePath(ctx, p)
		return err
	}
	return a.deps.API.StartUpgrade(ctx, u)
}

// upgradeStatus reads how the upgrade of s's release stands: for a
// bundle with a path, the path's, taken one step further by the node
// whose request the cluster accepted (the one that started it: the
// stick's, or where ferry proceed ran), only read by the others, and by
// that node too once a hop failed there, until the path is resumed.
func (a *Agent) upgradeStatus(ctx context.Context, s Status) (cluster.UpgradeStatus, error) {
	for i := range s.Bundles {
		r := &s.Bundles[i]
		if r.Metadata == nil || r.Metadata.Release != s.Release {
			continue
		}
		if api, p, ok := a.pathOf(r); ok {
			if r.Upgrade != nil && !r.Upgrade.Accepted.IsZero() && r.Upgrade.Stopped == "" {
				return api.AdvancePath(ctx, p)
			}
			return api.PathStatus(ctx, p)
		}
	}
	return a.deps.API.UpgradeStatus(ctx, s.Release)
}

// preflightOf asks the cluster's preflight of r: of every hop of its path.
func (a *Agent) preflightOf(ctx context.Context, r *Record) (cluster.Preflight, error) {
	if api, p, ok := a.pathOf(r); ok {
		var versions []string
		for _, h := range p.Hops {
			versions = append(versions, h.Version)
		}
		return api.PreflightPath(ctx, versions, r.Metadata.AllImages())
	}
	return a.deps.API.Preflight(ctx, r.Metadata.Version, r.Metadata.AllImages())
}
