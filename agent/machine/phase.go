package machine

import (
	"errors"
	"strconv"

	"github.com/ferry-edge/ferry/internal/digest"
)

// Phase is where one bundle is on this node.
type Phase string

// Phases, in order; rejected, failed and conflict are terminal reports.
const (
	PhaseIdle         Phase = "idle"          // no bundle (status only)
	PhaseDetected     Phase = "detected"      // seen; verifying and extracting
	PhaseFetching     Phase = "fetching"      // being fetched from peers
	PhaseExtracted    Phase = "extracted"     // verified and extracted
	PhaseLoading      Phase = "loading"       // pulling and pinning into CRI-O
	PhaseLoaded       Phase = "loaded"        // every image present and pinned
	PhaseClusterReady Phase = "cluster-ready" // every node loaded: the upgrade may start
	PhaseUpgrading    Phase = "upgrading"     // the cluster upgrades to this release
	PhaseUpgraded     Phase = "upgraded"      // done: registry and mirror gone, pins and tree kept until the next upgrade
	PhaseCleaned      Phase = "cleaned"       // taken out by hand before it was the cluster's release
	PhaseRejected     Phase = "rejected"
	PhaseFailed       Phase = "failed"
	PhaseConflict     Phase = "conflict"
)

// Active reports whether a bundle in this phase holds the node: a second,
// different bundle is then a conflict.
func (p Phase) Active() bool {
	switch p {
	case PhaseDetected, PhaseFetching, PhaseExtracted, PhaseLoading, PhaseLoaded, PhaseClusterReady, PhaseUpgrading:
		return true
	}
	return false
}

// Loaded reports whether every image of the bundle is present and pinned.
func (p Phase) Loaded() bool {
	return p == PhaseLoaded || p == PhaseClusterReady || p == PhaseUpgrading
}

// Origin is where a bundle came from.
type Origin string

const (
	OriginStick Origin = "stick"
	OriginFile  Origin = "file" // ferry load
	OriginPeer  Origin = "peer"
)

// approvalOffWarning is said at start and in every status line while the
// config says approval = "off".
const ApprovalOffWarning = "approval is off: any bundle whose sha256 checks is loaded"

// warningsPointer ends the status line of a node with standing warnings:
// the line points to them rather than carrying each one.
func warningsPointer(n int) string {
	return "WARNING: " + itoa(n) + " standing warning(s), see ferry status"
}

// WaitingForApproval is the reason an extracted bundle that no approved
// digest or trusted key approves waits with: it is not loaded.
func WaitingForApproval(digest digest.Digest) string {
	return "waiting for approval: add its digest " + string(digest) + " to approved_digests and restart ferry, or sign it with a trusted key (then 'ferry cleanup' and plug the stick again)"
}

// Retirement is how far an upgraded bundle's retirement has gone on this
// node: each state implies the ones before it.
type Retirement uint8

const (
	// RetirementNone: not being retired (not upgraded, or upgraded and
	// waiting until this node no longer needs the bundle).
	RetirementNone Retirement = iota
	// RetirementStarted: this node no longer needs the bundle (the
	// upgrade is done and the MCO is done with the node, or ferry
	// cleanup said so): its registry and mirror (and its files unless
	// kept) go, after a restart too.
	RetirementStarted
	// RetirementDone: they are gone; its pins stay until the next
	// upgrade is done.
	RetirementDone
	// RetirementUnpinned: the next bundle's upgrade is done and this
	// one's pins went.
	RetirementUnpinned
)

var retirementNames = [...]string{"", "retiring", "retired", "unpinned"}

func (t Retirement) String() string {
	if int(t) < len(retirementNames) {
		return retirementNames[t]
	}
	return "Retirement(" + itoa(int(t)) + ")"
}

// MarshalText writes the state's name, as records keep it.
func (t Retirement) MarshalText() ([]byte, error) {
	if int(t) >= len(retirementNames) {
		return nil, errors.New("unknown retirement state " + itoa(int(t)))
	}
	return []byte(retirementNames[t]), nil
}

// UnmarshalText reads a state's name.
func (t *Retirement) UnmarshalText(b []byte) error {
	for i, n := range retirementNames {
		if string(b) == n {
			*t = Retirement(i)
			return nil
		}
	}
	return errors.New("unknown retirement state " + strconv.Quote(string(b)))
}
