package machine

import (
	"strings"

	"github.com/ferry-edge/ferry/cluster"
)

// A bundle with a path of several releases (docs/admin.md, "A path of
// several releases"): every node keeps how each hop stood at its last
// reading of ClusterVersion (Record.Path), which the summary's writer
// puts in the UpgradeBundle (status.path, hop, hops). A hop that fails
// stops the path on the node that takes its steps (UpgradeRun.Stopped):
// it takes none, whatever the cluster does next, until a person resumes
// it with ferry proceed or spec.proceed.

// pathSeen keeps r's path as ev says it, and stops the path when a hop
// failed; st is then what the node says of it: a stopped path stays
// stopped, in the words of its failure, until it is resumed or its last
// hop is Completed all the same.
func (m *Machine) pathSeen(r *Record, st *cluster.UpgradeStatus) []Effect {
	if st.Path == nil {
		return nil
	}
	var effs []Effect
	read := &PathRead{From: st.Path.From}
	for _, h := range st.Path.Hops {
		read.Hops = append(read.Hops, HopRead{State: string(h.State), Message: SanitizeReason(h.Message)})
	}
	if !samePath(r.Path, read) {
		r.Path = read
		effs = append(effs, EffSave{r})
	}
	u := r.Upgrade
	switch {
	case u == nil || u.Accepted.IsZero():
	case st.State == cluster.UpgradeRefused && u.Stopped != st.Reason:
		if u.Stopped == "" {
			m.log.Warn("a hop of the path failed: the path stops there until a person resumes it (ferry proceed, or spec.proceed)", "bundle", r.Name, "reason", st.Reason)
		}
		u.Stopped, u.StoppedAt = st.Reason, m.bundleGeneration
		effs = append(effs, EffSave{r})
	case u.Stopped != "" && st.State != cluster.UpgradeCompleted && st.State != cluster.UpgradeRefused:
		st.State, st.Reason = cluster.UpgradeRefused, u.Stopped
	}
	return effs
}

// pathStoppedMessage is what a node says of a path whose hop failed (why:
// the hop, where the path stops, the operator's words), with the two ways
// to resume it once the cause is fixed.
func pathStoppedMessage(name, why string) string {
	return why + "; ferry takes no further step: once the cause is fixed, resume the path with 'ferry proceed' on any node, or oc patch upgradebundle " + name + " --type=merge -p '{\"spec\":{\"proceed\":true}}' (false first if it is true already)"
}

// resumePath takes a stopped path on again (ferry proceed, spec.proceed):
// the path's next step is asked for as the upgrade was, and it stops
// again, saying so, if the hop still fails.
func (m *Machine) resumePath(r *Record) []Effect {
	m.log.Info("resuming the path", "phase", string(r.Phase), "bundle", r.Name, "stopped", r.Upgrade.Stopped)
	m.asking = true
	r.Upgrade = &UpgradeRun{Requested: m.Now().UTC()}
	effs := m.Move(r, r.Phase, Underway(ReasonUpgradePending, "resuming the path: asking the cluster for its next step"), r.Progress)
	return append(effs, EffAskUpgrade{r})
}

// hopHeld tells whether st is a path whose hop in progress waits for the
// administrator's word (Upgradeable=False, an admin-ack).
func hopHeld(st cluster.UpgradeStatus) bool {
	if st.Path == nil {
		return false
	}
	i := st.Path.Current()
	return i < len(st.Path.Hops) && st.Path.Hops[i].State == cluster.HopHeld
}

// pathStopped tells whether r's path stopped at a failed hop on this node.
func pathStopped(r *Record) bool {
	return r != nil && r.Upgrade != nil && r.Upgrade.Stopped != ""
}

// pathSummary is r's path as the UpgradeBundle's status says it: the
// versions from the cluster's (path), the hop in progress of how many
// (hop: 0/2 before the first is asked, 2/2 once the last is Completed),
// and each hop's state.
func pathSummary(r *Record, sum *cluster.BundleSummary) {
	md := r.Metadata
	if md == nil || len(md.Path) < 2 {
		return
	}
	hops := md.Hops()
	versions := make([]string, 0, len(hops)+1)
	read := r.Path
	if read != nil && read.From != "" {
		versions = append(versions, read.From)
	}
	current, started := len(hops), false
	for i, h := range hops {
		versions = append(versions, h.Version)
		ph := cluster.PathHop{Version: h.Version, Release: SanitizeReason(h.Release), State: string(cluster.HopPending)}
		if read != nil && i < len(read.Hops) {
			ph.State, ph.Message = read.Hops[i].State, read.Hops[i].Message
		}
		started = started || ph.State != string(cluster.HopPending)
		if ph.State != string(cluster.HopCompleted) && current == len(hops) {
			current = i
		}
		sum.Hops = append(sum.Hops, ph)
	}
	n := min(current+1, len(hops)) // the hop in progress, or next; the last once Completed
	if !started {
		n = 0
	}
	sum.Path = SanitizeReason(strings.Join(versions, " → "))
	sum.Hop = itoa(n) + "/" + itoa(len(hops))
}
