package machine

import (
	"time"

	"github.com/ferry-edge/ferry/bundle/meta"
	"github.com/ferry-edge/ferry/internal/digest"
)

// Progress of the current phase.
type Progress struct {
	Done  int64  `json:"done"`
	Total int64  `json:"total"`
	Unit  string `json:"unit"` // "bytes" or "images"
}

// Record is one bundle's persisted state.
type Record struct {
	// ID names the record for its whole life: a phase change never
	// renames it (records from older versions keep theirs).
	ID       string         `json:"id"`
	Digest   digest.Digest  `json:"digest,omitempty"`
	Name     string         `json:"name"` // upgrade-<version>-<arch>.tar
	Metadata *meta.Metadata `json:"metadata,omitempty"`
	Origin   Origin         `json:"origin"`
	Source   string         `json:"source,omitempty"` // device or file it came from
	Dir      string         `json:"dir,omitempty"`    // extracted tree
	Phase    Phase          `json:"phase"`
	// Condition is why it is rejected, failed or in conflict, or what it
	// waits for (its JSON also keeps the message under "reason").
	Condition Condition           `json:"condition,omitzero"`
	Progress  Progress            `json:"progress"`
	Times     map[Phase]time.Time `json:"times"`
	// Plugged is true on the node where the stick was plugged: it runs the
	// cluster hook.
	Plugged bool `json:"plugged,omitempty"`
	// Hook is the on_ready hook's run, once started.
	Hook *HookRun `json:"hook,omitempty"`
	// Upgrade is the cluster upgrade this node asked for (the stick's
	// node, or the one where ferry proceed ran).
	Upgrade *UpgradeRun `json:"upgrade,omitempty"`
	// Message is the cluster version operator's progress line.
	Message string `json:"message,omitempty"`
	// Path is, for a bundle with a path of several releases, how each
	// hop stood at the last reading of ClusterVersion (nil before one).
	Path *PathRead `json:"path,omitempty"`
	// MachineConfig is the rendered MachineConfig this node was headed
	// for before the upgrade (read at cluster-ready): the upgrade's own
	// is another one.
	MachineConfig string `json:"machineConfig,omitempty"`
	// Retirement is how far the bundle's retirement has gone, once
	// upgraded (records before it kept three booleans: retiring, retired,
	// unpinned, which still load, and are still written for an older
	// ferry).
	Retirement Retirement `json:"retirement,omitempty"`
	// Retained: upgraded, and its extracted tree kept (Dir) as the running
	// release's source until the next upgrade is done: its images are
	// loaded again from it when CRI-O loses them, and it is served to the
	// peers.
	Retained bool `json:"retained,omitempty"`
	// Signature is the bundle's .minisig, when it had one: it travels to
	// the peers with the metadata.
	Signature []byte `json:"signature,omitempty"`
	// Approval is how this node approved the bundle.
	Approval meta.Approval `json:"approval,omitempty"`
	// Warnings are the cluster's preflight warnings on the bundle (paused
	// pools, unhealthy operators, workloads it does not serve).
	Warnings []string `json:"warnings,omitempty"`
	// DigestOnly are the bundle's images (references as in its metadata)
	// this node pulls and pins by digest only: its signature policy
	// admits them by digest but not by the tag they keep (imagepolicy).
	DigestOnly []string `json:"digestOnly,omitempty"`
	// SignaturePolicy says so, one warning per image.
	SignaturePolicy []string `json:"signaturePolicy,omitempty"`
	// TarSize is the tar's length a peer's offer gave (fetched bundles):
	// with the metadata's size, it bounds what the fetch writes.
	TarSize int64 `json:"tarSize,omitempty"`
}

// HookRun records the on_ready hook's one run.
type HookRun struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished,omitzero"`
	Exit     int       `json:"exit"`
	Error    string    `json:"error,omitempty"`
}

// UpgradeRun records the cluster upgrade this node asked for.
type UpgradeRun struct {
	Requested time.Time `json:"requested"`
	Accepted  time.Time `json:"accepted,omitzero"`
	Error     string    `json:"error,omitempty"`
	// Stopped: a hop of the bundle's path failed, and this node, which
	// takes the path's steps, takes none until a person resumes it
	// (ferry proceed, or spec.proceed written after StoppedAt, the
	// spec's generation when it stopped). It says why.
	Stopped   string `json:"stopped,omitempty"`
	StoppedAt int64  `json:"stoppedAt,omitempty"`
}

// PathRead is how a bundle's path stood at the last reading.
type PathRead struct {
	From string    `json:"from,omitempty"` // the cluster's version before the path
	Hops []HopRead `json:"hops"`
}

// HopRead is one hop of PathRead (cluster.HopProgress).
type HopRead struct {
	State   string `json:"state"`
	Message string `json:"message,omitempty"`
}

func (r *Record) FirstSeen() time.Time {
	var t time.Time
	for _, v := range r.Times {
		if t.IsZero() || v.Before(t) {
			t = v
		}
	}
	return t
}

// clone copies r deeply enough to be read without the agent's lock.
// Images are the references r's load pulls and pins: its metadata's,
// those in DigestOnly without their tag.
func (r *Record) Images() []string {
	if r.Metadata == nil {
		return nil
	}
	return meta.DropTags(r.Metadata.AllImages(), r.DigestOnly)
}

func (r *Record) Clone() *Record {
	c := *r
	if r.Hook != nil {
		h := *r.Hook
		c.Hook = &h
	}
	if r.Upgrade != nil {
		u := *r.Upgrade
		c.Upgrade = &u
	}
	c.Times = make(map[Phase]time.Time, len(r.Times))
	for k, v := range r.Times {
		c.Times[k] = v
	}
	return &c
}
