package meta

// Approval is how a bundle was approved: what a Result, the agent's
// record of the bundle and its UpgradeBundle's status say. Its JSON and
// text form is the bare word.
type Approval string

// The one list of approvals.
const (
	// ApprovalDigest: its digest is an approved one (approved_digests, or
	// the cluster's UpgradeBundles).
	ApprovalDigest Approval = "digest"
	// ApprovalSignature: its .minisig is by one of the trusted keys.
	ApprovalSignature Approval = "signature"
	// ApprovalPeer: this node approved its digest before fetching it from
	// a peer (Policy.ApproveOffer, then Policy.PreApproved).
	ApprovalPeer Approval = "peer"
	// ApprovalSource: a bundle of a release the administrator asked for
	// from the registry (Policy.ApprovedSources), made by the node that
	// pulled it; held to what the release names as it is extracted.
	ApprovalSource Approval = "source"
	// ApprovalOff: approval is turned off; any bundle whose sha256
	// checks is taken.
	ApprovalOff Approval = "off"
	// ApprovalNone: not approved (Policy.Unapproved): verified and
	// extracted, shared, never loaded.
	ApprovalNone Approval = "none"
)
