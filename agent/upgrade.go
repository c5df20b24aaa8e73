package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
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
func (a *Agent) post(ev event) {
	select {
	case a.events <- ev:
	case <-a.life.Done():
	}
}

// askUpgrade asks the cluster for r's upgrade, with backoff, until it is
// accepted or the agent stops; each failed try is reported.
func (a *Agent) askUpgrade(ctx context.Context, r *Record) {
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
			a.post(evUpgradeAsked{id: r.ID, err: err})
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
	for {
		changes, followed := a.deps.API.Changes(), a.followed.c()
		snap := a.snap.Load()
		wait := a.resync()
		if snap.readNode {
			a.readNode(ctx, &lastNodeErr)
			wait = min(wait, readNodeEvery)
		}
		if s := snap.status; s.Release != "" && (s.Phase == string(PhaseClusterReady) || s.Phase == string(PhaseUpgrading)) {
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
				a.post(evUpgradeSeen{release: s.Release, st: st})
			}
		}
		if lastErr != "" || lastNodeErr != "" {
			wait = min(wait, 5*time.Second)
		}
		if !awaitChange(ctx, wait, changes, followed) {
			return
		}
	}
}

// readNodeEvery bounds the resync while the Node is read.
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
	a.post(evNodeSeen{st: st})
}

// Annotation keys on the node's Node object (docs/design.md, "The UpgradeBundle").
const (
	AnnotationPhase    = "ferry.io/phase"
	AnnotationBundle   = "ferry.io/bundle"
	AnnotationDigest   = "ferry.io/digest"
	AnnotationProgress = "ferry.io/progress"
	AnnotationReason   = "ferry.io/reason"
)

// annotations are the Node annotations that tell s; an empty value
// removes its key.
func annotations(s Status) map[string]string {
	out := map[string]string{
		AnnotationPhase: s.Phase, AnnotationBundle: "", AnnotationDigest: string(s.Digest),
		AnnotationProgress: "", AnnotationReason: SanitizeReason(strings.TrimPrefix(s.Message+heldBack(s.HoldingBack), " — ")),
	}
	if s.Bundle != "" {
		out[AnnotationBundle] = SanitizeReason(strings.TrimSuffix(strings.TrimPrefix(s.Bundle, "upgrade-"), ".tar"))
	}
	out[AnnotationProgress] = progressText(s)
	if out[AnnotationReason] == "" && !s.Healthy {
		out[AnnotationReason] = SanitizeReason(s.Error)
	}
	return out
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
		err := a.deps.API.Annotate(cctx, a.cfg.NodeName, want, map[string]string{LabelPhase: want[AnnotationPhase]})
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
		if k == AnnotationReason && withoutHold(v) == withoutHold(b[k]) {
			continue // pacing's hold comes and goes with the load: progress
		}
		if k != AnnotationProgress && b[k] != v {
			return false
		}
	}
	return true
}

// progressText is a node's progress in words, while it is moving: bytes
// read or fetched, images loaded, or the version operator's line.
func progressText(s Status) string {
	switch p := s.Progress; {
	case s.Phase == string(PhaseUpgrading):
		return s.ClusterMessage
	case p == nil || p.Total <= 0:
		return ""
	case s.Phase != string(PhaseDetected) && s.Phase != string(PhaseFetching) && s.Phase != string(PhaseLoading):
		return ""
	case p.Unit == "images":
		return fmt.Sprintf("%d/%d images", p.Done, p.Total)
	}
	return ofTotal(s.Progress.Done, s.Progress.Total)
}

// wantAnnotations hands the newest annotations to annotate, replacing any
// it has not taken yet.
func (a *Agent) wantAnnotations(s Status) {
	if a.annotations == nil {
		return
	}
	w := annotations(s)
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
// their records) at the peer port, for a config that names no peers:
// nodes added later are included. With them it counts the nodes the
// machine config operator counts beyond those records: ferry does not run
// there, and the gate waits for them.
func (a *Agent) findPeers(ctx context.Context, every time.Duration) {
	port := peerPort(a.cfg.Peer.Listen)
	var last evPeerList
	posted := false
	var lastCountErr string
	for {
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
			ev := evPeerList{recorded: []string{a.cfg.NodeName}, unrecorded: last.unrecorded}
			for name, ip := range nodes {
				if name != a.cfg.NodeName {
					ev.recorded = append(ev.recorded, name)
				}
				if name != a.cfg.NodeName && ip != "" {
					ev.peers = append(ev.peers, net.JoinHostPort(ip, port))
				}
			}
			slices.Sort(ev.peers)
			slices.Sort(ev.recorded)
			// This node counts as recorded before its Lease is written.
			// A count that cannot be read keeps the last one: a failing
			// read must not open the gate.
			switch {
			case cerr != nil:
			case known:
				ev.unrecorded = max(machines-len(ev.recorded), 0)
			default:
				ev.unrecorded = 0
			}
			if !slices.Equal(ev.peers, last.peers) {
				a.log.Info("peers from the cluster's API", "peers", strings.Join(ev.peers, " "))
				a.deps.Peers.SetPeers(ev.peers)
			}
			if ev.unrecorded != last.unrecorded && ev.unrecorded > 0 {
				a.log.Warn("the machine config operator counts nodes that run no ferry: the upgrade waits for them", "machines", machines, "recorded", len(ev.recorded))
			}
			if !posted || !slices.Equal(ev.peers, last.peers) || !slices.Equal(ev.recorded, last.recorded) || ev.unrecorded != last.unrecorded {
				a.post(ev)
				last, posted = ev, true
			}
		}
		select {
		case <-time.After(every):
		case <-ctx.Done():
			return
		}
	}
}

// peerPort is the port of the peer server's listen address (8090 when
// unset: every node runs the same config).
func peerPort(listen string) string {
	if _, port, err := net.SplitHostPort(listen); err == nil && port != "" {
		return port
	}
	return "8090"
}
