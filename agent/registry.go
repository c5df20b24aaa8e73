package agent

import (
	"cmp"
	"context"
	"errors"
	"github.com/ferry-edge/ferry/agent/machine"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/peer"
	"github.com/ferry-edge/ferry/pull/pullspec"
)

// Registry mode with the cluster's API: an UpgradeBundle whose
// spec.source names a release has one node pull it from the site's
// registry (pull.Puller); the others follow that pull through the peers
// as it arrives, each making the same bundle from the puller's work
// tree, and the puller's bundle reaches them through the peers too,
// approved on each by what it holds (bundle.ApprovalSource): whichever
// comes first, the digest is one.

// Every claim a node acts on is bound to the identity that made it: the
// puller is the node the cluster's API names (pullerOf), followed at the
// peer address whose TLS certificate names that node (notePeerNodes); the
// bundle of its pull taken from the peers is only the one it published
// in its own entry of the UpgradeBundle, which only its credential writes
// (cluster.PullRecord), and an extra given by tag is the digest it
// published there. With the shared token nothing binds a peer to a node:
// registry mode then does not run (ErrSourceNeedsNodeIdentity).

// ErrSourceNeedsNodeIdentity is registry mode on the peers' shared token.
var ErrSourceNeedsNodeIdentity = errors.New(`registry mode (an UpgradeBundle's spec.source) needs peer.identity = "node": ` +
	`with the shared token any machine that holds it can say it is the pulling node; ` +
	`set peer.identity = "node" with cluster.kubeconfig the kubelet's (/var/lib/kubelet/kubeconfig) on every node`)

// readSources keeps the loop's view of the cluster's sources and has
// this node pull those it is the one to pull.
func (a *Agent) readSources(ctx context.Context, api BundleAPI, last *[]cluster.RegistrySource, nodes *nodesRead, read *machine.EvCluster) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	srcs, err := api.Sources(cctx)
	if err != nil {
		return err
	}
	if len(srcs) > 0 && !a.cfg.Peer.NodeIdentity() {
		if !slices.EqualFunc(srcs, *last, sameSource) {
			a.log.Error("the UpgradeBundles' sources are not pulled, followed or approved", "bundle", srcs[0].Bundle, "err", ErrSourceNeedsNodeIdentity)
		}
		*last = srcs
		a.postSources(read, nil)
		return nil
	}
	if len(srcs) > 0 {
		if err := nodes.refresh(cctx, api); err != nil {
			return err
		}
	}
	*last = srcs
	a.followPuller(api, srcs, nodes.ready)
	var approved []bundle.ReleaseSource
	published := map[string]*cluster.PullRecord{} // by bundle: its puller's record
	for _, s := range srcs {
		rs := bundle.ReleaseSource{Release: s.Release, Extras: s.Extras}
		rec, err := a.pullRecord(cctx, api, s, pullerOf(s, nodes.ready))
		if err != nil {
			return err
		}
		if rec != nil && rec.Release == s.Release {
			rs.Digest, rs.Resolved = rec.Digest, rec.Extras
			published[s.Bundle] = rec
		}
		approved = append(approved, rs)
	}
	a.postSources(read, approved)
	awaiting := false
	for _, s := range srcs {
		awaiting = awaiting || !a.holdsRelease(s.Release)
	}
	a.awaitingSource.Store(awaiting)
	if len(srcs) == 0 || a.deps.Puller == nil {
		return nil
	}
	for _, s := range srcs {
		if a.holdsRelease(s.Release) {
			a.deps.Puller.Unfollow(s.Release)
			continue
		}
		req := pullspec.Request{Release: s.Release, Extras: s.Extras, Bundle: s.Bundle, RateLimit: s.RateLimit, Window: s.Window, Created: s.Created}
		if puller := pullerOf(s, nodes.ready); puller != a.cfg.NodeName {
			// Followed once it published what its tags resolved to, at
			// the peer address whose certificate names it.
			pins, ok := pinsOf(s, published[s.Bundle])
			if !ok {
				continue
			}
			if req.From = a.peerAddr(puller); req.From == "" {
				continue
			}
			req.FromNode, req.Pins = puller, pins
		}
		if err := a.deps.Puller.Ensure(req); err != nil {
			a.log.Warn("cannot pull the release the UpgradeBundle asks for", "bundle", s.Bundle, "release", s.Release, "from", req.FromNode, "err", err)
		}
	}
	return nil
}

// pullerFollower is a cluster API that can watch the pulling node's
// record (kube.Follower), so that its pull wakes this node as it starts.
type pullerFollower interface{ FollowPuller(node string) }

// followPuller watches the puller of the first release this node does
// not hold yet, or none.
func (a *Agent) followPuller(api BundleAPI, srcs []cluster.RegistrySource, ready map[string]cluster.NodeReady) {
	pf, ok := api.(pullerFollower)
	if !ok {
		return
	}
	puller := ""
	for _, s := range srcs {
		if !a.holdsRelease(s.Release) {
			puller = pullerOf(s, ready)
			break
		}
	}
	pf.FollowPuller(puller)
}

// postSources puts the sources as they approve into the reading for the
// loop, when they changed.
func (a *Agent) postSources(read *machine.EvCluster, srcs []bundle.ReleaseSource) {
	old := a.postedSources.Load()
	if old == nil && len(srcs) == 0 || old != nil && reflect.DeepEqual(*old, srcs) {
		return
	}
	a.postedSources.Store(&srcs)
	read.Sources = &machine.SourcesRead{Sources: srcs}
}

// pullRecord is what puller published of its pull of s: read from its
// UpgradeBundleNode until it names the bundle made, which is final.
func (a *Agent) pullRecord(ctx context.Context, api BundleAPI, s cluster.RegistrySource, puller string) (*cluster.PullRecord, error) {
	key := s.Bundle + "/" + puller
	if rec := a.madePulls[key]; rec != nil && rec.Release == s.Release {
		return rec, nil
	}
	rec, err := api.PullRecord(ctx, s.Bundle, puller)
	if err == nil && rec != nil && rec.Digest != "" {
		if a.madePulls == nil {
			a.madePulls = map[string]*cluster.PullRecord{}
		}
		a.madePulls[key] = rec
	}
	return rec, err
}

// pinsOf are the digests the puller published for s's extras given by
// tag; false while one of them is not published yet.
func pinsOf(s cluster.RegistrySource, rec *cluster.PullRecord) (map[string]digest.Digest, bool) {
	var pins map[string]digest.Digest
	for _, e := range s.Extras {
		if strings.Contains(e, "@") {
			continue
		}
		if rec == nil || rec.Extras[e] == "" {
			return nil, false
		}
		if pins == nil {
			pins = map[string]digest.Digest{}
		}
		pins[e] = rec.Extras[e]
	}
	return pins, true
}

// peerAddr is node's peer address, "" while no peer's certificate
// named it.
func (a *Agent) peerAddr(node string) string {
	if m := a.peerNodes.Load(); m != nil {
		return (*m)[node]
	}
	return ""
}

// notePeerNodes keeps each peer's address by the node its certificate
// names (peer.PeerStatus.Verified), never by the node it says it is:
// over the token there is none.
func (a *Agent) notePeerNodes(st map[string]peer.PeerStatus) {
	m := map[string]string{}
	for addr, s := range st {
		if s.Err == nil && s.Verified != "" {
			m[s.Verified] = addr
		}
	}
	a.peerNodes.Store(&m)
}

func sameSource(a, b cluster.RegistrySource) bool {
	return a.Bundle == b.Bundle && a.Release == b.Release && slices.Equal(a.Extras, b.Extras) &&
		a.Node == b.Node && a.RateLimit == b.RateLimit && a.Window == b.Window
}

// withPullRecord is rep with this node's pull record in its entry, when
// this node pulls rep's UpgradeBundle's source itself: what the others
// bind its pull to.
func withPullRecord(rep *machine.BundleReport, p *pullspec.Status) *machine.BundleReport {
	if rep == nil || p == nil || p.From != "" || p.Bundle == "" || p.Bundle != rep.Name || len(p.Extras) == 0 && p.Digest == "" {
		return rep
	}
	out := *rep
	out.Entry.Pull = &cluster.PullRecord{Release: p.Release, Digest: p.Digest, Extras: p.Extras}
	return &out
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
// the release it asks for: phase pulling, the pull's state as reason and
// its line as message.
func pullReport(s machine.Status) *machine.BundleReport {
	p := s.Pull
	if p == nil || p.Bundle == "" || p.State == pullspec.StateDone {
		return nil
	}
	const phase = "pulling"
	return &machine.BundleReport{Name: p.Bundle, Line: s.Line, Healthy: s.Healthy,
		Sum:   cluster.BundleSummary{Release: machine.SanitizeReason(p.Release), Phase: phase},
		Entry: cluster.BundleNodeEntry{Phase: phase, Reason: machine.PullReasons[p.State], Message: machine.SanitizeReason(p.Coarse())}}
}
