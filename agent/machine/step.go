package machine

import (
	"time"

	"github.com/ferry-edge/ferry/bundle/meta"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
)

// The machine and its transition table. step dispatches each event to
// the transitions of its family, one file each: step_device.go (sticks,
// files and probes), step_jobs.go (a job's end), step_peers.go (the peers'
// view, fetching and the gate), step_request.go (ferry load, cleanup and
// proceed), step_upgrade.go (the cluster upgrade, the hook and what
// follows), step_retain.go (the running release's kept tree),
// sources.go and resource.go (the cluster's sources, approvals and
// UpgradeBundle). Here:
// start (records from disk), next (what the active bundle needs next)
// and move, the one way a record changes phase.

// machine is the agent's state and its one transition function, step. It
// does no I/O: it returns effects, which the loop performs. Only the loop
// goroutine calls step.
type Machine struct {
	cfg       Settings
	policy    meta.Policy
	parseMeta func([]byte) (*meta.Metadata, error)
	approve   func(meta.Policy, *meta.Metadata, digest.Digest, []byte) (meta.Approval, error)
	Now       func() time.Time
	log       Logger
	hasMedia  bool
	hasLoader bool
	peersOn   bool     // a peer transport is wired
	peers     []string // the other nodes: from the config, or the API
	HasAPI    bool
	warnings  []string // Deps.Warnings: shown in every status

	// recorded are the nodes with a record (the API's, this one
	// included); unrecorded how many more the machine config operator
	// counts: nodes without ferry, which the gate waits for.
	Recorded   []string
	Unrecorded int

	Records map[string]*Record
	Active  *Record // the bundle that holds the node, nil when none
	LastBad *Record // the newest refusal or conflict, shown until a bundle succeeds
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
	Job     *Job // the running job, nil when idle
	probing map[string]bool
	view    View // the peers, as last polled
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
	// bundleGeneration is the spec's generation bundlePolicy was read at.
	bundleGeneration int64
	// clusterApproved are the cluster's UpgradeBundles' approvals
	// (spec.approvedDigest): each adds to the config's for the bundle its
	// resource is named for only (ownApproval).
	clusterApproved []cluster.Approval
	// pulled are the digests of bundles this node made from the registry
	// as asked (registry mode), approved by that request.
	pulled []string
	// clusterSources are the releases the cluster's UpgradeBundles ask
	// for from the registry: bundles of them are approved (sources.go).
	clusterSources []meta.ReleaseSource
	Excluded       map[string]string
	excludedHosts  map[string]bool
	// restoreDue is why the running release's images are to be checked
	// once the running job ends ("" when not).
	restoreDue string
}

// job is the one long task a node runs at a time.
type Job struct {
	Kind   jobKind
	ID     string
	device string   // the stick it reads, if any
	medium MediumID // kept open while it is read
}

func NewMachine(s Settings, policy meta.Policy, w Wiring) *Machine {
	return &Machine{
		cfg: s, policy: policy, parseMeta: w.ParseMetadata, approve: w.ApproveOffer, Now: w.Now, log: w.Log,
		hasMedia: w.Media, hasLoader: w.Loader, peersOn: w.Peers, peers: s.Peers,
		HasAPI: w.API, warnings: w.Warnings,
		Records: map[string]*Record{}, probing: map[string]bool{},
	}
}

// step is the transition table: one case per event.
func (m *Machine) Step(ev Event) []Effect {
	switch ev := ev.(type) {
	case EvStart:
		return m.start(ev.Records)
	case EvDevice:
		return m.device(ev.DeviceEvent)
	case EvOffer:
		return m.offer(ev)
	case EvJobDone:
		return m.jobDone(ev)
	case EvProgress:
		if r := m.Active; r != nil && r.ID == ev.ID {
			r.Progress = ev.P
		}
		return nil
	case EvView:
		return m.peersSeen(ev.View)
	case EvRequest:
		return m.requestArrived(ev)
	case EvHookDone:
		return m.hookDone(ev)
	case EvUpgradeAsked:
		return m.upgradeAsked(ev)
	case EvUpgradeSeen:
		return m.upgradeRead(ev)
	case EvNodeSeen:
		return m.nodeSeen(ev)
	case EvCluster:
		return m.clusterRead(ev)
	case EvPreflight:
		if r := m.Records[ev.ID]; r != nil {
			r.Warnings = ev.Warnings
			return []Effect{EffSave{r}}
		}
		return nil
	case EvPeerList:
		m.peers, m.Recorded, m.Unrecorded = ev.Peers, ev.Recorded, ev.Unrecorded
		if r := m.Active; r != nil && (r.Phase == PhaseLoaded || r.Phase == PhaseClusterReady) {
			return m.gate(r) // a node without ferry found, or ferry started there
		}
		return nil
	case EvRetry:
		return append(m.next(), m.restoreIfDue()...)
	case EvRuntimeCheck:
		return m.runtimeCheck(ev.Why)
	}
	panic(unknownEvent{ev})
}

// start takes the records found on disk and picks up where the last run
// stopped.
func (m *Machine) start(recs []*Record) []Effect {
	for _, r := range recs {
		m.Records[r.ID] = r
		switch {
		case r.Phase.Active():
			m.Active = r
		case r.Phase == PhaseRejected || r.Phase == PhaseConflict:
			m.LastBad = r
		case r.Phase == PhaseUpgraded && r.Retirement < RetirementDone:
			m.Active = r // its cleanup was cut short: finish it
		case r.Phase == PhaseUpgraded:
			m.done = r
			if r.Retirement != RetirementUnpinned {
				m.previous = r
			}
		}
	}
	forget := append(m.PruneRefused(), m.resumeRetained()...)
	r := m.Active
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
			effs = append(effs, EffRemove{r.Dir})
		}
		if r.Origin == OriginFile {
			// The file came as a descriptor, gone with the restart; the
			// agent never opens the caller's path itself.
			return append(effs, m.Move(r, PhaseDetected, WaitingFor(ReasonCopyInterrupted, "interrupted before the copy finished: run 'ferry load "+r.Source+"' again"), Progress{})...)
		}
		return append(effs, m.Move(r, PhaseDetected, WaitingFor(ReasonCopyInterrupted, "interrupted before the copy finished: plug the stick in again"), Progress{})...)
	case PhaseFetching, PhaseUpgraded:
	default:
		effs = append(effs, EffShare{Rec: r})
	}
	if r.Phase.Loaded() && m.hasLoader {
		effs = append(effs, EffResumeLoader{Rec: r, Keep: m.keep(r)})
	}
	return append(effs, m.next()...)
}

// next starts whatever the active bundle needs next, if nothing runs.
func (m *Machine) next() []Effect {
	r := m.Active
	if r == nil || m.Job != nil {
		return nil
	}
	switch r.Phase {
	case PhaseFetching:
		return m.fetch(r)
	case PhaseExtracted, PhaseLoading:
		if refusal := m.specRefuses(r); refusal != "" {
			why := WaitingFor(ReasonOtherBundleApproved, refusal)
			if r.Condition == why {
				return nil
			}
			m.log.Warn("not loading: the UpgradeBundle approves another bundle", "bundle", r.Name, "digest", r.Digest)
			return m.Move(r, r.Phase, why, r.Progress)
		}
		if r.Approval == meta.ApprovalNone {
			if !m.polFor(r.Metadata).Approves(r.Digest) {
				why := WaitingFor(ReasonAwaitingApproval, m.WaitingForApproval(r))
				if r.Condition == why {
					return nil
				}
				m.log.Warn("not loading: the bundle is not approved", "phase", string(r.Phase), "bundle", r.Name, "digest", r.Digest)
				return m.Move(r, r.Phase, why, r.Progress)
			}
			r.Approval = meta.ApprovalDigest
			if !m.polFor(r.Metadata).On() {
				r.Approval = meta.ApprovalOff
			}
			m.log.Info("the config now approves the bundle", "bundle", r.Name, "digest", r.Digest, "approval", r.Approval)
		}
		if why := m.peersDisagree(r); why != (Condition{}) {
			if r.Condition == why {
				return nil
			}
			m.log.Info("not loading yet", "phase", string(r.Phase), "bundle", r.Name, "reason", why.Message)
			return m.Move(r, r.Phase, why, r.Progress)
		}
		if !m.hasLoader {
			// This node only verifies, extracts and shares: approved (and
			// the peers agreeing), there is nothing more it does, and its
			// status says so rather than the wait that came before.
			if r.Condition == loadsNothing {
				return nil
			}
			m.log.Info("approved; this node loads nothing (no crio.socket)", "phase", string(r.Phase), "bundle", r.Name, "digest", r.Digest)
			return m.Move(r, r.Phase, loadsNothing, r.Progress)
		}
		effs := m.Move(r, PhaseLoading, Condition{}, Progress{Total: int64(len(r.Images())), Unit: "images"})
		m.log.Info("loading into CRI-O", "phase", string(PhaseLoading), "bundle", r.Name, "digest", r.Digest)
		return append(effs, m.startJob(EffStartJob{Kind: JobLoad, Rec: r, Keep: m.keep(r)}, "")...)
	case PhaseUpgraded:
		if r.Retirement >= RetirementStarted || !m.HasAPI {
			return m.retire(r)
		}
		return m.retireWhenDone(r) // waits for the node's next reading
	}
	return nil
}

// keep is what r's load must leave pinned: the previous bundle's images,
// the release the cluster runs until r's upgrade is done.
func (m *Machine) keep(r *Record) []string {
	if p := m.previous; p != nil && p != r && p.Metadata != nil && p.Retirement != RetirementUnpinned {
		return p.Images()
	}
	return nil
}

// hasPeers reports whether this node has peers to agree with.
func (m *Machine) hasPeers() bool { return m.peersOn && len(m.peers) > 0 }

func (m *Machine) startJob(e EffStartJob, device string) []Effect {
	m.Job = &Job{Kind: e.Kind, ID: e.Rec.ID, device: device}
	return []Effect{e}
}

// move puts r in phase p, for why, and persists it.
func (m *Machine) Move(r *Record, p Phase, why Condition, prog Progress) []Effect {
	if r.Times == nil {
		r.Times = map[Phase]time.Time{}
	}
	if r.Phase != p || r.Times[p].IsZero() {
		r.Times[p] = m.Now().UTC()
	}
	r.Phase, r.Condition, r.Progress = p, why, prog
	m.Records[r.ID] = r
	// The line of each phase passed through is told, even when the same
	// step moves on (extracted, then loading).
	return []Effect{EffSave{r}, EffAnnounce{m.report()}}
}
