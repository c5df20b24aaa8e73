package create_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/bundle/create"
	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/test/fixture"
)

// A bundle one node made of an UpgradeBundle's spec.source is approved on
// the others when it is the bundle that node published (its digest, in
// its own entry) and by what it holds: an offer of that release with the
// extras asked for is approved (ApprovalSource) before a byte is fetched,
// and the extraction then holds every image to the release's
// image-references and the extras asked for, a tag to the digest the
// puller published. An image nobody asked for is refused, and so is an
// offer of another release, missing an extra, of a bundle the puller did
// not publish, or whose tag resolved otherwise.
func TestSource_ApprovesTheReleaseAskedForAndNothingMore(t *testing.T) {
	reg := fixture.NewRegistry(t)
	reg.PushImage(t, "my-company/my-workload", "v1")
	release, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 3})
	other, _ := reg.PushRelease(t, fixture.ReleaseOptions{PayloadImages: 3, Seed: 9})
	extra := "quay.io/my-company/my-workload:v1"
	res, err := create.Run(t.Context(), createFrom(t, reg, release, extra))
	if err != nil {
		t.Fatal(err)
	}
	meta := res.Metadata
	src := bundle.Source{Path: res.TarPath, SHA256Path: res.SHA256Path}
	var resolved digest.Digest
	for _, img := range meta.Images {
		if d, ok := strings.CutPrefix(img, extra+"@"); ok {
			resolved = digest.Digest(d)
		}
	}
	pinned := map[string]digest.Digest{extra: resolved}
	asked := bundle.ReleaseSource{Release: release, Extras: []string{extra}, Digest: res.Digest, Resolved: pinned}
	pol := bundle.Policy{Arch: meta.Arch, Required: true, ApprovedSources: []bundle.ReleaseSource{asked}}

	if ap, err := bundle.ApproveOffer(pol, meta, res.Digest, nil); err != nil || ap != bundle.ApprovalSource {
		t.Fatalf("the release asked for: %v, %v", ap, err)
	}
	for name, s := range map[string]bundle.ReleaseSource{
		"another release":   {Release: other, Extras: []string{extra}, Digest: res.Digest},
		"an extra it lacks": {Release: release, Extras: []string{extra, "quay.io/my-company/other:v2"}, Digest: res.Digest},
		"nothing published": {Release: release, Extras: []string{extra}},
		"another bundle published": {Release: release, Extras: []string{extra}, Resolved: pinned,
			Digest: digest.Digest("sha256:" + strings.Repeat("0", 64))},
		"the tag resolved otherwise": {Release: release, Extras: []string{extra}, Digest: res.Digest,
			Resolved: map[string]digest.Digest{extra: digest.Digest("sha256:" + strings.Repeat("1", 64))}},
	} {
		p := pol
		p.ApprovedSources = []bundle.ReleaseSource{s}
		if _, err := bundle.ApproveOffer(p, meta, res.Digest, nil); !errors.Is(err, bundle.ErrNotApproved) {
			t.Errorf("%s: offer approved (%v)", name, err)
		}
	}

	extract := func(payload bundle.ReleaseSource) error {
		p := pol.PreApproved(res.Digest)
		p.Payload = &payload
		_, err := bundle.Extract(t.Context(), src, filepath.Join(t.TempDir(), "out"), bundle.Options{Policy: p})
		return err
	}
	if err := extract(asked); err != nil {
		t.Fatalf("the release and the extra asked for: %v", err)
	}
	// The same bundle held to a source that did not ask for the extra: the
	// node that made it added an image nobody asked for.
	err = extract(bundle.ReleaseSource{Release: release})
	if !errors.Is(err, bundle.ErrNotApproved) || !strings.Contains(err.Error(), "my-company/my-workload") {
		t.Fatalf("an image nobody asked for: %v", err)
	}
	// Held to a tag the puller resolved otherwise: refused.
	moved := asked
	moved.Resolved = map[string]digest.Digest{extra: digest.Digest("sha256:" + strings.Repeat("1", 64))}
	if err := extract(moved); !errors.Is(err, bundle.ErrNotApproved) {
		t.Fatalf("an extra whose tag the puller resolved otherwise: %v", err)
	}
}
