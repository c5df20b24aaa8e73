// Package approve is the administrator's approval of a bundle (ferry
// approve FILE.sha256), before the stick or after: from the engineer's
// files it derives the UpgradeBundle's name and the digest to approve,
// writes them into that UpgradeBundle (creating it: a node never does,
// docs/security.md, "How many objects one node can create"), and, when
// the bundle itself is at hand to read its release, approves that release
// in the admission ConfigMap. Only the engineer's files are read: never a
// digest a node reports (docs/admin.md, "Approval").
package approve

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ferry-edge/ferry/agent"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/kube"
)

// Schedules an approval may set (the CRD's spec.schedule).
var Schedules = []string{"Automatic", "Manual"}

// Plan is what the engineer's files say to approve.
type Plan struct {
	Name    string        `json:"name"`   // the UpgradeBundle's (agent.ResourceName)
	Digest  digest.Digest `json:"digest"` // the bundle's, from the .sha256 file
	Version string        `json:"version"`
	Arch    string        `json:"arch"`
	// Bundle is the tar read for its metadata ("" when none was found).
	Bundle string `json:"bundle,omitempty"`
	// Release is the release image by digest, from the bundle's
	// metadata.json ("" without the bundle).
	Release  string `json:"release,omitempty"`
	Schedule string `json:"schedule,omitempty"`
}

// Read derives the plan from sha256File, the engineer's
// upgrade-<version>-<arch>.sha256, and the bundle tar: tar when given,
// else the one the file names if it sits beside it. Without a tar, the
// version and arch come from the tar's name in the file.
func Read(sha256File, tar, schedule string) (Plan, error) {
	if schedule != "" && !slices.Contains(Schedules, schedule) {
		return Plan{}, fmt.Errorf("--schedule %q: want Automatic or Manual", schedule)
	}
	b, err := os.ReadFile(sha256File)
	if err != nil {
		return Plan{}, fmt.Errorf("reading the engineer's .sha256 file: %w", err)
	}
	tarName, err := tarNamed(b, sha256File)
	if err != nil {
		return Plan{}, err
	}
	d, err := bundle.ParseSHA256Line(b, tarName)
	if err != nil {
		return Plan{}, fmt.Errorf("%s: %w", sha256File, err)
	}
	p := Plan{Digest: d, Schedule: schedule}
	if tar == "" {
		if beside := filepath.Join(filepath.Dir(sha256File), tarName); isFile(beside) {
			tar = beside
		}
	}
	if tar == "" {
		// upgrade-<version>-<arch>.tar, as ferry bundle create names it;
		// an arch has no "-".
		base, ok := strings.CutPrefix(strings.TrimSuffix(tarName, ".tar"), "upgrade-")
		i := strings.LastIndex(base, "-")
		if !ok || !strings.HasSuffix(tarName, ".tar") || i <= 0 || i == len(base)-1 {
			return Plan{}, fmt.Errorf("%s names %q, not upgrade-<version>-<arch>.tar: give the bundle too (--bundle PATH) so that its metadata.json says the version and arch", sha256File, tarName)
		}
		p.Version, p.Arch = base[:i], base[i+1:]
	} else {
		md, err := bundle.InspectFile(tar)
		if err != nil {
			return Plan{}, fmt.Errorf("reading the bundle's metadata.json: %w", err)
		}
		if md.Name()+".tar" != tarName {
			return Plan{}, fmt.Errorf("%s is the bundle %s (metadata.json), but %s is the digest of %s: give the .sha256 file that came with this bundle", tar, md.Name(), sha256File, tarName)
		}
		p.Bundle, p.Version, p.Arch, p.Release = tar, md.Version, md.Arch, md.Release
	}
	p.Name = agent.ResourceName(p.Version, p.Arch)
	return p, nil
}

// tarNamed is the tar's name on the .sha256 file's first line.
func tarNamed(b []byte, path string) (string, error) {
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimRight(line, "\r")
	if len(line) < 67 || (line[64:66] != "  " && line[64:66] != " *") {
		return "", fmt.Errorf("%s is not a .sha256 file in sha256sum format (64 hex digits, two spaces, the tar's name): give the upgrade-<version>-<arch>.sha256 the engineer sent", path)
	}
	return line[66:], nil
}

// API is what an approval writes (kube.Client with the administrator's
// kubeconfig).
type API interface {
	ApproveBundle(ctx context.Context, name string, d digest.Digest, schedule string) (*cluster.BundlePolicy, error)
	ApproveRelease(ctx context.Context, key, note string) (already bool, err error)
	// Approvals is every UpgradeBundle's spec.approvedDigest.
	Approvals(ctx context.Context) ([]cluster.Approval, error)
}

var _ API = (*kube.Client)(nil)

// Result is what an approval did.
type Result struct {
	Plan Plan `json:"plan"`
	// UpgradeBundle is "created" (no node had the bundle yet) or
	// "updated"; Replaced is the digest the spec approved before, when
	// it was another.
	UpgradeBundle string        `json:"upgradeBundle"`
	Replaced      digest.Digest `json:"replaced,omitempty"`
	// Release is "approved", "already approved", or "not approved".
	Release    string `json:"release"`
	ReleaseKey string `json:"releaseKey,omitempty"` // its key in ConfigMap openshift-ferry/ferry-admission
	// Needed says what else the administrator must do (empty: nothing).
	Needed string `json:"needed,omitempty"`
	// Strays are the other UpgradeBundles that approve this digest: they
	// count for nothing (only Plan.Name's does) and are best deleted.
	Strays []string `json:"strays,omitempty"`
}

// Apply writes the plan: the UpgradeBundle's spec, then the release's
// approval when the plan knows the release.
func Apply(ctx context.Context, api API, p Plan) (Result, error) {
	res := Result{Plan: p, UpgradeBundle: "created", Release: "not approved"}
	before, err := api.ApproveBundle(ctx, p.Name, p.Digest, p.Schedule)
	if err != nil {
		return res, err
	}
	if before != nil {
		res.UpgradeBundle = "updated"
		if old := bundle.NormalizeDigest(before.ApprovedDigest); old != "" && old != p.Digest {
			res.Replaced = old
		}
	}
	aps, err := api.Approvals(ctx)
	if err != nil {
		return res, err
	}
	for _, ap := range aps {
		if ap.Bundle != p.Name && bundle.NormalizeDigest(ap.Digest) == p.Digest {
			res.Strays = append(res.Strays, ap.Bundle)
		}
	}
	key, byDigest := cluster.ApprovalKey(p.Release)
	switch {
	case p.Bundle == "":
		res.Needed = fmt.Sprintf("the release is not approved yet: run ferry approve again with the bundle (--bundle upgrade-%s-%s.tar) so that it reads the release from its metadata.json, "+
			`or approve it by hand: oc -n %s patch configmap %s --type merge -p '{"data":{"sha256-<release hex>":"approved"}}' with the release digest the engineer's ferry bundle verify printed`,
			p.Version, p.Arch, kube.AdmissionNamespace, kube.AdmissionConfigMap)
	case !byDigest:
		res.Needed = fmt.Sprintf("the bundle's release %q names no digest, so no release can be approved for it: ask the engineer for a bundle made with ferry bundle create", p.Release)
	default:
		res.ReleaseKey = key
		already, err := api.ApproveRelease(ctx, key, "approved "+p.Version)
		if err != nil {
			return res, err
		}
		res.Release = "approved"
		if already {
			res.Release = "already approved"
		}
	}
	return res, nil
}

func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// ErrNoKubeconfig: no kubeconfig was given and none is in the usual places.
var ErrNoKubeconfig = errors.New("no kubeconfig")

// Kubeconfig is the administrator's kubeconfig: flag, else $KUBECONFIG
// (its first file), else ~/.kube/config.
func Kubeconfig(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if env := os.Getenv("KUBECONFIG"); env != "" {
		first, _, _ := strings.Cut(env, string(os.PathListSeparator))
		return first, nil
	}
	if home, err := os.UserHomeDir(); err == nil && isFile(filepath.Join(home, ".kube", "config")) {
		return filepath.Join(home, ".kube", "config"), nil
	}
	return "", fmt.Errorf("%w: give the administrator's with --kubeconfig or KUBECONFIG (e.g. the installer's auth/kubeconfig)", ErrNoKubeconfig)
}
