package agent

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/pull"
)

// Registry mode with the cluster's API: an UpgradeBundle whose
// spec.source names a release has one node pull it from the site's
// registry (pull.Puller); the others follow that pull through the peers
// as it arrives, each making the same bundle from the puller's work
// tree, and the puller's bundle reaches them through the peers too,
// approved on each by what it holds (bundle.ApprovalSource): whichever
// comes first, the digest is one.

// evClusterSources: the releases the cluster's UpgradeBundles ask for
// from the registry.
type evClusterSources struct{ sources []cluster.RegistrySource }

func (evClusterSources) isEvent() {}

// clusterSourcesSeen takes the cluster's sources: they approve the
// bundles made of them, so one waiting for approval may go on.
func (m *machine) clusterSourcesSeen(ev evClusterSources) []effect {
	m.clusterSources = nil
	for _, s := range ev.sources {
		m.clusterSources = append(m.clusterSources, bundle.ReleaseSource{Release: s.Release, Extras: s.Extras})
	}
	if r := m.active; r != nil && r.Approval == bundle.ApprovalNone && r.Phase == PhaseExtracted {
		return m.next()
	}
	return nil
}

// readSources keeps the loop's view of the cluster's sources and has
// this node pull those it is the one to pull.
func (a *Agent) readSources(ctx context.Context, api BundleAPI, last *[]cluster.RegistrySource, nodes *nodesRead) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	srcs, err := api.Sources(cctx)
	if err != nil {
		return err
	}
	if !slices.EqualFunc(srcs, *last, sameSource) {
		*last = srcs
		a.post(evClusterSources{sources: srcs})
	}
	awaiting := false
	for _, s := range srcs {
		awaiting = awaiting || !a.holdsRelease(s.Release)
	}
	a.awaitingSource.Store(awaiting)
	if len(srcs) == 0 || a.deps.Puller == nil {
		return nil
	}
	if err := nodes.refresh(cctx, api, a.resync()); err != nil {
		return err
	}
	for _, s := range srcs {
		if a.holdsRelease(s.Release) {
			a.deps.Puller.Unfollow(s.Release)
			continue
		}
		req := pull.Request{Release: s.Release, Extras: s.Extras, Bundle: s.Bundle, RateLimit: s.RateLimit, Window: s.Window, Created: s.Created}
		if puller := pullerOf(s, nodes.ready); puller != a.cfg.NodeName {
			// Followed at its peer address, once a peer reports it.
			if req.From = a.peerAddr(puller); req.From == "" {
				continue
			}
			req.FromNode = puller
		}
		if err := a.deps.Puller.Ensure(req); err != nil {
			a.log.Warn("cannot pull the release the UpgradeBundle asks for", "bundle", s.Bundle, "release", s.Release, "from", req.FromNode, "err", err)
		}
	}
	return nil
}

// peerAddr is node's peer address, "" while no peer reported it.
func (a *Agent) peerAddr(node string) string {
	if m := a.peerNodes.Load(); m != nil {
		return (*m)[node]
	}
	return ""
}

// notePeerNodes keeps each peer's address by the node it reports.
func (a *Agent) notePeerNodes(st map[string]peer.PeerStatus) {
	m := map[string]string{}
	for addr, s := range st {
		if s.Err == nil && s.Node != "" {
			m[s.Node] = addr
		}
	}
	a.peerNodes.Store(&m)
}

func sameSource(a, b cluster.RegistrySource) bool {
	return a.Bundle == b.Bundle && a.Release == b.Release && slices.Equal(a.Extras, b.Extras) &&
		a.Node == b.Node && a.RateLimit == b.RateLimit && a.Window == b.Window
}

// pullerOf is the node that pulls s: the one it names, else the first
// Ready node by name, else (no Node says it is Ready) the first by name:
// every node decides alike from the same list.
func pullerOf(s cluster.RegistrySource, ready map[string]cluster.NodeReady) string {
	if s.Node != "" {
		return s.Node
	}
	first, firstReady := "", ""
	for n, r := range ready {
		if first == "" || n < first {
			first = n
		}
		if r.Ready && (firstReady == "" || n < firstReady) {
			firstReady = n
		}
	}
	return cmp.Or(firstReady, first)
}

// holdsRelease reports whether this node has a bundle of release already,
// in whatever phase (a refused one is not pulled again by itself).
func (a *Agent) holdsRelease(release string) bool {
	for _, r := range a.snap.Load().status.Bundles {
		if r.Metadata != nil && r.Metadata.Release == release {
			return true
		}
	}
	return false
}

// pullReport is this node's part of the UpgradeBundle while it pulls
// the release it asks for: phase pulling, the pull's line as reason.
func pullReport(s Status) *bundleReport {
	p := s.Pull
	if p == nil || p.Bundle == "" || p.State == pull.StateDone {
		return nil
	}
	const phase = "pulling"
	return &bundleReport{name: p.Bundle, line: s.Line, healthy: s.Healthy,
		sum:   cluster.BundleSummary{Release: SanitizeReason(p.Release), Phase: phase},
		entry: cluster.BundleNodeEntry{Phase: phase, Reason: SanitizeReason(p.Coarse())}}
}
