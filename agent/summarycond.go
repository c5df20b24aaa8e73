package agent

import (
	"context"
	"github.com/ferry-edge/ferry/agent/machine"

	"github.com/ferry-edge/ferry/cluster"
)

// approvalEvent records what became of the approval when the Approved
// condition the summary's writer just wrote differs from the one the
// resource held: approved (Normal), or another digest approved, a
// refusal, digests that disagree (Warning). Waiting is no news.
func (a *Agent) approvalEvent(ctx context.Context, api BundleAPI, name string, view cluster.BundleView, sum cluster.BundleSummary) error {
	now, _ := machine.FindCondition(sum.Conditions, machine.CondApproved)
	prev, _ := machine.FindCondition(view.Conditions, machine.CondApproved)
	if now.Reason == prev.Reason && now.Status == prev.Status || now.Reason == machine.ReasonAwaitingApproval {
		return nil
	}
	typ := "Warning"
	if now.Status == "True" {
		typ = "Normal"
	}
	msg := machine.SanitizeReason(a.cfg.NodeName + ": " + now.Message)
	return api.BundleEvent(ctx, name, view.UID, a.cfg.NodeName, typ, now.Reason, msg)
}
