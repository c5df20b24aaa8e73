package kube

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/ferry-edge/ferry/cluster"
)

// Where a disconnected cluster's version operator reads release
// signatures (docs/design.md, "Starting and
// following the upgrade").
const (
	SignatureNamespace = "openshift-config-managed"
	SignatureLabel     = "release.openshift.io/verification-signatures"
	clusterVersionPath = "/apis/config.openshift.io/v1/clusterversions/version"
)

// StartUpgrade writes the release's signatures as the ConfigMap the
// cluster version operator reads, then merge-patches ClusterVersion's
// spec.desiredUpdate. It does nothing to desiredUpdate when it already
// names the release; calling it again is harmless. Until the
// administrator approves the release in ferry-admission, the API server
// refuses both writes: the error is then cluster.ErrReleaseUnapproved.
func (c *Client) StartUpgrade(ctx context.Context, u cluster.Upgrade) error {
	hex, ok := strings.CutPrefix(u.Release[strings.LastIndex(u.Release, "@")+1:], "sha256:")
	if !ok || len(hex) != 64 {
		return fmt.Errorf("release %q is not a digest reference (name@sha256:…)", u.Release)
	}
	if len(u.Signatures) > 0 {
		if err := c.putSignatures(ctx, hex, u.Signatures); err != nil {
			return fmt.Errorf("writing the release signatures: %w", unapproved(err))
		}
	}
	cv, err := c.clusterVersion(ctx)
	if err != nil {
		return fmt.Errorf("reading clusterversion/version: %w", err)
	}
	if cv.Spec.DesiredUpdate != nil && sameRelease(cv.Spec.DesiredUpdate.Image, u.Release) {
		return nil
	}
	patch := map[string]any{"spec": map[string]any{"desiredUpdate": map[string]any{
		"image": u.Release, "version": u.Version, "force": u.Force,
	}}}
	if err := c.do(ctx, "PATCH", clusterVersionPath, mergePatch, patch, nil); err != nil {
		return fmt.Errorf("setting clusterversion/version spec.desiredUpdate: %w", unapproved(err))
	}
	return nil
}

// approvalRefusal is what packaging/admission.yaml's refusals of a
// release the administrator has not approved say (ferry-release-signatures,
// ferry-clusterversion): ferry's own policy's words, not the server's.
const approvalRefusal = "is not approved by the administrator"

// unapproved turns the API server's refusal of an unapproved release into
// cluster.ErrReleaseUnapproved, with the server's words (the command
// that approves it); any other error stays as it is.
func unapproved(err error) error {
	var a *APIError
	if errors.As(err, &a) && a.Code == http.StatusForbidden && strings.Contains(a.Message, approvalRefusal) {
		return unapprovedError{a}
	}
	return err
}

// unapprovedError is cluster.ErrReleaseUnapproved and still the 403 it
// is, without the 403's advice on RBAC, which does not apply.
type unapprovedError struct{ api *APIError }

func (e unapprovedError) Error() string {
	return cluster.ErrReleaseUnapproved.Error() + ": " + e.api.Message
}
func (e unapprovedError) Is(target error) bool { return target == cluster.ErrReleaseUnapproved }
func (e unapprovedError) Unwrap() error        { return e.api }

type configMap struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	BinaryData map[string]string `json:"binaryData"`
}

// putSignatures creates or replaces ConfigMap sha256-<hex>: binaryData
// sha256-<hex>-1, -2, …. It never reads it (ferry may not: its Role
// grants create and update only): an existing one is replaced by an
// unconditional update, which a ConfigMap accepts without a
// resourceVersion.
func (c *Client) putSignatures(ctx context.Context, hex string, sigs [][]byte) error {
	var want configMap
	want.APIVersion, want.Kind = "v1", "ConfigMap"
	want.Metadata.Name, want.Metadata.Namespace = "sha256-"+hex, SignatureNamespace
	want.Metadata.Labels = map[string]string{SignatureLabel: ""}
	want.BinaryData = map[string]string{}
	for i, s := range sigs {
		want.BinaryData[fmt.Sprintf("sha256-%s-%d", hex, i+1)] = base64.StdEncoding.EncodeToString(s)
	}
	base := "/api/v1/namespaces/" + SignatureNamespace + "/configmaps"
	for range 5 {
		err := c.do(ctx, "POST", base, jsonType, want, nil)
		if err == nil || !IsConflict(err) {
			return err
		}
		err = c.do(ctx, "PUT", base+"/"+want.Metadata.Name, jsonType, want, nil)
		if err == nil || !IsNotFound(err) {
			return err
		}
		// deleted meanwhile: create it again
	}
	return fmt.Errorf("configmap %s/sha256-%s kept vanishing under ferry: try again", SignatureNamespace, hex)
}

type condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

type clusterVersion struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Spec struct {
		DesiredUpdate *struct {
			Image   string `json:"image"`
			Version string `json:"version"`
			Force   bool   `json:"force"`
		} `json:"desiredUpdate"`
	} `json:"spec"`
	Status struct {
		Desired struct {
			Version string `json:"version"`
		} `json:"desired"`
		History []struct {
			State   string `json:"state"`
			Image   string `json:"image"`
			Version string `json:"version"`
		} `json:"history"`
		Conditions []condition `json:"conditions"`
	} `json:"status"`
}

func (c *Client) clusterVersion(ctx context.Context) (*clusterVersion, error) {
	var cv clusterVersion
	if err := c.do(ctx, "GET", clusterVersionPath, "", nil, &cv); err != nil {
		return nil, err
	}
	return &cv, nil
}

func (cv *clusterVersion) condition(t string) *condition {
	for i := range cv.Status.Conditions {
		if cv.Status.Conditions[i].Type == t {
			return &cv.Status.Conditions[i]
		}
	}
	return nil
}

// UpgradeStatus reads ClusterVersion for release.
func (c *Client) UpgradeStatus(ctx context.Context, release string) (cluster.UpgradeStatus, error) {
	cv, err := c.clusterVersion(ctx)
	if err != nil {
		return cluster.UpgradeStatus{}, err
	}
	return upgradeOf(cv, release), nil
}

// upgradeOf reads ClusterVersion as the cluster version operator writes
// it: history newest first, conditions Progressing, Failing,
// ReleaseAccepted, Upgradeable. The release is recognised by its digest
// (sameRelease), however the history or desiredUpdate spells it.
func upgradeOf(cv *clusterVersion, release string) cluster.UpgradeStatus {
	var u cluster.UpgradeStatus
	if p := cv.condition("Progressing"); p != nil {
		u.Message = p.Message
	}
	var reasons []string
	if f := cv.condition("Failing"); f != nil && f.Status == "True" {
		reasons = append(reasons, f.Message)
	}
	accepted := cv.condition("ReleaseAccepted")
	if accepted != nil && accepted.Status == "False" {
		reasons = append(reasons, accepted.Message)
	}
	if up := cv.condition("Upgradeable"); up != nil && up.Status == "False" {
		reasons = append(reasons, up.Message)
	}
	u.Reason = strings.Join(reasons, "; ")
	for i, h := range cv.Status.History {
		if !sameRelease(h.Image, release) {
			continue
		}
		if h.State == "Completed" {
			u.State = cluster.UpgradeCompleted
			return u
		}
		if i == 0 {
			u.State = cluster.UpgradeRunning
			return u
		}
	}
	desired := cv.Spec.DesiredUpdate
	switch {
	case desired == nil || !sameRelease(desired.Image, release):
		u.State = cluster.UpgradeNotAsked
	case accepted != nil && accepted.Status == "False":
		u.State = cluster.UpgradeRefused
	default:
		u.State = cluster.UpgradePending
	}
	return u
}
