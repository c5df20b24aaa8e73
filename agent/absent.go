package agent

import (
	"context"
	"fmt"

	"github.com/opencontainers/go-digest"
)

// A node creates no UpgradeBundle (docs/security.md, "How many objects
// one node can create"): the administrator does, with ferry approve or
// oc apply. Until the active bundle's exists, the node follows its own
// config (approval, schedule), and what it would write there is on its
// own Node (ferry.io/* annotations, the ferry.io/phase label: the status
// line) and in its Events about that name, which oc get events lists
// with no resource to hang them on.

// reportWithoutResource is syncBundle while rep's UpgradeBundle does not
// exist: the phase Events only, and a log line once per name.
func (a *Agent) reportWithoutResource(ctx context.Context, api BundleAPI, rep *bundleReport, lastPhase map[string]string) error {
	if key := "absent/" + rep.name; lastPhase[key] == "" {
		a.log.Info("no UpgradeBundle for this bundle: the administrator creates it (ferry approve with the engineer's .sha256, or oc apply); until then this node reports on its Node and in Events",
			"bundle", rep.name)
		lastPhase[key] = "logged"
	}
	return a.phaseEvents(ctx, api, rep, "", rep.entry.Phase, lastPhase)
}

// approvalCommand is how the administrator approves the bundle file
// (upgrade-<version>-<arch>) of the UpgradeBundle name, whether or not
// that resource exists yet: ferry approve with the engineer's .sha256,
// which creates it or writes its spec. d, this node's digest, is given to
// compare with, never to paste: a node's word can be forged.
func approvalCommand(name, file string, d digest.Digest) string {
	return fmt.Sprintf("waiting for approval: ferry approve %s.sha256 with the engineer's file (it creates UpgradeBundle %s, or writes its spec.approvedDigest), "+
		"never with a digest from this node: this node read %s, compare it (or add the engineer's digest to approved_digests and restart ferry)", file, name, d)
}
