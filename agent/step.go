package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/sha256digest"
	"github.com/ferry-edge/ferry/peer"
)

// machine is the agent's state and its one transition function, step. It
// does no I/O: it returns effects, which the loop performs. Only the loop
// goroutine calls step.
type machine struct {
	cfg       Config
	policy    bundle.Policy
	now       func() time.Time
	log       *slog.Logger
	hasMedia  bool
	hasLoader bool
	peersOn   bool     // a peer transport is wired
	peers     []string // the other nodes: from the config, or the API
	hasAPI    bool
	warnings  []string // Deps.Warnings: shown in every status

	records map[string]*Record
	active  *Record // the bundle that holds the node, nil when none
	lastBad *Record // the newest refusal or conflict, shown until a bundle succeeds
	// previous is the last upgraded bundle whose pins stay until the next
	// upgrade is done; done is the last upgraded one, shown when idle.
	previous *Record
	done     *Record
	cleaned  *Record // the last bundle taken out by cleanup, for its UpgradeBundle
	asking   bool    // an ask for the cluster upgrade is under way
	// node is the machine config operator's state of this node, as last
	// read (nil: none, or none since the upgrade was done on a node the
	// MCO manages).
	node    *NodeUpdate
	job     *job // the running job, nil when idle
	probing map[string]bool
	view    view // the peers, as last polled
	backoff time.Duration
	// cleanupReply: a cleanup waits for the running job to stop.
	cleanupReply chan error
	cleanupAsked bool
	// notice is a passing remark for the status (e.g. a stick that holds
	// the bundle already here).
	notice string
	// bundlePolicy is the administrator's UpgradeBundle spec for the
	// bundle named bundleName (nil: none read); excluded are the nodes
	// the gate leaves out (name → why), excludedHosts their addresses.
	bundlePolicy *BundlePolicy
	bundleName   string
	// clusterApproved are the digests the cluster's UpgradeBundles
	// approve (spec.approvedDigest): they add to the config's.
	clusterApproved []string
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
	device string // the stick it reads, if any
	medium Medium // kept open while it is read
}

func newMachine(cfg Config, policy bundle.Policy, d Deps) *machine {
	return &machine{
		cfg: cfg, policy: policy, now: d.Now, log: d.Log,
		hasMedia: d.Media != nil, hasLoader: d.Loader != nil, peersOn: d.Peers != nil, peers: cfg.Peer.Peers,
		hasAPI: d.API != nil, warnings: d.Warnings,
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
		return m.upgradeSeen(ev)
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
		m.peers = ev.peers
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
		case r.Phase == PhaseUpgraded && !r.Retired:
			m.active = r // its cleanup was cut short: finish it
		case r.Phase == PhaseUpgraded:
			m.done = r
			if !r.Unpinned {
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
			if !m.pol().Approves(r.Digest) {
				why := waiting(ReasonAwaitingApproval, m.waitingForApproval(r))
				if r.Condition == why {
					return nil
				}
				m.log.Warn("not loading: the bundle is not approved", "phase", string(r.Phase), "bundle", r.Name, "digest", r.Digest)
				return m.move(r, r.Phase, why, r.Progress)
			}
			r.Approval = bundle.ApprovalDigest
			if !m.pol().On() {
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
		if r.Retiring || !m.hasAPI {
			return m.retire(r)
		}
		return m.retireWhenDone(r) // waits for the node's next reading
	}
	return nil
}

// keep is what r's load must leave pinned: the previous bundle's images,
// the release the cluster runs until r's upgrade is done.
func (m *machine) keep(r *Record) []string {
	if p := m.previous; p != nil && p != r && p.Metadata != nil && !p.Unpinned {
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

func (m *machine) device(ev DeviceEvent) []effect {
	if ev.Action == "remove" {
		if m.job != nil && m.job.device == ev.Device {
			m.log.Warn("the stick was pulled while it was being read", "device", ev.Device)
			return []effect{effStopJob{}}
		}
		return nil
	}
	if !m.hasMedia || m.probing[ev.Device] || m.job != nil && m.job.device == ev.Device {
		return nil // a change event for a stick already being looked at
	}
	m.probing[ev.Device] = true
	held := ""
	if m.active != nil {
		held = m.active.Digest
	}
	return []effect{effProbe{origin: OriginStick, ev: ev, held: held}}
}

// offer decides what to do with a bundle a probe found.
func (m *machine) offer(o evOffer) []effect {
	delete(m.probing, o.device)
	log := m.log.With("device", o.device)
	var effs []effect
	keep := false
	defer func() {
		if o.medium != nil && !keep {
			effs = append(effs, effCloseMedium{o.medium})
		}
	}()
	reply := func(err error) {
		if o.reply != nil {
			effs = append(effs, effReply{o.reply, err})
		}
	}
	switch {
	case o.noBundle:
		log.Debug("not an upgrade stick", "err", o.err)
		reply(o.err)
		return effs
	case o.meta == nil:
		effs = append(effs, m.reject(m.newRecord(o, nil), o.err)...)
		reply(nil)
		return effs
	}
	log = log.With("bundle", o.src.Name())
	if act := m.active; act != nil && !(m.sameBundle(o, act) && act.Phase == PhaseDetected && m.job == nil) {
		effs = append(effs, m.offerWhileHeld(o, act, log)...)
		reply(nil)
		return effs
	}
	if m.active != nil {
		log.Info("resuming the copy of this bundle")
	}
	if m.job != nil {
		reply(fmt.Errorf("busy (%s); try again when it is done", m.job.kind))
		return effs
	}
	r := m.active
	if r == nil {
		r = m.newRecord(o, o.meta)
		r.Plugged = o.origin != OriginPeer
	}
	r.Metadata = o.meta
	r.Source = o.src.Where()
	if o.origin == OriginStick {
		r.Source = o.device
	}
	r.Dir = filepath.Join(m.cfg.Paths.ExtractDir, o.meta.DirName())
	m.active = r
	m.notice = ""
	effs = append(effs, m.move(r, PhaseDetected, Condition{}, Progress{Total: o.meta.SizeBytes, Unit: "bytes"})...)
	effs = append(effs, m.extract(r, o.src, o.device, o.medium, m.pol())...)
	keep = o.medium != nil
	reply(nil)
	return effs
}

// sameBundle reports whether an offer is the bundle act holds: the same
// digest, or for sources that tell none, the same name.
func (m *machine) sameBundle(o evOffer, act *Record) bool {
	return !o.differs && (o.digest != "" && o.digest == act.Digest ||
		o.digest == "" && act.Digest == "" && act.Name == o.src.Name())
}

// offerWhileHeld answers a bundle offered while another holds the node: the
// same one is noted, a different one is a conflict record.
func (m *machine) offerWhileHeld(o evOffer, act *Record, log *slog.Logger) []effect {
	if m.sameBundle(o, act) {
		log.Info("this bundle is already here; nothing to do", "phase", string(act.Phase))
		m.notice = fmt.Sprintf("%s on %s is the bundle already held (%s)", o.src.Name(), orFile(o.device), sha256digest.Short(act.Digest))
		return nil
	}
	reason := fmt.Sprintf("%s differs from the bundle this node already holds (%s, %s): remove this stick; run 'ferry cleanup' first to replace the bundle",
		o.src.Name(), act.Name, act.Phase)
	log.Warn("conflict: a second, different bundle", "reason", reason)
	r := m.newRecord(o, o.meta)
	m.lastBad = r
	return m.move(r, PhaseConflict, fault(ReasonBundlesDiffer, reason), Progress{})
}

func orFile(device string) string {
	if device == "" {
		return "the file given"
	}
	return device
}

// extract starts verifying and extracting r from src.
func (m *machine) extract(r *Record, src bundle.Source, device string, medium Medium, pol bundle.Policy) []effect {
	m.log.Info("verifying and extracting", "phase", string(PhaseDetected), "bundle", r.Name, "device", device)
	effs := append(m.keepsDir(r.Dir), effRemove{r.Dir}) // never trust a dir whose extraction was not recorded
	effs = append(effs, m.startJob(effStartJob{kind: jobExtract, rec: r, src: src, policy: pol,
		pieces: r.Origin != OriginPeer}, device)...)
	m.job.medium = medium
	return effs
}

// newRecord makes a record with an ID it keeps for life.
func (m *machine) newRecord(o evOffer, meta *bundle.Metadata) *Record {
	base := strings.TrimSuffix(strings.TrimPrefix(o.src.Name(), "upgrade-"), ".tar")
	if meta != nil {
		base = meta.DirName()
	}
	r := &Record{Digest: o.digest, Name: o.src.Name(), Metadata: meta, Origin: o.origin, Source: o.src.Where()}
	r.ID = m.newID(base)
	return r
}

func (m *machine) newID(base string) string {
	id := base + "-" + m.now().UTC().Format("20060102T150405")
	for i := 2; m.records[id] != nil; i++ {
		id = base + "-" + m.now().UTC().Format("20060102T150405") + "-" + strconv.Itoa(i)
	}
	return id
}

func (m *machine) jobDone(j evJobDone) []effect {
	var effs []effect
	if m.job != nil && m.job.medium != nil {
		effs = append(effs, effCloseMedium{m.job.medium})
	}
	m.job = nil
	r := m.records[j.id]
	if j.kind == jobRestore {
		return append(effs, m.restoreDone(r, j)...)
	}
	if r == nil || r != m.active || !jobFits(j.kind, r.Phase) {
		m.log.Warn("a job's end for a bundle no longer in its phase is ignored", "job", string(j.kind), "record", j.id)
		if m.cleanupAsked {
			return append(effs, m.cleanup()...)
		}
		return effs
	}
	switch j.kind {
	case jobFetch:
		effs = append(effs, m.fetchDone(r, j)...)
	case jobExtract:
		effs = append(effs, m.extractDone(r, j)...)
	case jobLoad:
		effs = append(effs, m.loadDone(r, j)...)
	case jobCleanup:
		effs = append(effs, m.cleanupDone(r, j)...)
		return append(effs, m.restoreIfDue()...)
	case jobRetire:
		effs = append(effs, m.retireDone(r, j)...)
		return append(effs, m.restoreIfDue()...)
	}
	if m.cleanupAsked {
		return append(effs, m.cleanup()...)
	}
	return append(effs, m.restoreIfDue()...)
}

// jobFits reports whether a job of this kind runs in phase p: a job's end
// moves a bundle only from the phase the job belongs to.
func jobFits(k jobKind, p Phase) bool {
	switch k {
	case jobExtract:
		return p == PhaseDetected || p == PhaseFetching
	case jobFetch:
		return p == PhaseFetching
	case jobLoad:
		return p == PhaseLoading
	case jobRetire:
		return p == PhaseUpgraded
	}
	return p.Active() // cleanup
}

func (m *machine) fetchDone(r *Record, j evJobDone) []effect {
	switch {
	case j.stopped:
		return nil
	case j.res != nil || streamRefused(j.err):
		// Fetched and extracted in one pass (cut-through).
		return m.extractDone(r, j)
	case j.err != nil && bundle.DiskFilled(j.err):
		return m.abandon(r, j.err)
	case j.err != nil:
		reason := fmt.Sprintf("fetching from the peers failed, retrying: %v", j.err)
		m.log.Warn("fetch failed", "phase", string(PhaseFetching), "bundle", r.Name, "err", j.err)
		return append(m.move(r, PhaseFetching, retrying(ReasonFetchFailed, reason), r.Progress), effRetryIn{10 * time.Second})
	}
	// Serial mode: the whole tar is here; extract it.
	src := bundle.Source{Path: m.incomingPath(r), SHA256Path: strings.TrimSuffix(m.incomingPath(r), ".tar") + ".sha256"}
	if r.Approval == bundle.ApprovalSignature {
		src.SigPath = src.Path + ".minisig"
	}
	return m.extract(r, src, "", nil, m.extractPolicy(r))
}

// extractPolicy is the policy a bundle fetched from the peers is
// extracted under, by how its offer was approved: by this node's own
// keys, the signature is verified over the bytes; as a bundle of a
// release asked for from the registry, it is held to what the release
// names; otherwise by the digest approved before fetching.
func (m *machine) extractPolicy(r *Record) bundle.Policy {
	if r.Approval == bundle.ApprovalSignature {
		return m.pol()
	}
	pol := m.pol().PreApproved(r.Digest)
	if r.Approval == bundle.ApprovalSource {
		pol.Payload = m.pol().SourceFor(r.Metadata)
	}
	return pol
}

// streamRefused reports whether a fetch that extracted as it went ended
// in a refusal of the bundle (or no room to extract it), which is the
// extraction's end to handle. A digest mismatch is not: the bytes came
// from peers that lied, and the fetch is tried again.
func streamRefused(err error) bool {
	return err != nil && (bundle.IsRefusal(err) || errors.Is(err, bundle.ErrNoSpace)) && !errors.Is(err, bundle.ErrMismatch)
}

func (m *machine) extractDone(r *Record, j evJobDone) []effect {
	var effs []effect
	if r.Origin == OriginPeer && (j.err == nil || bundle.IsRefusal(j.err)) {
		effs = append(effs, effRemove{filepath.Dir(m.incomingPath(r))})
	}
	if j.err != nil {
		if r.Origin == OriginPeer && bundle.DiskFilled(j.err) {
			return append(effs, m.abandon(r, j.err)...)
		}
		if r.Origin == OriginPeer && errors.Is(j.err, bundle.ErrNoSpace) {
			// Not the bundle's fault: the disk filled up since the fetch
			// checked for room. Its tar is gone (above); it is fetched
			// again, after the same check, once there is room.
			reason := fmt.Sprintf("no room to extract the fetched bundle, fetching it again once there is: %v", j.err)
			m.log.Warn("no room to extract a fetched bundle", "phase", string(PhaseFetching), "bundle", r.Name, "err", j.err)
			return append(append(effs, m.move(r, PhaseFetching, retrying(ReasonNoRoomToExtract, reason), Progress{Unit: "bytes"})...), effRetryIn{10 * time.Second})
		}
		if bundle.IsRefusal(j.err) || errors.Is(j.err, ErrPreflight) {
			m.active = nil
			return append(effs, m.reject(r, j.err)...)
		}
		// A stop by the agent's own end never gets here (the loop is gone):
		// this is a pulled stick, a read error or a cleanup.
		reason := "the stick was pulled or could not be read before the copy finished: plug it in again"
		m.log.Warn("extraction interrupted", "phase", string(PhaseDetected), "bundle", r.Name, "err", j.err)
		return append(effs, m.move(r, PhaseDetected, waiting(ReasonCopyInterrupted, reason+" ("+j.err.Error()+")"), Progress{})...)
	}
	if meta := j.res.Metadata; meta != nil {
		// From here on the node acts on the metadata.json that was inside
		// the checked tar, never on the probe's earlier read of it nor on
		// a peer's description (docs/design.md, "Trust").
		if r.Metadata != nil && meta.DirName() != r.Metadata.DirName() {
			m.active = nil
			err := fmt.Errorf("%w: the metadata.json inside the checked tar (%s) is not the one read before (%s): the source changed while it was read, or a peer described it falsely; do not use it",
				bundle.ErrInvalid, meta.DirName(), r.Metadata.DirName())
			return append(append(effs, effRemove{r.Dir}), m.reject(r, err)...)
		}
		r.Metadata = meta
	}
	r.Digest, r.Approval, r.Signature = j.res.Digest, j.res.Approval, j.res.Signature
	r.DigestOnly, r.SignaturePolicy = j.res.Admission.DigestOnly, j.res.Admission.Warnings
	for _, w := range r.SignaturePolicy {
		m.log.Warn("signature policy", "bundle", r.Name, "warning", w)
	}
	var why Condition
	if r.Approval == bundle.ApprovalNone {
		why = waiting(ReasonAwaitingApproval, m.waitingForApproval(r))
	}
	effs = append(effs, m.move(r, PhaseExtracted, why, Progress{Done: j.res.TarSize, Total: j.res.TarSize, Unit: "bytes"})...)
	effs = append(effs, effShare{rec: r, pieces: j.pieces})
	m.lastBad = nil
	m.log.Info("verified and extracted: the stick can be unplugged", "phase", string(PhaseExtracted),
		"bundle", r.Name, "digest", r.Digest, "approval", j.res.Approval)
	return append(effs, m.next()...)
}

func (m *machine) loadDone(r *Record, j evJobDone) []effect {
	switch {
	case j.stopped:
		return nil
	case j.err != nil && Permanent(j.err):
		m.backoff = 0
		m.log.Error("loading failed and cannot heal by retrying", "phase", string(PhaseFailed), "bundle", r.Name, "err", j.err)
		return m.move(r, PhaseFailed, fault(ReasonLoadFailed, j.err.Error()), r.Progress)
	case j.err != nil:
		m.backoff = min(max(2*m.backoff, 5*time.Second), 5*time.Minute)
		reason := fmt.Sprintf("loading failed, retrying in %s: %v", m.backoff, j.err)
		m.log.Error("loading failed", "phase", string(PhaseLoading), "bundle", r.Name, "err", j.err)
		return append(m.move(r, PhaseLoading, retrying(ReasonLoadFailed, reason), r.Progress), effRetryIn{m.backoff})
	}
	m.backoff = 0
	effs := m.move(r, PhaseLoaded, Condition{}, r.Progress)
	m.log.Info("loaded: every image is present and pinned", "phase", string(PhaseLoaded), "bundle", r.Name, "digest", r.Digest)
	return append(effs, m.gate(r)...)
}

// abandon gives up a fetch whose bytes filled the disk (or hit their
// bound): it is not retried into the same disk, which on a node is /var,
// shared with CRI-O and etcd. What it wrote goes; a restart, once there
// is room, fetches it again.
func (m *machine) abandon(r *Record, err error) []effect {
	reason := fmt.Sprintf("abandoned: %v; free some space in %s, then restart ferry to fetch it again", err, m.cfg.Paths.ExtractDir)
	m.log.Error("fetch abandoned: the disk filled up", "phase", string(PhaseFailed), "bundle", r.Name, "err", err)
	effs := []effect{effRemove{filepath.Dir(m.incomingPath(r))}, effRemove{bundle.StagingDir(r.Dir)}, effRemove{r.Dir}}
	return append(effs, m.move(r, PhaseFailed, fault(ReasonFetchAbandoned, reason), Progress{})...)
}

func (m *machine) reject(r *Record, err error) []effect {
	reason := strings.TrimPrefix(err.Error(), "bundle "+r.Name+": ")
	m.log.Error("bundle refused", "phase", string(PhaseRejected), "bundle", r.Name, "reason", reason)
	m.lastBad = r
	return m.move(r, PhaseRejected, fault(ReasonRefused, reason), Progress{})
}

func (m *machine) request(q evRequest) []effect {
	switch q.kind {
	case reqLoad:
		if q.medium == nil {
			return []effect{effReply{q.reply, errors.New("no bundle given")}}
		}
		if m.job != nil {
			return []effect{effCloseMedium{q.medium}, effReply{q.reply, fmt.Errorf("busy (%s); try again when it is done", m.job.kind)}}
		}
		held := ""
		if m.active != nil {
			held = m.active.Digest
		}
		if q.approve != "" && !slices.Contains(m.pulled, q.approve) {
			m.pulled = append(m.pulled, q.approve)
		}
		return []effect{effProbe{origin: OriginFile, medium: q.medium, held: held, reply: q.reply}}
	case reqCleanup:
		if m.active == nil {
			return []effect{effReply{q.reply, errors.New("no bundle to clean up")}}
		}
		if r := m.active; r.Phase == PhaseUpgraded && !r.Retiring && !m.cleanupAsked && m.job == nil {
			// Upgraded, waiting for the machine config operator: the
			// technician says the node no longer needs the bundle.
			m.cleanupAsked, m.cleanupReply = true, q.reply
			m.log.Info("ferry cleanup: the bundle is no longer needed here", "bundle", r.Name, "waited", r.Condition.Message)
			return m.retireNow(r)
		}
		if m.cleanupAsked || m.active.Phase == PhaseUpgraded {
			return []effect{effReply{q.reply, errors.New("a cleanup is already under way")}}
		}
		if r := m.active; r.Phase == PhaseUpgrading && m.hasAPI {
			return []effect{effReply{q.reply, fmt.Errorf("the cluster is upgrading to %s: taking it out now would take away the images the upgrade pulls; ferry cleans up by itself once the upgrade is done", r.Name)}}
		}
		m.cleanupAsked, m.cleanupReply = true, q.reply
		if r := m.active; r.Phase.Loaded() && m.job == nil && !m.hasAPI {
			// Loaded everywhere: without the API, this is the word that
			// the upgrade is done. With it, the cluster says when it is
			// done, and a loaded bundle it never ran is unloaded.
			m.log.Info("ferry cleanup: the upgrade is done", "bundle", r.Name)
			return m.upgraded(r)
		}
		if m.job != nil {
			return []effect{effStopJob{}} // the cleanup starts when it has stopped
		}
		return m.cleanup()
	case reqProceed:
		r := m.active
		if r == nil || r.Phase != PhaseClusterReady && r.Phase != PhaseUpgrading {
			return []effect{effReply{q.reply, errors.New("the cluster is not ready: every node must be loaded with the same bundle first (see 'ferry status --cluster')")}}
		}
		effs := m.proceed(r, true)
		if len(effs) == 0 {
			return []effect{effReply{q.reply, m.nothingToProceed(r)}}
		}
		return append(effs, effReply{q.reply, nil})
	}
	return []effect{effReply{q.reply, fmt.Errorf("unknown request %q", q.kind)}}
}

// cleanup starts taking the active bundle out of CRI-O and off the disk.
func (m *machine) cleanup() []effect {
	r := m.active
	if r == nil {
		m.cleanupAsked = false
		return []effect{effReply{m.cleanupReply, errors.New("no bundle to clean up")}}
	}
	unload := m.hasLoader && r.Metadata != nil && r.Phase != PhaseDetected
	return m.startJob(effStartJob{kind: jobCleanup, rec: r, unload: unload}, "")
}

func (m *machine) cleanupDone(r *Record, j evJobDone) []effect {
	reply := m.cleanupReply
	m.cleanupAsked, m.cleanupReply = false, nil
	if j.err != nil {
		return []effect{effReply{reply, fmt.Errorf("cleanup of %s: %w", r.Name, j.err)}}
	}
	effs := m.move(r, PhaseCleaned, Condition{}, Progress{})
	m.active, m.cleaned = nil, r
	m.log.Info("cleaned up", "phase", string(PhaseCleaned), "bundle", r.Name, "digest", r.Digest)
	return append(effs, effReply{reply, nil})
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

// incomingPath is where a fetched tar lands, under its own name so that
// messages about it read as they would for a stick.
func (m *machine) incomingPath(r *Record) string {
	return filepath.Join(m.cfg.Paths.StateDir, "incoming", strings.TrimPrefix(r.Digest, "sha256:"), r.Name)
}

// peersSeen acts on a fresh view of the peers.
func (m *machine) peersSeen(v view) []effect {
	old := m.view
	m.view = v
	for _, p := range m.peers {
		now, was := v.statuses[p].Err, old.statuses[p].Err
		if now != nil && (was == nil || was.Error() != now.Error()) {
			m.log.Warn("a peer cannot be asked", "peer", p, "err", now)
		} else if now == nil && was != nil {
			m.log.Info("a peer answers again", "peer", p)
		}
	}
	r := m.active
	switch {
	case r == nil && m.job == nil:
		return m.maybeFetch(v)
	case r == nil:
	case r.Phase == PhaseExtracted && m.job == nil:
		return m.next()
	case r.Phase.Loaded():
		return m.gate(r)
	}
	return nil
}

// runsAlready reports whether every other node (at least one) is done
// with the upgrade to r and keeps it as the release it runs: this node
// joined the cluster after that upgrade, or came back empty.
func (m *machine) runsAlready(r *Record) bool {
	n := 0
	for _, st := range m.gatedStatuses() {
		if st.Err != nil || Phase(st.Phase) != PhaseUpgraded || st.Digest != r.Digest {
			return false
		}
		n++
	}
	return n > 0
}

// fresh are the offers this node may take: not a bundle it is done with
// (upgraded or cleaned up here), and not the release the peers run and
// keep (an upgraded peer's Digest) while another bundle is offered too.
func (m *machine) fresh(v view) []peer.PeerOffer {
	doneWith := map[string]bool{}
	for _, r := range m.records {
		if r.Phase == PhaseUpgraded || r.Phase == PhaseCleaned {
			doneWith[r.Digest] = true
		}
	}
	running := map[string]bool{}
	for _, st := range v.statuses {
		if st.Err == nil && Phase(st.Phase) == PhaseUpgraded && st.Digest != "" {
			running[st.Digest] = true
		}
	}
	var out, kept []peer.PeerOffer
	for _, o := range v.offers {
		switch {
		case doneWith[o.Digest]:
		case running[o.Digest]:
			kept = append(kept, o)
		default:
			out = append(out, o)
		}
	}
	if len(out) == 0 {
		return kept
	}
	return out
}

// maybeFetch starts fetching the bundle the peers offer, after the same
// checks a stick gets.
func (m *machine) maybeFetch(v view) []effect {
	o, conflict := oneOffer(m.fresh(v))
	if conflict != "" {
		return m.reportConflict(conflict)
	}
	if o == nil {
		return nil
	}
	meta, err := bundle.ParseMetadata(o.Metadata)
	for _, old := range m.records {
		if old.Digest != o.Digest {
			continue
		}
		switch old.Phase {
		case PhaseCleaned, PhaseUpgraded:
			return nil // done with before: not again
		case PhaseRejected:
			// Refused for its bytes (it was fetched), or still by this
			// node's policy: not again. Refused by a policy since changed
			// to approve it (a restart with the engineer's key): fetch it.
			if old.Dir != "" || err != nil {
				return nil
			}
			if _, perr := m.pol().ApproveOffer(meta, o.Digest, o.Signature); perr != nil {
				return nil
			}
		}
	}
	name := "bundle from " + o.Peer
	if meta != nil {
		name = meta.Name() + ".tar"
	}
	r := &Record{Digest: o.Digest, Name: name, Metadata: meta, Origin: OriginPeer, Source: o.Peer, TarSize: o.Size}
	if meta != nil {
		r.ID = m.newID(meta.DirName())
	} else {
		r.ID = m.newID("peer")
	}
	if err == nil {
		r.Approval, err = m.pol().ApproveOffer(meta, o.Digest, o.Signature)
		r.Signature = o.Signature
	}
	if err != nil {
		return m.refuseOffer(r, err)
	}
	r.Dir = filepath.Join(m.cfg.Paths.ExtractDir, meta.DirName())
	m.active = r
	effs := m.move(r, PhaseFetching, Condition{}, Progress{Unit: "bytes"})
	m.log.Info("fetching the bundle from the peers", "phase", string(PhaseFetching), "bundle", r.Name, "digest", r.Digest)
	return append(effs, m.fetch(r)...)
}

// Refused peer offers are kept, short, for a while: enough to say why
// and not to refuse the same offer at every poll, never enough that
// peers offering bundle after bundle grow the state or the status.
const (
	maxRefusedOffers = 8
	refusedOfferTTL  = 24 * time.Hour
	maxRefusedReason = 300 // bytes
)

// refuseOffer records an offer this node's policy refuses: no metadata,
// no signature, a bounded reason; the oldest beyond maxRefusedOffers and
// any older than refusedOfferTTL are forgotten.
func (m *machine) refuseOffer(r *Record, err error) []effect {
	r.Metadata, r.Signature = nil, nil
	reason := err.Error()
	if len(reason) > maxRefusedReason {
		reason = strings.ToValidUTF8(reason[:maxRefusedReason], "") + "…"
	}
	effs := m.reject(r, errors.New(reason))
	return append(effs, m.pruneRefused()...)
}

// isRefusedOffer reports whether r is an offer refused before any byte
// of it was fetched.
func isRefusedOffer(r *Record) bool {
	return r.Origin == OriginPeer && r.Phase == PhaseRejected && r.Dir == ""
}

// pruneRefused forgets refused offers past their time or their number.
func (m *machine) pruneRefused() []effect {
	var refused []*Record
	for _, r := range m.records {
		if isRefusedOffer(r) {
			refused = append(refused, r)
		}
	}
	sort.Slice(refused, func(i, j int) bool {
		return refused[i].Times[PhaseRejected].After(refused[j].Times[PhaseRejected])
	})
	var effs []effect
	for i, r := range refused {
		if i < maxRefusedOffers && m.now().Sub(r.Times[PhaseRejected]) < refusedOfferTTL {
			continue
		}
		delete(m.records, r.ID)
		if m.lastBad == r {
			m.lastBad = nil
		}
		effs = append(effs, effForget{r.ID})
	}
	return effs
}

// fetch starts fetching r from the peers, extracting it as it arrives
// (cut-through) under the policy its extraction gets: approved by this
// node's own keys, the signature is verified over the bytes; approved by
// digest, that digest. A tree left by an interrupted run is not trusted.
func (m *machine) fetch(r *Record) []effect {
	pol := m.extractPolicy(r)
	return append(append(m.keepsDir(r.Dir), effRemove{r.Dir}), m.startJob(effStartJob{kind: jobFetch, rec: r, policy: pol}, "")...)
}

// oneOffer is the one bundle the peers offer, or why there is a conflict.
func oneOffer(offers []peer.PeerOffer) (*peer.PeerOffer, string) {
	var one *peer.PeerOffer
	digests := map[string]bool{}
	for i := range offers {
		if !digests[offers[i].Digest] {
			digests[offers[i].Digest] = true
			one = &offers[i]
		}
	}
	if len(digests) > 1 {
		return nil, fmt.Sprintf("the peers hold different bundles (%s): two sticks were plugged; remove one and run 'ferry cleanup' on the nodes that hold it", shortDigests(digests))
	}
	return one, ""
}

// gate moves a loaded node to cluster-ready once every node is loaded with
// the same bundle, and runs the hook once where the stick was plugged.
func (m *machine) gate(r *Record) []effect {
	d := Decision{Verdict: Ready, Digest: r.Digest}
	if m.hasPeers() {
		for _, p := range m.peers {
			if _, heard := m.view.statuses[p]; !heard && !m.gateExcluded(p, "") {
				return nil
			}
		}
		if r.Phase == PhaseLoaded && m.runsAlready(r) {
			m.log.Info("every other node runs this release already, upgraded: this node joins it", "bundle", r.Name, "digest", r.Digest)
			return m.upgraded(r)
		}
		d = Decide(m.standing(), m.gatedStatuses())
	}
	var effs []effect
	switch d.Verdict {
	case Ready:
		if r.Phase == PhaseLoaded {
			effs = m.move(r, PhaseClusterReady, Condition{}, r.Progress)
			m.log.Info("every node holds the bundle, loaded and pinned: the upgrade may proceed", "phase", string(PhaseClusterReady), "bundle", r.Name, "digest", r.Digest)
		}
		if r.Plugged && m.schedule() == "Automatic" && m.policyRead() {
			effs = append(effs, m.proceed(r, false)...)
		}
	case Conflict:
		effs = m.reportConflict(d.Reason)
	}
	return effs
}

// startHook marks the hook started (persisted first, so a crash never
// runs it twice) and runs it.
func (m *machine) startHook(r *Record) ([]effect, error) {
	if len(m.cfg.Cluster.OnReady) == 0 {
		return nil, errors.New("no on_ready hook is configured")
	}
	if r.Hook != nil {
		return nil, errors.New("the on_ready hook already ran")
	}
	r.Hook = &HookRun{Started: m.now().UTC()}
	return []effect{effSave{r}, effRunHook{r}}, nil
}

func (m *machine) hookDone(h evHookDone) []effect {
	r := m.records[h.id]
	if r == nil {
		return nil
	}
	run := h.run
	r.Hook = &run
	if run.Error != "" {
		m.log.Error("the on_ready hook failed", "bundle", r.Name, "err", run.Error)
	} else {
		m.log.Info("the on_ready hook succeeded", "bundle", r.Name)
	}
	return []effect{effSave{r}}
}

func (m *machine) reportConflict(reason string) []effect {
	why := fault(ReasonBundlesDiffer, reason)
	if b := m.lastBad; b != nil && b.Phase == PhaseConflict && b.Condition == why {
		return nil
	}
	m.log.Warn("conflict", "phase", string(PhaseConflict), "reason", reason)
	r := &Record{ID: m.newID("cluster"), Name: "cluster", Origin: OriginPeer}
	m.lastBad = r
	return m.move(r, PhaseConflict, why, Progress{})
}

// peersDisagree is why not every peer holds the same bundle as r, which
// must hold before anything is pinned; the zero Condition when they do.
func (m *machine) peersDisagree(r *Record) Condition {
	if !m.hasPeers() {
		return Condition{}
	}
	if m.view.at.IsZero() {
		return waiting(ReasonPeersUnheard, "waiting to hear from the peers")
	}
	self := m.standing()
	var unheld []string
	for _, p := range m.peers {
		st, heard := m.view.statuses[p]
		switch {
		case m.gateExcluded(p, st.Node):
			continue
		case !heard:
			unheld = append(unheld, p+" (not heard from yet)")
		case st.Err != nil:
			unheld = append(unheld, p+" (unreachable)")
		case conflicting(self, st.Status):
			return fault(ReasonPeerHoldsOther, fmt.Sprintf("conflict: node %s holds another bundle (%s, %s): remove the second stick and run 'ferry cleanup' there", nodeName(p, st.Status), st.Version, sha256digest.Short(st.Digest)))
		case refuses(st.Status, r.Digest):
			return waiting(ReasonPeerRefuses, fmt.Sprintf("node %s refuses this bundle (%s): every node must hold it before anything is pinned; approve it there (approved_digests or trusted_keys) or bring a bundle every node approves", nodeName(p, st.Status), st.Status.Error))
		case st.Digest != r.Digest:
			unheld = append(unheld, nodeName(p, st.Status))
		}
	}
	if len(unheld) > 0 {
		return waiting(ReasonPeersNotHolding, "waiting for "+strings.Join(unheld, ", ")+" to hold the bundle")
	}
	return Condition{}
}

// Permanent reports whether err says that retrying cannot fix it (an
// image the bundle lacks, bytes that do not match their digest): such a
// load ends in failed instead of retrying forever. An error opts in by
// having a Permanent() bool method returning true, so the agent needs no
// import of the part that raised it.
func Permanent(err error) bool {
	var p interface{ Permanent() bool }
	return errors.As(err, &p) && p.Permanent()
}
