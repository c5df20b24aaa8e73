package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/approve"
	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/cluster"
	"github.com/ferry-edge/ferry/internal/digest"
)

// fakeApprovals is the cluster as ferry approve writes it: the spec the
// UpgradeBundle held, and the releases approved.
type fakeApprovals struct {
	others   []cluster.Approval // the other UpgradeBundles' approvals
	before   *cluster.BundlePolicy
	bundles  map[string]digest.Digest
	releases map[string]bool // by key, sha256-<hex>
}

func (f *fakeApprovals) ApproveBundle(_ context.Context, name string, d digest.Digest, _ string) (*cluster.BundlePolicy, error) {
	f.bundles[name] = d
	return f.before, nil
}

func (f *fakeApprovals) Approvals(context.Context) ([]cluster.Approval, error) { return f.others, nil }

func (f *fakeApprovals) ApproveRelease(_ context.Context, key, _ string) (bool, error) {
	already := f.releases[key]
	f.releases[key] = true
	return already, nil
}

const approveHex = "3f5a3f5a3f5a3f5a3f5a3f5a3f5a3f5a3f5a3f5a3f5a3f5a3f5a3f5a3f5a3f5a"

// approveDir is a directory with the engineer's .sha256 file, and the
// bundle beside it when withTar.
func approveDir(t *testing.T, withTar bool) (*fakeApprovals, string) {
	t.Helper()
	dir := t.TempDir()
	if withTar {
		tar, _ := seedTar(t, seedShaped)
		b, err := os.ReadFile(tar)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "upgrade-4.13.7-x86_64.tar"), b, 0o644)
	}
	os.WriteFile(filepath.Join(dir, "upgrade-4.13.7-x86_64.sha256"), []byte(bundle.FormatSHA256File(approveHex, "upgrade-4.13.7-x86_64.tar")), 0o644)
	return &fakeApprovals{bundles: map[string]digest.Digest{}, releases: map[string]bool{}}, dir
}

// runApproveWith runs ferry approve on dir's .sha256 file; the output
// names dir as ".", the same on every run.
func runApproveWith(t *testing.T, f *fakeApprovals, dir string, flags approveFlags) (string, error) {
	var b bytes.Buffer
	err := runApprove(context.Background(), &b, filepath.Join(dir, "upgrade-4.13.7-x86_64.sha256"), flags, func(string) (approve.API, error) { return f, nil })
	return strings.ReplaceAll(b.String(), dir, "."), err
}

func TestApprove_Golden(t *testing.T) {
	for _, tc := range []struct {
		format, file string
		withTar      bool
	}{
		{outText, "approve.txt", true}, {outJSON, "approve.json", true}, {outYAML, "approve.yaml", true}, {outText, "approve-no-bundle.txt", false},
	} {
		t.Run(tc.file, func(t *testing.T) {
			f, dir := approveDir(t, tc.withTar)
			var flags approveFlags
			flags.out.format, flags.schedule = tc.format, "Manual"
			out, err := runApproveWith(t, f, dir, flags)
			if err != nil {
				t.Fatal(err)
			}
			if f.bundles["4.13.7-x86-64"] != "sha256:"+approveHex {
				t.Errorf("approved %v, want 4.13.7-x86-64 at the engineer's digest", f.bundles)
			}
			if f.releases["sha256-"+strings.Repeat("ab", 32)] != tc.withTar {
				t.Errorf("release approved: %v, want %v (the bundle beside the .sha256: %v)", f.releases, tc.withTar, tc.withTar)
			}
			golden(t, tc.file, []byte(out))
		})
	}
}

// TestApprove_SaysWhatItReplacedAndWhatWasThere: an UpgradeBundle that
// approved another digest, a release approved before, and another
// UpgradeBundle approving this digest under another name, are said.
func TestApprove_SaysWhatItReplacedAndWhatWasThere(t *testing.T) {
	f, dir := approveDir(t, true)
	f.before = &cluster.BundlePolicy{ApprovedDigest: "sha256:" + strings.Repeat("cd", 32)}
	f.releases["sha256-"+strings.Repeat("ab", 32)] = true
	f.others = []cluster.Approval{{Bundle: "4.13.7-amd64", Digest: approveHex}, {Bundle: "4.13.6-x86-64", Digest: "sha256:" + strings.Repeat("cd", 32)}}
	out, err := runApproveWith(t, f, dir, approveFlags{})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"upgradebundle 4.13.7-x86-64 updated", "it approved sha256:cdcdcdcdcdcd before", "already approved",
		"note: upgradebundle 4.13.7-amd64 approves this digest too but counts for nothing (only 4.13.7-x86-64 does): delete it"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestApprove_BadInputSaysWhatToDo: a file that is no .sha256, a bundle
// that is not the one the file names, a schedule the CRD refuses: each
// refused before the cluster is touched, saying what to give.
func TestApprove_BadInputSaysWhatToDo(t *testing.T) {
	f, dir := approveDir(t, false)
	os.WriteFile(filepath.Join(dir, "bad.sha256"), []byte("not a digest\n"), 0o644)
	other, _ := seedTar(t, strings.Replace(seedShaped, "4.13.7", "4.13.8", 1))
	for _, tc := range []struct {
		file  string
		flags approveFlags
		want  string
	}{
		{"bad.sha256", approveFlags{}, "not a .sha256 file in sha256sum format"},
		{"upgrade-4.13.7-x86_64.sha256", approveFlags{bundle: other}, "give the .sha256 file that came with this bundle"},
		{"upgrade-4.13.7-x86_64.sha256", approveFlags{schedule: "manual"}, "want Automatic or Manual"},
		{"missing.sha256", approveFlags{}, "reading the engineer's .sha256 file"},
	} {
		var b bytes.Buffer
		err := runApprove(context.Background(), &b, filepath.Join(dir, tc.file), tc.flags, func(string) (approve.API, error) { return f, nil })
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, new(usageErr)) {
			t.Errorf("%s %+v: %v, want a usage error saying %q", tc.file, tc.flags, err, tc.want)
		}
	}
	if len(f.bundles) > 0 {
		t.Errorf("bad input wrote %v", f.bundles)
	}
}
