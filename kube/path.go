package kube

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/hop"
)

// PausedForAnnotation marks a MachineConfigPool ferry paused for a path:
// its value is the path's last release's approval key (sha256-<hex>).
// Only pools so marked are unpaused at the path's end; a pool the
// administrator paused stays as it is.
const PausedForAnnotation = "ferry.io/paused-for"

// maxPathSteps bounds what one AdvancePath does (pause, then ask).
const maxPathSteps = 3

// AdvancePath takes a bundle's path one step further, as hop.Next says
// from ClusterVersion and the pools read afresh, and says how the path
// stands, as UpgradeStatus does for one release: Completed once the last
// hop is Completed and the pools ferry paused are unpaused; Refused when
// a hop is refused (the path stops there, and says so); Pending while a
// hop waits for the administrator (Upgradeable=False, an admin-ack).
// The node that started the path calls it (the others read PathStatus);
// each step is one the cluster takes once (a pool already paused, a
// desiredUpdate already set, are left), and a hop is asked only when
// ClusterVersion, read just before, says every hop before it is
// Completed and none after it asked.
func (c *Client) AdvancePath(ctx context.Context, p cluster.Path) (cluster.UpgradeStatus, error) {
	return c.path(ctx, p, true)
}

// PathStatus is how a path stands, as AdvancePath says it, without taking
// a step: for the nodes that follow a path another node started (and for
// every node before the upgrade is asked for: a node ready first must not
// start it). Nothing asked yet is UpgradeNotAsked; between hops, Running.
func (c *Client) PathStatus(ctx context.Context, p cluster.Path) (cluster.UpgradeStatus, error) {
	return c.path(ctx, p, false)
}

func (c *Client) path(ctx context.Context, p cluster.Path, act bool) (cluster.UpgradeStatus, error) {
	if len(p.Hops) == 0 {
		return cluster.UpgradeStatus{}, fmt.Errorf("a path of no hop")
	}
	key, _ := cluster.ApprovalKey(p.Hops[len(p.Hops)-1].Release)
	var st cluster.UpgradeStatus
	for range maxPathSteps {
		cv, err := c.clusterVersion(ctx)
		if err != nil {
			return st, fmt.Errorf("reading clusterversion/version: %w", err)
		}
		pools, err := c.pools(ctx)
		if err != nil {
			return st, err
		}
		s := pathState(cv, p, pools, key)
		if s.Pause && !c.pausesPools(ctx, p.Bundle) {
			s.Pause = false
		}
		a := hop.Next(s)
		what := s.Describe(a)
		progress := progressOf(cv, p, s, a)
		// A hop next to be asked waits for the administrator's word
		// (Upgradeable=False, an admin-ack) on every node alike; the
		// first hop's was the preflight's, before anything moved.
		var held string
		if a.Do == hop.AskHop && (act || a.Hop > 0 || s.Paused) {
			if held, err = c.heldHop(ctx, cv, s, a, p); err != nil {
				return st, err
			}
			if held != "" {
				progress.Hops[a.Hop] = cluster.HopProgress{State: cluster.HopHeld, Message: held}
			}
		}
		if !act {
			switch {
			case a.Do == hop.PausePools || a.Do == hop.AskHop && a.Hop == 0 && !s.Paused:
				return cluster.UpgradeStatus{State: cluster.UpgradeNotAsked, Path: progress}, nil
			case held != "":
				return cluster.UpgradeStatus{State: cluster.UpgradePending, Message: what, Reason: held, Path: progress}, nil
			case a.Do == hop.AskHop && a.Hop == 0:
				return cluster.UpgradeStatus{State: cluster.UpgradePending, Message: what, Reason: what, Path: progress}, nil
			case a.Do == hop.AskHop || a.Do == hop.UnpausePools:
				return cluster.UpgradeStatus{State: cluster.UpgradeRunning, Message: what, Reason: what, Path: progress}, nil
			}
		}
		switch a.Do {
		case hop.PausePools:
			if err := c.setPaused(ctx, pools, key, true); err != nil {
				return st, err
			}
			c.pathEvent(ctx, p, "PathPoolsPaused", what)
			continue
		case hop.AskHop:
			u := p.Hops[a.Hop]
			if held != "" {
				// The administrator's word is awaited: asked again at
				// the next change, the hop goes on once given.
				c.pathEventOnce(ctx, p, "PathHopHeld", held)
				return cluster.UpgradeStatus{State: cluster.UpgradePending, Message: what, Reason: held, Path: progress}, nil
			}
			if err := c.StartUpgrade(ctx, u); err != nil {
				return st, fmt.Errorf("hop %d of %d (%s): %w", a.Hop+1, len(p.Hops), u.Version, err)
			}
			c.forgetPathEvents(p.Bundle) // a hold or failure after this ask is news again
			if a.Hop > 0 {
				c.pathEvent(ctx, p, "PathHopCompleted", hopCompleted(s, a.Hop-1))
			}
			c.pathEvent(ctx, p, "PathHopAsked", what)
			progress.Hops[a.Hop].State = cluster.HopAsked
			return cluster.UpgradeStatus{State: cluster.UpgradePending, Message: what, Path: progress}, nil
		case hop.WaitHop:
			one := upgradeOf(cv, p.Hops[a.Hop].Release)
			// The hop in progress, in each node's condition (and so its
			// entry in the UpgradeBundle), with the operator's words.
			one.Reason = strings.TrimSuffix(what+"; "+one.Reason, "; ")
			if one.State == cluster.UpgradeCompleted || one.State == cluster.UpgradeNotAsked {
				one.State = cluster.UpgradePending
			}
			if a.Hop > 0 {
				one.State = cluster.UpgradeRunning // the cluster has moved: the path is underway
			}
			one.Path = progress
			return one, nil
		case hop.UnpausePools:
			if err := c.setPaused(ctx, pools, key, false); err != nil {
				return st, err
			}
			c.pathEvent(ctx, p, "PathPoolsUnpaused", what)
			continue
		case hop.Done:
			if act {
				c.pathEventOnce(ctx, p, "PathHopCompleted", hopCompleted(s, a.Hop))
			}
			return cluster.UpgradeStatus{State: cluster.UpgradeCompleted, Message: what, Path: progress}, nil
		case hop.Failed:
			one := upgradeOf(cv, p.Hops[a.Hop].Release)
			why := strings.TrimSuffix(what+": "+one.Reason, ": ")
			progress.Hops[a.Hop].Message = why
			if act {
				c.pathEventOnce(ctx, p, "PathHopFailed", why)
			}
			return cluster.UpgradeStatus{State: cluster.UpgradeRefused, Message: one.Message, Reason: why, Path: progress}, nil
		}
	}
	return cluster.UpgradeStatus{State: cluster.UpgradePending, Message: "the path is being started"}, nil
}

// hopCompleted says hop i is done, as its Event says it.
func hopCompleted(s hop.State, i int) string {
	return fmt.Sprintf("hop %d of %d: the cluster is at %s (Completed)", i+1, len(s.Versions), s.Versions[i])
}

// heldHop is why the hop a asks for waits for the administrator ("" when
// it does not): the version operator's rules for it from the version the
// cluster reached (Upgradeable=False, an admin gate not acknowledged), in
// its words, with the command that gives the word.
func (c *Client) heldHop(ctx context.Context, cv *clusterVersion, s hop.State, a hop.Action, p cluster.Path) (string, error) {
	var pf cluster.Preflight
	pf.Current = at(s, a.Hop)
	if err := c.checkVersion(ctx, &pf, cv, p.Hops[a.Hop].Version); err != nil {
		return "", err
	}
	if len(pf.Refusals) == 0 {
		return "", nil
	}
	return fmt.Sprintf("hop %d of %d (%s) waits: %s", a.Hop+1, len(p.Hops), p.Hops[a.Hop].Version, strings.Join(pf.Refusals, "; ")), nil
}

// progressOf is each hop's state as ClusterVersion says it: the UpgradeBundle's
// status.hops.
func progressOf(cv *clusterVersion, p cluster.Path, s hop.State, a hop.Action) *cluster.PathProgress {
	out := &cluster.PathProgress{From: s.From}
	for _, u := range p.Hops {
		var h cluster.HopState
		switch upgradeOf(cv, u.Release).State {
		case cluster.UpgradeCompleted:
			h = cluster.HopCompleted
		case cluster.UpgradeRunning:
			h = cluster.HopUpgrading
		case cluster.UpgradePending:
			h = cluster.HopAsked
		case cluster.UpgradeRefused:
			h = cluster.HopFailed
		default:
			h = cluster.HopPending
		}
		out.Hops = append(out.Hops, cluster.HopProgress{State: h})
	}
	if a.Do == hop.Failed {
		out.Hops[a.Hop].State = cluster.HopFailed // passed by someone else, too
	}
	return out
}

// at is the version the cluster is at before hop i.
func at(s hop.State, i int) string {
	if i > 0 {
		return s.Versions[i-1]
	}
	return s.From
}

// pathState reads how p stands from ClusterVersion and the pools.
func pathState(cv *clusterVersion, p cluster.Path, pools []pool, key string) hop.State {
	var s hop.State
	for _, u := range p.Hops {
		s.Versions = append(s.Versions, u.Version)
		var h hop.HopState
		switch upgradeOf(cv, u.Release).State {
		case cluster.UpgradeCompleted:
			h = hop.Completed
		case cluster.UpgradeRefused:
			h = hop.Refused
		case cluster.UpgradePending, cluster.UpgradeRunning:
			h = hop.Asked
		}
		s.Hops = append(s.Hops, h)
	}
	// The cluster's version before the path: its newest Completed
	// release that is not a hop.
	for _, h := range cv.Status.History {
		if h.State == "Completed" && !slices.ContainsFunc(p.Hops, func(u cluster.Upgrade) bool { return sameRelease(u.Release, h.Image) }) {
			s.From = h.Version
			break
		}
	}
	s.Pause = hop.MinorPath(s.From, s.Versions) && slices.ContainsFunc(pools, func(pl pool) bool { return pl.Metadata.Name != "master" })
	s.Paused = slices.ContainsFunc(pools, func(pl pool) bool { return pl.Metadata.Annotations[PausedForAnnotation] == key })
	return s
}

// pausesPools is the administrator's choice for the path (the
// UpgradeBundle's spec.pausePools, true unless set false).
func (c *Client) pausesPools(ctx context.Context, bundle string) bool {
	if bundle == "" {
		return true
	}
	v, found, err := c.UpgradeBundle(ctx, bundle)
	return err != nil || !found || !v.Policy.KeepPools
}

// setPaused pauses every non-master pool not paused yet, marking it as
// paused for the path (pause), or unpauses those so marked.
func (c *Client) setPaused(ctx context.Context, pools []pool, key string, pause bool) error {
	for _, pl := range pools {
		var patch map[string]any
		switch {
		case pause && pl.Metadata.Name != "master" && !pl.Spec.Paused:
			patch = map[string]any{"metadata": map[string]any{"annotations": map[string]any{PausedForAnnotation: key}}, "spec": map[string]any{"paused": true}}
		case !pause && pl.Metadata.Annotations[PausedForAnnotation] == key:
			patch = map[string]any{"metadata": map[string]any{"annotations": map[string]any{PausedForAnnotation: nil}}, "spec": map[string]any{"paused": false}}
		default:
			continue
		}
		if err := c.do(ctx, "PATCH", poolsPath+"/"+url.PathEscape(pl.Metadata.Name), mergePatch, patch, nil); err != nil {
			return fmt.Errorf("machine config pool %s: setting spec.paused %v for the path: %w", pl.Metadata.Name, pause, err)
		}
	}
	return nil
}

// pathEvent marks a step of the path on the UpgradeBundle; an Event that
// cannot be written is not worth stopping the path for.
func (c *Client) pathEvent(ctx context.Context, p cluster.Path, reason, message string) {
	if p.Bundle == "" {
		return
	}
	typ := "Normal"
	if reason == "PathHopFailed" || reason == "PathHopHeld" {
		typ = "Warning"
	}
	uid := ""
	if v, found, err := c.UpgradeBundle(ctx, p.Bundle); err == nil && found {
		uid = v.UID
	}
	// A node records Events as itself (packaging/admission.yaml).
	c.BundleEvent(ctx, p.Bundle, uid, p.Node, typ, reason, p.Node+": "+message)
}

// forgetPathEvents forgets which of bundle's path Events were recorded.
func (c *Client) forgetPathEvents(bundle string) {
	c.pathEvents.Range(func(k, _ any) bool {
		if strings.HasPrefix(k.(string), bundle+"/") {
			c.pathEvents.Delete(k)
		}
		return true
	})
}

// pathEventOnce is pathEvent for what the path says again at each step
// while it stands (a hop held or failed, the path done): once per
// bundle, reason and message in this process, not once per reading.
func (c *Client) pathEventOnce(ctx context.Context, p cluster.Path, reason, message string) {
	if _, sent := c.pathEvents.LoadOrStore(p.Bundle+"/"+reason+"/"+message, true); !sent {
		c.pathEvent(ctx, p, reason, message)
	}
}
