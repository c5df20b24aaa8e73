package agent

import (
	"cmp"
	"context"
	"errors"
	"github.com/ferry-edge/ferry/agent/machine"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/cluster"
)

// The agent's side of the Kubernetes API: the calls run off the loop and
// report back with events; the Node's annotations follow the published
// status.

// post sends ev to the loop unless the loop has ended.
func (a *Agent) post(ev machine.Event) {
	select {
	case a.events <- ev:
	case <-a.life.Done():
	}
}

// askUpgrade asks the cluster for r's upgrade, with backoff, until it is
// accepted or the agent stops; each failed try is reported.
func (a *Agent) askUpgrade(ctx context.Context, r *machine.Record) {
	u := cluster.Upgrade{Release: r.Metadata.Release, Version: r.Metadata.Version, Force: a.cfg.Cluster.ForceUnsigned}
	u.Signatures = r.Metadata.ReleaseSignatures
	if len(u.Signatures) == 0 && !u.Force {
		a.log.Warn("the bundle carries no release signature: a disconnected cluster will refuse the release unless it can verify it otherwise (set cluster.force_unsigned only if you trust the bundle)", "bundle", r.Name)
	}
	a.bg.Add(1)
	go func() {
		defer a.bg.Done()
		wait := a.retryBase()
		for {
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			err := a.startUpgrade(cctx, r, u)
			cancel()
			if ctx.Err() != nil {
				return
			}
			a.post(machine.EvUpgradeAsked{ID: r.ID, Err: err})
			if err == nil {
				return
			}
			next := wait
			if errors.Is(err, cluster.ErrReleaseUnapproved) {
				// A person must act: ask at a steady pace, not a storm.
				next = approvalRetry * a.retryBase()
			}
			select {
			case <-time.After(next):
			case <-ctx.Done():
				return
			}
			wait = min(2*wait, time.Minute)
		}
	}()
}

// approvalRetry is how many retryBase (30 s by default) ferry waits
// before it asks again for a release the administrator has not approved.
const approvalRetry = 30

// followUpgrade reads the cluster's upgrade of the active bundle's
// release while it is ready, upgrading or being asked for, and the
// machine config operator's state of this node while the agent needs it
// (machine.readsNode): when the API's watches see a change, when the
// node's phase changes, at each resync (at most every readNodeEvery while
// the Node is read: the pools are not watched), and after a failure.
func (a *Agent) followUpgrade(ctx context.Context) {
	var lastErr, lastNodeErr string
	var nodeRead time.Time // zero: read it at the next round that needs it
	nodeChanges, _ := a.deps.API.(nodeChanger)
	for {
		changes, followed := a.deps.API.Changes(), a.followed.c()
		var nodeChanged <-chan struct{}
		if nodeChanges != nil {
			nodeChanged = nodeChanges.NodeChanges()
		}
		snap := a.snap.Load()
		wait := a.resync()
		if !snap.readNode {
			nodeRead = time.Time{}
		} else {
			// Only when the Node changed, or the resync is due: every
			// other node's write to what the API watches would read it
			// again, as often as the cluster has nodes.
			if nodeChanged == nil || nodeRead.IsZero() || lastNodeErr != "" || time.Since(nodeRead) >= readNodeEvery {
				a.readNode(ctx, &lastNodeErr)
				nodeRead = time.Now()
			}
			wait = min(wait, max(time.Until(nodeRead.Add(readNodeEvery)), time.Second))
		}
		if s := snap.status; s.Release != "" && (s.Phase == string(machine.PhaseClusterReady) || s.Phase == string(machine.PhaseUpgrading)) {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			st, err := a.upgradeStatus(cctx, s)
			cancel()
			if err != nil {
				if err.Error() != lastErr && ctx.Err() == nil {
					a.log.Warn("cannot read the cluster's upgrade; trying again", "err", err)
				}
				lastErr = err.Error()
			} else {
				lastErr = ""
				a.post(machine.EvUpgradeSeen{Release: s.Release, St: st})
			}
		}
		if lastErr != "" || lastNodeErr != "" {
			wait = min(wait, 5*time.Second)
		}
		if !awaitChange(ctx, wait, changes, followed) {
			return
		}
		select {
		case <-nodeChanged:
			nodeRead = time.Time{}
		default:
		}
	}
}

// nodeChanger is a ClusterAPI that tells a change of this node's own Node
// from the others' (kube.Follower.NodeChanges).
type nodeChanger interface{ NodeChanges() <-chan struct{} }

// readNodeEvery bounds the resync while the Node is read: a pool paused
// meanwhile (the pools are not watched) is seen within it.
const readNodeEvery = 30 * time.Second

// readNode reads the machine config operator's state of this node and
// posts it; a failure is logged once until it changes.
func (a *Agent) readNode(ctx context.Context, lastErr *string) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	st, err := a.deps.API.NodeUpdate(cctx, a.cfg.NodeName)
	cancel()
	if err != nil {
		if err.Error() != *lastErr && ctx.Err() == nil {
			a.log.Warn("cannot read this node's machine config state; trying again", "node", a.cfg.NodeName, "err", err)
		}
		*lastErr = err.Error()
		return
	}
	*lastErr = ""
	a.post(machine.EvNodeSeen{St: st})
}

// annotate keeps the node's annotations equal to the newest status: at
// once on a phase change, at most every progressEvery for progress alone,
// never when nothing changed; failed writes are retried with backoff.
func (a *Agent) annotate(ctx context.Context, progressEvery time.Duration) {
	var written map[string]string
	var lastWrite time.Time
	var want map[string]string
	wait := a.retryBase()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case w := <-a.annotations:
			want = w
		case <-timer.C:
		case <-ctx.Done():
			return
		}
		if want == nil || maps.Equal(want, written) {
			continue
		}
		if written != nil && onlyProgress(want, written) {
			if d := progressEvery - time.Since(lastWrite); d > 0 {
				timer.Reset(d)
				continue
			}
		}
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := a.deps.API.Annotate(cctx, a.cfg.NodeName, want, map[string]string{LabelPhase: want[machine.AnnotationPhase]})
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if wait == a.retryBase() {
				a.log.Warn("cannot annotate this node's Node object; retrying", "node", a.cfg.NodeName, "err", err)
			}
			timer.Reset(wait)
			wait = min(2*wait, time.Minute)
			continue
		}
		wait = a.retryBase()
		written, lastWrite = want, time.Now()
	}
}

// retryBase is the first wait before the cluster's API is tried again.
func (a *Agent) retryBase() time.Duration { return cmp.Or(a.deps.RetryBase, time.Second) }

func onlyProgress(a, b map[string]string) bool {
	for k, v := range a {
		if k == machine.AnnotationReason && withoutHold(v) == withoutHold(b[k]) {
			continue // pacing's hold comes and goes with the load: progress
		}
		if k != machine.AnnotationProgress && b[k] != v {
			return false
		}
	}
	return true
}

// wantAnnotations hands the newest annotations to annotate, replacing any
// it has not taken yet.
func (a *Agent) wantAnnotations(s machine.Status) {
	if a.annotations == nil {
		return
	}
	w := machine.Annotations(s)
	for {
		select {
		case a.annotations <- w:
			return
		default:
		}
		select {
		case <-a.annotations:
		default:
		}
	}
}

// findPeers keeps the peer list equal to the other nodes' addresses (from
// their records, as the API's copy changes) at the peer port, for a config that names no peers:
// nodes added later are included. With them it counts the nodes the
// machine config operator counts beyond those records: ferry does not run
// there, and the gate waits for them.
func (a *Agent) findPeers(ctx context.Context, every time.Duration) {
	port := peerPort(a.cfg.Peer.Listen)
	var last machine.EvPeerList
	posted := false
	var lastCountErr string
	for {
		// Taken before reading: a record written meanwhile wakes the next.
		changes := a.deps.API.Changes()
		ran := time.Now()
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		nodes, err := a.deps.API.NodeAddresses(cctx)
		machines, known, cerr := 0, false, error(nil)
		if err == nil {
			machines, known, cerr = a.deps.API.MachineCount(cctx)
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			a.log.Warn("cannot list the cluster's nodes for peers; trying again", "err", err)
		}
		if cerr != nil && cerr.Error() != lastCountErr && ctx.Err() == nil {
			a.log.Warn("cannot read the machine config operator's count of nodes; trying again", "err", cerr)
		}
		if cerr == nil {
			lastCountErr = ""
		} else {
			lastCountErr = cerr.Error()
		}
		if err == nil {
			ev := machine.EvPeerList{Recorded: []string{a.cfg.NodeName}, Unrecorded: last.Unrecorded}
			for name, ip := range nodes {
				if name != a.cfg.NodeName {
					ev.Recorded = append(ev.Recorded, name)
				}
				if name != a.cfg.NodeName && ip != "" {
					ev.Peers = append(ev.Peers, net.JoinHostPort(ip, port))
				}
			}
			slices.Sort(ev.Peers)
			slices.Sort(ev.Recorded)
			// This node counts as recorded before its Lease is written.
			// A count that cannot be read keeps the last one: a failing
			// read must not open the gate.
			switch {
			case cerr != nil:
			case known:
				ev.Unrecorded = max(machines-len(ev.Recorded), 0)
			default:
				ev.Unrecorded = 0
			}
			if !slices.Equal(ev.Peers, last.Peers) {
				a.log.Info("peers from the cluster's API", "peers", strings.Join(ev.Peers, " "))
				a.deps.Peers.SetPeers(ev.Peers)
			}
			if ev.Unrecorded != last.Unrecorded && ev.Unrecorded > 0 {
				a.log.Warn("the machine config operator counts nodes that run no ferry: the upgrade waits for them", "machines", machines, "recorded", len(ev.Recorded))
			}
			if !posted || !slices.Equal(ev.Peers, last.Peers) || !slices.Equal(ev.Recorded, last.Recorded) || ev.Unrecorded != last.Unrecorded {
				a.post(ev)
				last, posted = ev, true
			}
		}
		// Again when the API's copy changes (a node's record written: the
		// records are read from the copy, no request), at most every
		// findPeersMin, and every `every` at least.
		select {
		case <-changes:
		case <-time.After(every):
		case <-ctx.Done():
			return
		}
		select {
		case <-time.After(time.Until(ran.Add(findPeersMin))):
		case <-ctx.Done():
			return
		}
	}
}

// findPeersMin bounds how often findPeers reads the records again: every
// change of what the API's watches hold wakes it (a node that starts
// beside the others learns of them as their records come, not 30 s
// later), and at every node's write it would read them all.
const findPeersMin = time.Second

// peerPort is the port of the peer server's listen address (8090 when
// unset: every node runs the same config).
func peerPort(listen string) string {
	if _, port, err := net.SplitHostPort(listen); err == nil && port != "" {
		return port
	}
	return "8090"
}
