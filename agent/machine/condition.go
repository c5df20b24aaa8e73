package machine

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
)

// ReasonReleaseUnapproved: the API server refuses the release until the
// administrator approves it in ConfigMap openshift-ferry/ferry-admission.
const ReasonReleaseUnapproved = "ReleaseUnapproved"

// loadsNothing is an approved bundle's condition on a node with no CRI-O
// loader (crio.socket = ""): it is verified, extracted and shared, and
// nothing more happens here.
var loadsNothing = Underway(ReasonLoadsNothing, "approved; this node loads nothing (no crio.socket): it verifies, extracts and shares the bundle")

// WaitingFor is the condition of a bundle that waits, for reason.
func WaitingFor(reason, message string) Condition {
	return Condition{Kind: KindWaiting, Reason: reason, Message: message}
}

func Underway(reason, message string) Condition {
	return Condition{Kind: KindProgress, Reason: reason, Message: message}
}

func Retrying(reason, message string) Condition {
	return Condition{Kind: KindRetrying, Reason: reason, Message: message}
}

func Fault(reason, message string) Condition {
	return Condition{Kind: KindFault, Reason: reason, Message: message}
}
