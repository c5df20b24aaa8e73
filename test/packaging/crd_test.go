package packaging

import (
	"slices"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
)

// The UpgradeBundle's status.approved takes every value the summary
// writer writes (agent.bundleSummary): each way a bundle is approved but
// "none" (written as waiting for approval), and the two words of its
// own. A value missing here is a summary write the API server refuses
// (422), as "source" was while a node fetched the puller's bundle.
func TestCRD_StatusApprovedTakesEveryApprovalTheAgentWrites(t *testing.T) {
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema struct {
						Properties map[string]struct {
							Properties map[string]struct {
								Enum []string `yaml:"enum"`
							} `yaml:"properties"`
						} `yaml:"properties"`
					} `yaml:"openAPIV3Schema"`
				} `yaml:"schema"`
			} `yaml:"versions"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal([]byte(repoFile(t, "packaging/upgradebundle-crd.yaml")), &crd); err != nil {
		t.Fatal(err)
	}
	if len(crd.Spec.Versions) == 0 {
		t.Fatal("the CRD has no version")
	}
	for _, v := range crd.Spec.Versions {
		enum := v.Schema.OpenAPIV3Schema.Properties["status"].Properties["approved"].Enum
		for _, want := range []string{string(bundle.ApprovalDigest), string(bundle.ApprovalSignature), string(bundle.ApprovalPeer),
			string(bundle.ApprovalSource), string(bundle.ApprovalOff), agent.ApprovedWaiting, agent.ApprovedDisagree} {
			if !slices.Contains(enum, want) {
				t.Errorf("status.approved's enum %q lacks %q, which the agent writes", enum, want)
			}
		}
	}
}
