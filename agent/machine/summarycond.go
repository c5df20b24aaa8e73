package machine

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/bundle/meta"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// The UpgradeBundle's own conditions (status.conditions), in the shape
// of metav1.Condition, so that `kubectl wait --for=condition=Approved
// upgradebundle/<name>` works. Only the summary's writer (summaryWriter)
// writes them, from every node's entry, as it writes the rest of the
// summary: one account, never two nodes' turns.

// The resource's condition types.
const (
	CondApproved  = "Approved"  // the bundle may load: approved, and not refused
	CondLoaded    = "Loaded"    // every node the gate waits for holds it loaded (or upgraded)
	CondUpgrading = "Upgrading" // the cluster version operator upgrades to its release
	CondUpgraded  = "Upgraded"  // every node the gate waits for is upgraded: the final state
	CondDegraded  = "Degraded"  // a person must act: a refusal, a failure, a conflict
)

// The summary's approved beside ApprovedDisagree and ApprovedWaiting:
// the APPROVED column says what became of an approval.
const (
	ApprovedOther    = "approves another digest" // spec.approvedDigest names another bundle
	ApprovedRejected = "rejected"                // the bundle was refused
)

// summaryConditions decides the resource's conditions from the summary,
// the gated nodes' entries and the spec (view): each keeps its transition
// time while its status stays, and all carry the spec's generation they
// were decided from. It sets sum.Approved to what became of an approval.
func SummaryConditions(sum *cluster.BundleSummary, rep *BundleReport, view cluster.BundleView, gated map[string]cluster.BundleNodeEntry, now time.Time) {
	byPhase := func(ps ...Phase) []string {
		var out []string
		for n, e := range gated {
			if slices.Contains(ps, Phase(e.Phase)) {
				out = append(out, n)
			}
		}
		slices.Sort(out)
		return out
	}
	cond := func(t string, ok bool, reason, message string) cluster.BundleCondition {
		st := "False"
		if ok {
			st = "True"
		}
		// The CRD, as metav1.Condition, requires a reason and a message.
		reason, message = cmp.Or(reason, "Unknown"), cmp.Or(SanitizeReason(message), reason, "unknown")
		return cluster.BundleCondition{Type: t, Status: st, Reason: reason, Message: message}
	}

	approved := cond(CondApproved, false, ReasonAwaitingApproval,
		"waiting for approval: ferry approve FILE.sha256 with the engineer's file (docs/admin.md, \"Approval\")")
	refused := byPhase(PhaseRejected)
	other := ""
	if d := meta.NormalizeDigest(view.Policy.ApprovedDigest); d != "" && rep.Entry.Digest != "" && d != rep.Entry.Digest {
		other = string(d)
	}
	switch {
	case sum.Approved == ApprovedDisagree:
		approved = cond(CondApproved, false, "DigestsDisagree", "the nodes read different digests for this bundle: status.warnings says which")
	case len(refused) > 0:
		sum.Approved = ApprovedRejected
		approved = cond(CondApproved, false, "Rejected", "refused on "+strings.Join(refused, ", ")+": "+entryReason(gated, refused[0]))
	case other != "":
		sum.Approved = ApprovedOther
		approved = cond(CondApproved, false, "OtherDigestApproved",
			"spec.approvedDigest approves "+sha256digest.Short(other)+", the nodes read "+sha256digest.Short(rep.Entry.Digest)+
				": bring the approved bundle, or write the engineer's digest of this one (ferry approve FILE.sha256)")
	case sum.Approved != ApprovedWaiting && sum.Approved != "":
		approved = cond(CondApproved, true, approvedReason(sum.Approved), approvedMessage(sum.Approved))
	}

	ready, waited := readyOf(sum.NodesReady)
	loaded := cond(CondLoaded, waited > 0 && ready == waited, "AllNodesLoaded", sum.NodesReady+" nodes loaded")
	if loaded.Status != "True" {
		loaded.Reason, loaded.Message = "NodesNotLoaded", SanitizeReason(sum.NodesReady+" nodes loaded; behind: "+sum.Behind)
	}

	upgrading := cond(CondUpgrading, false, "NotStarted", "the upgrade has not started")
	if ns := byPhase(PhaseUpgrading); len(ns) > 0 {
		upgrading = cond(CondUpgrading, true, ReasonUpgrading, entryReason(gated, ns[0]))
	}
	upgraded := cond(CondUpgraded, false, cmp.Or(PhaseReason(Phase(sum.Phase)), "NotUpgraded"), "the least advanced node is "+cmp.Or(sum.Phase, "unknown"))
	if ns := byPhase(PhaseUpgraded); len(gated) > 0 && len(ns) == len(gated) {
		upgraded = cond(CondUpgraded, true, "AllNodesUpgraded", "every node the gate waits for is upgraded")
		upgrading.Reason, upgrading.Message = "Upgraded", "the upgrade is done"
	}

	degraded := cond(CondDegraded, false, "AsExpected", "no node reports a fault")
	switch faulty := byPhase(PhaseRejected, PhaseFailed, PhaseConflict); {
	case sum.Approved == ApprovedDisagree:
		degraded = cond(CondDegraded, true, "DigestsDisagree", "the nodes read different digests for this bundle: status.warnings says which")
	case len(faulty) > 0:
		degraded = cond(CondDegraded, true, PhaseReason(Phase(gated[faulty[0]].Phase)),
			strings.Join(faulty, ", ")+": "+entryReason(gated, faulty[0]))
	case !rep.Healthy:
		degraded = cond(CondDegraded, true, "NodeUnhealthy", rep.Entry.Reason)
	}

	sum.ObservedGeneration = view.Generation
	sum.Conditions = nil
	for _, c := range []cluster.BundleCondition{approved, loaded, upgrading, upgraded, degraded} {
		c.ObservedGeneration = view.Generation
		c.Since = now.UTC().Truncate(time.Second) // the API keeps seconds
		if prev, ok := FindCondition(view.Conditions, c.Type); ok && prev.Status == c.Status && !prev.Since.IsZero() {
			c.Since = prev.Since
		}
		sum.Conditions = append(sum.Conditions, c)
	}
}

// entryReason is node's reason as its entry says it.
func entryReason(entries map[string]cluster.BundleNodeEntry, node string) string {
	if r := entries[node].Reason; r != "" {
		return r
	}
	return entries[node].Phase
}

func FindCondition(cs []cluster.BundleCondition, t string) (cluster.BundleCondition, bool) {
	for _, c := range cs {
		if c.Type == t {
			return c, true
		}
	}
	return cluster.BundleCondition{}, false
}

// approvedReason is how the bundle was approved, as a condition reason.
func approvedReason(how string) string {
	if meta.Approval(how) == meta.ApprovalOff {
		return "ApprovalOff"
	}
	return "Approved" + PhaseReason(Phase(how)) // ApprovedDigest, ApprovedSignature, ApprovedPeer, ApprovedSource
}

func approvedMessage(how string) string {
	switch meta.Approval(how) {
	case meta.ApprovalDigest:
		return "approved by its digest (spec.approvedDigest, or approved_digests)"
	case meta.ApprovalSignature:
		return "signed by a trusted key (trusted_keys)"
	case meta.ApprovalPeer:
		return "approved by its digest before it was fetched from a peer"
	case meta.ApprovalSource:
		return "a release the administrator asked for from the registry (spec.source)"
	case meta.ApprovalOff:
		return "approval is off on the nodes (approval = \"off\"): any bundle whose sha256 checks is loaded"
	}
	return "approved (" + how + ")"
}
