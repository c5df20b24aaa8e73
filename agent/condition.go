package agent

import (
	"encoding/json"
	"strings"
)

// Condition is why a bundle is where it is, typed: health, the gate and
// the peers' view are decided from its Kind (and step compares Reasons),
// never from its Message, which is only rendered when the status is
// published (the STATUS= line, the Node annotation, the UpgradeBundle).
// The zero Condition says nothing more than the phase.
type Condition struct {
	Kind ConditionKind `json:"kind"`
	// Reason is a short CamelCase machine reason (the Reason constants).
	Reason string `json:"reason"`
	// Message is for a technician: what happened and what to do.
	Message string `json:"message,omitempty"`
}

// ConditionKind is what a condition means for the node.
type ConditionKind string

const (
	// KindWaiting: the bundle waits for something or someone outside
	// (approval, the peers, the cluster, the stick again).
	KindWaiting ConditionKind = "Waiting"
	// KindProgress: a step under way that says more than its phase.
	KindProgress ConditionKind = "Progress"
	// KindRetrying: a try failed; the agent tries again by itself.
	KindRetrying ConditionKind = "Retrying"
	// KindFault: a person must act (a conflict, a refusal, a failure):
	// the node is unhealthy while its status shows one.
	KindFault ConditionKind = "Fault"
)

// Healthy reports whether a node whose status shows c is healthy: the one
// rule, on the kind alone.
func (c Condition) Healthy() bool { return c.Kind != KindFault }

// Machine reasons, one per cause step knows.
const (
	ReasonCopyInterrupted      = "CopyInterrupted"      // a restart or a pulled stick cut the copy short
	ReasonOtherBundleApproved  = "OtherBundleApproved"  // the UpgradeBundle approves another digest
	ReasonAwaitingApproval     = "AwaitingApproval"     // extracted, not approved
	ReasonLoadsNothing         = "LoadsNothing"         // approved on a node with no CRI-O loader (no crio.socket)
	ReasonPeersUnheard         = "PeersUnheard"         // no view of the peers yet
	ReasonPeerHoldsOther       = "PeerHoldsOtherBundle" // a peer holds a different bundle
	ReasonPeerRefuses          = "PeerRefusesBundle"    // a peer's policy refuses this bundle
	ReasonPeersNotHolding      = "PeersNotHolding"      // some peers do not hold the bundle yet
	ReasonNodesWithoutFerry    = "NodesWithoutFerry"    // the MCO counts nodes with no ferry record
	ReasonNodesWithoutCRIO     = "NodesWithoutCRIO"     // a gated node has no CRI-O and never loads
	ReasonFetchFailed          = "FetchFailed"
	ReasonNoRoomToExtract      = "NoRoomToExtract" // a fetched bundle, fetched again once there is room
	ReasonFetchAbandoned       = "FetchAbandoned"  // the fetch filled the disk
	ReasonLoadFailed           = "LoadFailed"
	ReasonRefused              = "BundleRefused" // rejected: bad, wrong or unapproved bytes
	ReasonBundlesDiffer        = "BundlesDiffer" // conflict: two different bundles
	ReasonUpgradeRequestFailed = "UpgradeRequestFailed"
	ReasonUpgradePending       = "UpgradePending" // the cluster version operator has not started
	ReasonUpgrading            = "Upgrading"      // the cluster version operator's words
	ReasonReleaseRefused       = "ReleaseRefused" // the cluster refuses the release
	ReasonCleaningUp           = "CleaningUp"
	ReasonCleanupFailed        = "CleanupFailed"
	ReasonCleanupRefused       = "CleanupRefused"  // ClusterVersion asks for the release: oc adm upgrade --clear first
	ReasonNodeUnread           = "NodeStateUnread" // this node's machine config state not read yet
	ReasonPoolPaused           = "PoolPaused"
	ReasonNodeUpdating         = "NodeUpdating" // the machine config operator is not done with the node
	ReasonUnclassified         = "Unclassified" // an old record's reason no rule below knows
)

// ReasonReleaseUnapproved: the API server refuses the release until the
// administrator approves it in ConfigMap openshift-ferry/ferry-admission.
const ReasonReleaseUnapproved = "ReleaseUnapproved"

// loadsNothing is an approved bundle's condition on a node with no CRI-O
// loader (crio.socket = ""): it is verified, extracted and shared, and
// nothing more happens here.
var loadsNothing = underway(ReasonLoadsNothing, "approved; this node loads nothing (no crio.socket): it verifies, extracts and shares the bundle")

func waiting(reason, message string) Condition {
	return Condition{Kind: KindWaiting, Reason: reason, Message: message}
}

func underway(reason, message string) Condition {
	return Condition{Kind: KindProgress, Reason: reason, Message: message}
}

func retrying(reason, message string) Condition {
	return Condition{Kind: KindRetrying, Reason: reason, Message: message}
}

func fault(reason, message string) Condition {
	return Condition{Kind: KindFault, Reason: reason, Message: message}
}

// recordJSON is Record without its JSON methods.
type recordJSON Record

// MarshalJSON writes the record with its condition's message also under
// "reason", as versions before the typed condition wrote it, and its
// retirement also as the booleans versions before Retirement wrote:
// `ferry status --json` readers and an older ferry find them there.
func (r Record) MarshalJSON() ([]byte, error) {
	t := r.Retirement
	return json.Marshal(struct {
		recordJSON
		Reason   string `json:"reason,omitempty"`
		Retiring bool   `json:"retiring,omitempty"`
		Retired  bool   `json:"retired,omitempty"`
		Unpinned bool   `json:"unpinned,omitempty"`
	}{recordJSON(r), r.Condition.Message, t >= RetirementStarted, t >= RetirementDone, t == RetirementUnpinned})
}

// UnmarshalJSON reads a record, and gives one written before the typed
// condition (a "reason" text only) the condition its words meant, and
// one written before Retirement (booleans only) the state they meant.
func (r *Record) UnmarshalJSON(b []byte) error {
	var v struct {
		recordJSON
		Reason   string `json:"reason"`
		Retiring bool   `json:"retiring"`
		Retired  bool   `json:"retired"`
		Unpinned bool   `json:"unpinned"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = Record(v.recordJSON)
	if r.Retirement == RetirementNone {
		r.Retirement = legacyRetirement(v.Retiring, v.Retired, v.Unpinned)
	}
	if r.Condition == (Condition{}) {
		r.Condition = legacyCondition(r.Phase, v.Reason)
	}
	return nil
}

// legacyReasons are the words with which versions before the typed
// condition began their reasons, in the order they are tried. This is
// the one place English is matched, and only for records on disk.
var legacyReasons = []struct {
	prefix string
	cond   Condition
}{
	{"interrupted before the copy finished", waiting(ReasonCopyInterrupted, "")},
	{"the stick was pulled", waiting(ReasonCopyInterrupted, "")},
	{"not loading: UpgradeBundle", waiting(ReasonOtherBundleApproved, "")},
	{"waiting for approval", waiting(ReasonAwaitingApproval, "")},
	{"waiting to hear from the peers", waiting(ReasonPeersUnheard, "")},
	{"conflict", fault(ReasonPeerHoldsOther, "")},
	{"node ", waiting(ReasonPeerRefuses, "")},
	{"waiting for the cluster version operator", waiting(ReasonUpgradePending, "")},
	{"waiting for the machine config operator", waiting(ReasonNodeUpdating, "")},
	{"waiting to read this node's machine config", waiting(ReasonNodeUnread, "")},
	{"waiting: pool", waiting(ReasonPoolPaused, "")},
	{"waiting for ", waiting(ReasonPeersNotHolding, "")},
	{"fetching from the peers failed", retrying(ReasonFetchFailed, "")},
	{"no room to extract", retrying(ReasonNoRoomToExtract, "")},
	{"loading failed", retrying(ReasonLoadFailed, "")},
	{"asking the cluster for the upgrade failed", retrying(ReasonUpgradeRequestFailed, "")},
	{"the cluster refuses", fault(ReasonReleaseRefused, "")},
	{"cleaning up after the upgrade failed", retrying(ReasonCleanupFailed, "")},
	{"cleaning up", underway(ReasonCleaningUp, "")},
}

// legacyCondition is the condition an old record's phase and reason text
// meant: the same health as when that version read its own words.
func legacyCondition(p Phase, text string) Condition {
	var c Condition
	switch {
	case p == PhaseFailed && strings.HasPrefix(text, "abandoned"):
		c = fault(ReasonFetchAbandoned, "")
	case p == PhaseFailed:
		c = fault(ReasonLoadFailed, "")
	case p == PhaseRejected:
		c = fault(ReasonRefused, "")
	case p == PhaseConflict:
		c = fault(ReasonBundlesDiffer, "")
	case text == "":
		return Condition{}
	default:
		c = waiting(ReasonUnclassified, "")
		if p == PhaseUpgrading {
			c = underway(ReasonUpgrading, "")
		}
		for _, l := range legacyReasons {
			if strings.HasPrefix(text, l.prefix) {
				c = l.cond
				break
			}
		}
	}
	c.Message = text
	return c
}
