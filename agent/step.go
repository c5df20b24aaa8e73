package agent

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
)

// The machine and its transition table. step dispatches each event to
// the transitions of its family, one file each: step_device.go (sticks,
// files and probes), step_jobs.go (a job's end), step_peers.go (the peers'
// view, fetching and the gate), step_request.go (ferry load, cleanup and
// proceed), step_upgrade.go (the cluster upgrade, the hook and what
// follows), step_retain.go (the running release's kept tree) and
// registry.go, approval.go (the cluster's approvals and sources). Here:
// start (records from disk), next (what the active bundle needs next)
// and move, the one way a record changes phase.

// machine is the agent's state and its one transition function, step. It
// does no I/O: it returns effects, which the loop performs. Only the loop
// goroutine calls step.
type machine struct {
	cfg       Settings
	policy    bundle.Policy
	now       func() time.Time
	log       *slog.Logger
	hasMedia  bool
	hasLoader bool
	peersOn   bool     // a peer transport is wired
	peers     []string // the other nodes: from the config, or the API
	hasAPI    bool
	warnings  []string // Deps.Warnings: shown in every status

	// recorded are the nodes with a record (the API's, this one
	// included); unrecorded how many more the machine config operator
	// counts: nodes without ferry, which the gate waits for.
	recorded   []string
	unrecorded int

	records map[string]*Record
	active  *Record // the bundle that holds the node, nil when none
	lastBad *Record // the newest refusal or conflict, shown until a bundle succeeds
	// previous is the last upgraded bundle whose pins stay until the next
	// upgrade is done; done is the last upgraded one, shown when idle.
	previous *Record
	done     *Record
	cleaned  *Record // the last bundle taken out by cleanup, for its UpgradeBundle
	asking   bool    // an ask for the cluster upgrade is under way
	// askedUnseen: this process asked for the upgrade and has not read
	// ClusterVersion naming the release since (its copy may lag the write);
	// desired is the newest reading (step_desired.go).
	askedUnseen bool
	desired     desiredRead
	// node is the machine config operator's state of this node, as last
	// read (nil: none, or none since the upgrade was done on a node the
	// MCO manages).
	node    *cluster.NodeUpdate
	job     *job // the running job, nil when idle
	probing map[string]bool
	view    view // the peers, as last polled
	backoff time.Duration
	// cleanupReply: a cleanup waits for the running job to stop.
	cleanupReply ReplyID
	cleanupAsked bool
	// notice is a passing remark for the status (e.g. a stick that holds
	// the bundle already here).
	notice string
	// bundlePolicy is the administrator's UpgradeBundle spec for the
	// bundle named bundleName (nil: none read); excluded are the nodes
	// the gate leaves out (name → why), excludedHosts their addresses.
	bundlePolicy *cluster.BundlePolicy
	bundleName   string
	// clusterApproved are the cluster's UpgradeBundles' approvals
	// (spec.approvedDigest): each adds to the config's for the bundle its
	// resource is named for only (ownApproval).
	clusterApproved []cluster.Approval
	// pulled are the digests of bundles this node made from the registry
	// as asked (registry mode), approved by that request.
	pulled []string
	// clusterSources are the releases the cluster's UpgradeBundles ask
	// for from the registry: bundles of them are approved (registry.go).
	clusterSources []bundle.ReleaseSource
	excluded       map[string]string
	excludedHosts  map[string]bool
	// restoreDue is why the running release's images are to be checked
	// once the running job ends ("" when not).
	restoreDue string
}

// job is the one long task a node runs at a time.
type job struct {
	kind   jobKind
	id     string
	device string   // the stick it reads, if any
	medium MediumID // kept open while it is read
}

func newMachine(s Settings, policy bundle.Policy, w Wiring) *machine {
	return &machine{
		cfg: s, policy: policy, now: w.Now, log: w.Log,
		hasMedia: w.Media, hasLoader: w.Loader, peersOn: w.Peers, peers: s.Peers,
		hasAPI: w.API, warnings: w.Warnings,
		records: map[string]*Record{}, probing: map[string]bool{},
	}
}

// step is the transition table: one case per event.
func (m *machine) step(ev event) []effect {
	switch ev := ev.(type) {
	case evStart:
		return m.start(ev.records)
	case evDevice:
		return m.device(ev.DeviceEvent)
	case evOffer:
		return m.offer(ev)
	case evJobDone:
		return m.jobDone(ev)
	case evProgress:
		if r := m.active; r != nil && r.ID == ev.id {
			r.Progress = ev.p
		}
		return nil
	case evView:
		return m.peersSeen(ev.view)
	case evRequest:
		return m.request(ev)
	case evHookDone:
		return m.hookDone(ev)
	case evUpgradeAsked:
		return m.upgradeAsked(ev)
	case evUpgradeSeen:
		return m.upgradeRead(ev)
	case evNodeSeen:
		return m.nodeSeen(ev)
	case evBundlePolicy:
		return m.bundlePolicySeen(ev)
	case evClusterSources:
		return m.clusterSourcesSeen(ev)
	case evClusterApprovals:
		return m.clusterApprovalsSeen(ev)
	case evPreflight:
		if r := m.records[ev.id]; r != nil {
			r.Warnings = ev.warnings
			return []effect{effSave{r}}
		}
		return nil
	case evPeerList:
		m.peers, m.recorded, m.unrecorded = ev.peers, ev.recorded, ev.unrecorded
		if r := m.active; r != nil && (r.Phase == PhaseLoaded || r.Phase == PhaseClusterReady) {
			return m.gate(r) // a node without ferry found, or ferry started there
		}
		return nil
	case evRetry:
		return append(m.next(), m.restoreIfDue()...)
	case evRuntimeCheck:
		return m.runtimeCheck(ev.why)
	}
	panic(fmt.Sprintf("agent: unknown event %T", ev))
}

// start takes the records found on disk and picks up where the last run
// stopped.
func (m *machine) start(recs []*Record) []effect {
	for _, r := range recs {
		m.records[r.ID] = r
		switch {
		case r.Phase.Active():
			m.active = r
		case r.Phase == PhaseRejected || r.Phase == PhaseConflict:
			m.lastBad = r
		case r.Phase == PhaseUpgraded && r.Retirement < RetirementDone:
			m.active = r // its cleanup was cut short: finish it
		case r.Phase == PhaseUpgraded:
			m.done = r
			if r.Retirement != RetirementUnpinned {
				m.previous = r
			}
		}
	}
	forget := append(m.pruneRefused(), m.resumeRetained()...)
	r := m.active
	if r == nil {
		return forget
	}
	m.log.Info("resuming", "phase", string(r.Phase), "bundle", r.Name, "digest", r.Digest)
	effs := forget
	switch r.Phase {
	case PhaseDetected:
		// Interrupted mid-extraction: a published dir without the
		// extracted record is not trusted either.
		if r.Dir != "" {
			effs = append(effs, effRemove{r.Dir})
		}
		if r.Origin == OriginFile {
			// The file came as a descriptor, gone with the restart; the
			// agent never opens the caller's path itself.
			return append(effs, m.move(r, PhaseDetected, waiting(ReasonCopyInterrupted, "interrupted before the copy finished: run 'ferry load "+r.Source+"' again"), Progress{})...)
		}
		return append(effs, m.move(r, PhaseDetected, waiting(ReasonCopyInterrupted, "interrupted before the copy finished: plug the stick in again"), Progress{})...)
	case PhaseFetching, PhaseUpgraded:
	default:
		effs = append(effs, effShare{rec: r})
	}
	if r.Phase.Loaded() && m.hasLoader {
		effs = append(effs, effResumeLoader{rec: r, keep: m.keep(r)})
	}
	return append(effs, m.next()...)
}

// next starts whatever the active bundle needs next, if nothing runs.
func (m *machine) next() []effect {
	r := m.active
	if r == nil || m.job != nil {
		return nil
	}
	switch r.Phase {
	case PhaseFetching:
		return m.fetch(r)
	case PhaseExtracted, PhaseLoading:
		if refusal := m.specRefuses(r); refusal != "" {
			why := waiting(ReasonOtherBundleApproved, refusal)
			if r.Condition == why {
				return nil
			}
			m.log.Warn("not loading: the UpgradeBundle approves another bundle", "bundle", r.Name, "digest", r.Digest)
			return m.move(r, r.Phase, why, r.Progress)
		}
		if r.Approval == bundle.ApprovalNone {
			if !m.polFor(r.Metadata).Approves(r.Digest) {
				why := waiting(ReasonAwaitingApproval, m.waitingForApproval(r))
				if r.Condition == why {
					return nil
				}
				m.log.Warn("not loading: the bundle is not approved", "phase", string(r.Phase), "bundle", r.Name, "digest", r.Digest)
				return m.move(r, r.Phase, why, r.Progress)
			}
			r.Approval = bundle.ApprovalDigest
			if !m.polFor(r.Metadata).On() {
				r.Approval = bundle.ApprovalOff
			}
			m.log.Info("the config now approves the bundle", "bundle", r.Name, "digest", r.Digest, "approval", r.Approval)
		}
		if why := m.peersDisagree(r); why != (Condition{}) {
			if r.Condition == why {
				return nil
			}
			m.log.Info("not loading yet", "phase", string(r.Phase), "bundle", r.Name, "reason", why.Message)
			return m.move(r, r.Phase, why, r.Progress)
		}
		if !m.hasLoader {
			// This node only verifies, extracts and shares: approved (and
			// the peers agreeing), there is nothing more it does, and its
			// status says so rather than the wait that came before.
			if r.Condition == loadsNothing {
				return nil
			}
			m.log.Info("approved; this node loads nothing (no crio.socket)", "phase", string(r.Phase), "bundle", r.Name, "digest", r.Digest)
			return m.move(r, r.Phase, loadsNothing, r.Progress)
		}
		effs := m.move(r, PhaseLoading, Condition{}, Progress{Total: int64(len(r.Images())), Unit: "images"})
		m.log.Info("loading into CRI-O", "phase", string(PhaseLoading), "bundle", r.Name, "digest", r.Digest)
		return append(effs, m.startJob(effStartJob{kind: jobLoad, rec: r, keep: m.keep(r)}, "")...)
	case PhaseUpgraded:
		if r.Retirement >= RetirementStarted || !m.hasAPI {
			return m.retire(r)
		}
		return m.retireWhenDone(r) // waits for the node's next reading
	}
	return nil
}

// keep is what r's load must leave pinned: the previous bundle's images,
// the release the cluster runs until r's upgrade is done.
func (m *machine) keep(r *Record) []string {
	if p := m.previous; p != nil && p != r && p.Metadata != nil && p.Retirement != RetirementUnpinned {
		return p.Images()
	}
	return nil
}

// hasPeers reports whether this node has peers to agree with.
func (m *machine) hasPeers() bool { return m.peersOn && len(m.peers) > 0 }

func (m *machine) startJob(e effStartJob, device string) []effect {
	m.job = &job{kind: e.kind, id: e.rec.ID, device: device}
	return []effect{e}
}

// move puts r in phase p, for why, and persists it.
func (m *machine) move(r *Record, p Phase, why Condition, prog Progress) []effect {
	if r.Times == nil {
		r.Times = map[Phase]time.Time{}
	}
	if r.Phase != p || r.Times[p].IsZero() {
		r.Times[p] = m.now().UTC()
	}
	r.Phase, r.Condition, r.Progress = p, why, prog
	m.records[r.ID] = r
	// The line of each phase passed through is told, even when the same
	// step moves on (extracted, then loading).
	return []effect{effSave{r}, effAnnounce{m.report()}}
}
