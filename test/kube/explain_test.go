package kube

import (
	"strings"
	"testing"
	"time"

	"github.com/ferry-edge/ferry/test/kubeenv"
)

// TestCRD_KubectlExplainPrintsTheTypesDescriptions: the CRD generated
// from api/v1alpha1 carries each field's description to the API server's
// OpenAPI, so that the real kubectl explain tells an administrator what
// spec.approvedDigest and status.conditions are (issue 43, item 2).
func TestCRD_KubectlExplainPrintsTheTypesDescriptions(t *testing.T) {
	e := kubeenv.Start(t, current)
	e.ApplyFile(repoFile("packaging/upgradebundle-crd.yaml")) // the CRD alone: no node writes here
	explain := func(field string) string {
		t.Helper()
		var out string
		var err error
		// The CRD's schema reaches the OpenAPI a moment after it serves.
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			if out, err = kubectl(t, e, "explain", field); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			t.Fatalf("kubectl explain %s: %v\n%s", field, err, out)
		}
		return strings.Join(strings.Fields(out), " ") // kubectl wraps lines
	}
	for field, want := range map[string][]string{
		"upgradebundle.spec.approvedDigest": {"approvedDigest <string>", "the bundle's sha256 digest (sha256:<64 hex>) an engineer approved",
			"only a bundle with this digest is loaded and upgraded to"},
		"upgradebundle.status.conditions": {"conditions <[]Object>", "for oc wait --for=condition=TYPE", "Approved (the bundle may load)",
			"Degraded (a person must act", "observedGeneration", "lastTransitionTime <string> -required-"},
		"ubn.status.bundles": {"the node's entries, one per UpgradeBundle", "the one it reports on now first"},
		"upgradebundlenode":  {"one node's view of the UpgradeBundles it knows", "owned by it", "ferry-<node>"},
	} {
		got := explain(field)
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("kubectl explain %s lacks %q:\n%s", field, w, got)
			}
		}
	}
}
