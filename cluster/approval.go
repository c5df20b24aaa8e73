package cluster

import (
	"errors"
	"strings"

	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// ErrReleaseUnapproved: the API server refused ferry's signatures or
// desiredUpdate because the administrator has not approved the release
// in ConfigMap openshift-ferry/ferry-admission (packaging/admission.yaml,
// ferry-release-signatures and ferry-clusterversion). A person must act:
// ApproveCommand says how.
var ErrReleaseUnapproved = errors.New("the administrator has not approved this release in openshift-ferry/ferry-admission")

// ApprovalKey is the data key of ConfigMap openshift-ferry/ferry-admission
// that approves release (name@sha256:<hex>): "sha256-<hex>", the name
// of its signature ConfigMap too. false when release is not by digest.
func ApprovalKey(release string) (string, bool) {
	i := strings.LastIndex(release, "@")
	if i < 0 || !sha256digest.Valid(release[i+1:]) {
		return "", false
	}
	return "sha256-" + strings.TrimPrefix(release[i+1:], "sha256:"), true
}

// ApproveCommand is the one command with which the administrator
// approves release for the cluster upgrade; admission.yaml's refusals
// print the same. "" when release is not by digest.
func ApproveCommand(release string) string {
	key, ok := ApprovalKey(release)
	if !ok {
		return ""
	}
	return `oc -n openshift-ferry patch configmap ferry-admission --type merge -p '{"data":{"` + key + `":"approved"}}'`
}
