package agent

import (
	"context"

	"github.com/ferry-edge/ferry/agent/machine"
)

// A node creates no UpgradeBundle (docs/security.md, "How many objects
// one node can create"): the administrator does, with ferry approve or
// oc apply. Until the active bundle's exists, the node follows its own
// config (approval, schedule), and what it would write there is on its
// own Node (ferry.io/* annotations, the ferry.io/phase label: the status
// line) and in its Events about that name, which oc get events lists
// with no resource to hang them on.

// reportWithoutResource is writeBundle while rep's UpgradeBundle does not
// exist: the phase Events only, and a log line once per name.
func (a *Agent) reportWithoutResource(ctx context.Context, api BundleAPI, rep *machine.BundleReport, lastPhase map[string]string) error {
	if key := "absent/" + rep.Name; lastPhase[key] == "" {
		a.log.Info("no UpgradeBundle for this bundle: the administrator creates it (ferry approve with the engineer's .sha256, or oc apply); until then this node reports on its Node and in Events",
			"bundle", rep.Name)
		lastPhase[key] = "logged"
	}
	return a.phaseEvents(ctx, api, rep, "", rep.Entry.Phase, lastPhase)
}
