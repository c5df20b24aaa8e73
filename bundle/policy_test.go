package bundle_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/bundletest"
)

func TestPolicy_APeersApprovedDigestIsApprovedAndSaysSo(t *testing.T) {
	p, digest := bundletest.Write(t, t.TempDir(), bundletest.Options{})
	src, err := bundle.FindSource(p, "")
	if err != nil {
		t.Fatal(err)
	}
	pol := bundle.Policy{ApprovedDigests: []string{"sha256:" + strings.Repeat("0", 64)}, SpaceFactor: -1}
	if _, err := bundle.Verify(t.Context(), src, bundle.Options{Policy: pol}); !errors.Is(err, bundle.ErrNotApproved) {
		t.Fatalf("not approved here: %v", err)
	}
	meta, err := bundle.InspectFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pol.ApproveOffer(meta, digest); !errors.Is(err, bundle.ErrNotApproved) {
		t.Fatalf("an offer of an unapproved digest: %v", err)
	}
	pol.ApprovedDigests = append(pol.ApprovedDigests, digest)
	if how, err := pol.ApproveOffer(meta, digest); err != nil || how != "digest" {
		t.Fatalf("offer: %q, %v", how, err)
	}
	res, err := bundle.Verify(t.Context(), src, bundle.Options{Policy: pol.PreApproved(digest)})
	if err != nil || res.Approval != "peer" {
		t.Fatalf("fetched: %+v, %v", res, err)
	}
	other := pol.PreApproved("sha256:" + strings.Repeat("1", 64))
	if _, err := bundle.Verify(t.Context(), src, bundle.Options{Policy: other}); !errors.Is(err, bundle.ErrNotApproved) {
		t.Fatalf("a fetched bundle whose digest is not the pre-approved one: %v", err)
	}
}
