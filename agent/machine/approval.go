package machine

import (
	"errors"
	"strconv"
	"strings"
)

// ApprovalMode is the config's approval key: whether a bundle must be
// approved before it is loaded. How a bundle was approved is another
// value, meta.Approval.
type ApprovalMode string

const (
	// ApprovalModeRequired, the default: a bundle that neither
	// approved_digests, trusted_keys nor the cluster's UpgradeBundles
	// approve is verified, extracted and shared, never loaded.
	ApprovalModeRequired ApprovalMode = "required"
	// ApprovalModeOff: any bundle whose sha256 checks is loaded (labs
	// only; warned about at start and in the status).
	ApprovalModeOff ApprovalMode = "off"
)

// ApprovalModes are the values the approval key takes.
var ApprovalModes = []ApprovalMode{ApprovalModeRequired, ApprovalModeOff}

// ParseApprovalMode reads the approval key's value.
func ParseApprovalMode(s string) (ApprovalMode, error) {
	for _, m := range ApprovalModes {
		if s == string(m) {
			return m, nil
		}
	}
	quoted := make([]string, len(ApprovalModes))
	for i, m := range ApprovalModes {
		quoted[i] = strconv.Quote(string(m))
	}
	return "", errors.New(strconv.Quote(s) + " is not an approval mode: use " + strings.Join(quoted, " or "))
}
