package agent

import "github.com/ferry-edge/ferry/agent/machine"

// The names the rest of ferry knows the agent by, of what the machine
// (agent/machine) now declares: the agent's status, records, phases and
// reasons are the machine's.

type (
	ClusterNode   = machine.ClusterNode
	ClusterStatus = machine.ClusterStatus
	Condition     = machine.Condition
	Decision      = machine.Decision
	DeviceEvent   = machine.DeviceEvent
	Origin        = machine.Origin
	Phase         = machine.Phase
	Progress      = machine.Progress
	Record        = machine.Record
	Status        = machine.Status
)

const (
	AnnotationBundle        = machine.AnnotationBundle
	AnnotationPhase         = machine.AnnotationPhase
	AnnotationProgress      = machine.AnnotationProgress
	AnnotationReason        = machine.AnnotationReason
	ApprovalModeRequired    = machine.ApprovalModeRequired
	ApprovedDisagree        = machine.ApprovedDisagree
	ApprovedWaiting         = machine.ApprovedWaiting
	CondApproved            = machine.CondApproved
	CondDegraded            = machine.CondDegraded
	CondLoaded              = machine.CondLoaded
	CondUpgraded            = machine.CondUpgraded
	Conflict                = machine.Conflict
	KindFault               = machine.KindFault
	OriginFile              = machine.OriginFile
	OriginPeer              = machine.OriginPeer
	OriginStick             = machine.OriginStick
	PhaseCleaned            = machine.PhaseCleaned
	PhaseClusterReady       = machine.PhaseClusterReady
	PhaseConflict           = machine.PhaseConflict
	PhaseDetected           = machine.PhaseDetected
	PhaseExtracted          = machine.PhaseExtracted
	PhaseFailed             = machine.PhaseFailed
	PhaseFetching           = machine.PhaseFetching
	PhaseIdle               = machine.PhaseIdle
	PhaseLoaded             = machine.PhaseLoaded
	PhaseLoading            = machine.PhaseLoading
	PhaseRejected           = machine.PhaseRejected
	PhaseUpgraded           = machine.PhaseUpgraded
	PhaseUpgrading          = machine.PhaseUpgrading
	Ready                   = machine.Ready
	ReasonAwaitingApproval  = machine.ReasonAwaitingApproval
	ReasonBundlesDiffer     = machine.ReasonBundlesDiffer
	ReasonCleanupRefused    = machine.ReasonCleanupRefused
	ReasonClusterReady      = machine.ReasonClusterReady
	ReasonCopyInterrupted   = machine.ReasonCopyInterrupted
	ReasonDigestMismatch    = machine.ReasonDigestMismatch
	ReasonFetchAbandoned    = machine.ReasonFetchAbandoned
	ReasonFetchFailed       = machine.ReasonFetchFailed
	ReasonLoadFailed        = machine.ReasonLoadFailed
	ReasonLoading           = machine.ReasonLoading
	ReasonLoadsNothing      = machine.ReasonLoadsNothing
	ReasonNodeUpdating      = machine.ReasonNodeUpdating
	ReasonNodesWithoutCRIO  = machine.ReasonNodesWithoutCRIO
	ReasonNotApproved       = machine.ReasonNotApproved
	ReasonNotEnoughSpace    = machine.ReasonNotEnoughSpace
	ReasonPeerHoldsOther    = machine.ReasonPeerHoldsOther
	ReasonPeerRefuses       = machine.ReasonPeerRefuses
	ReasonPeerRefusesNode   = machine.ReasonPeerRefusesNode
	ReasonPeerTokenMissing  = machine.ReasonPeerTokenMissing
	ReasonPeersNotHolding   = machine.ReasonPeersNotHolding
	ReasonPoolPaused        = machine.ReasonPoolPaused
	ReasonPreflightRefused  = machine.ReasonPreflightRefused
	ReasonPullFailed        = machine.ReasonPullFailed
	ReasonPullRetrying      = machine.ReasonPullRetrying
	ReasonPulling           = machine.ReasonPulling
	ReasonRefused           = machine.ReasonRefused
	ReasonReleaseRefused    = machine.ReasonReleaseRefused
	ReasonReleaseUnapproved = machine.ReasonReleaseUnapproved
	ReasonSignaturePolicy   = machine.ReasonSignaturePolicy
	ReasonUpgraded          = machine.ReasonUpgraded
	ReasonVerifying         = machine.ReasonVerifying
	ReasonWaitingForStick   = machine.ReasonWaitingForStick
	Waiting                 = machine.Waiting
)

var (
	Decide       = machine.Decide
	ResourceName = machine.ResourceName
)
