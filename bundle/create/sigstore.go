package create

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	godigest "github.com/opencontainers/go-digest"

	"golang.org/x/sync/errgroup"

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/internal/digest"
)

// Which images' sigstore attachments Run copies
// (Options.Signatures). The release's are always copied: OpenShift
// 4.21+ nodes refuse the release image without one.
const (
	// SignaturesAll copies the attachments of every image that has any.
	SignaturesAll = "all"
	// SignaturesRelease copies only the release image's.
	SignaturesRelease = "release"
)

// planSignatures finds the sigstore attachments (cosign's
// <name>:sha256-<hex>.sig tag, and sigstore artifacts among the OCI
// referrers) of every manifest the plans copy, the
// release's always and the others' unless o.Signatures says release only,
// and returns them as plans of their own. An image with none has none:
// that is not an error here; the node's policy decides at plug time.
func (c *creator) planSignatures(ctx context.Context, plans []*imagePlan) ([]*imagePlan, error) {
	type probe struct {
		of  *imagePlan
		tag string
	}
	var probes []probe
	seen := map[string]bool{}
	for i, p := range plans {
		if i > 0 && c.o.Signatures == SignaturesRelease {
			break
		}
		for _, m := range p.manifests {
			key := p.ref.name + ":" + bundle.SignatureTag(m.digest.String())
			if !seen[key] {
				seen[key] = true
				probes = append(probes, probe{of: p, tag: bundle.SignatureTag(m.digest.String())})
			}
		}
	}
	found := make([]*imagePlan, len(probes))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i, pr := range probes {
		g.Go(func() error {
			r := &imageRef{name: pr.of.ref.name, tag: pr.tag, fetch: pr.of.ref.fetch}
			sp, err := c.plan(gctx, r)
			if errors.Is(err, ErrNotFound) {
				return nil // not signed
			}
			if err != nil {
				return err
			}
			found[i] = sp
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	refs := make([]*imagePlan, len(probes))
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i, pr := range probes {
		g.Go(func() error {
			d, _ := bundle.SignedDigest(pr.tag)
			rp, err := c.planReferrers(gctx, pr.of, string(d))
			refs[i] = rp
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(append(found, refs...), func(p *imagePlan) bool { return p == nil }), nil
}

// isSigstoreArtifact tells a sigstore signature or bundle among an
// image's referrers (SBOMs, attestations of other kinds stay behind).
func isSigstoreArtifact(artifactType string) bool {
	return strings.HasPrefix(artifactType, "application/vnd.dev.sigstore.bundle") ||
		strings.HasPrefix(artifactType, "application/vnd.dev.cosign")
}

// planReferrers copies the sigstore artifacts among manifest d's OCI
// referrers, where the source offers them (the Referrers API, or its
// sha256-<hex> tag schema), as one plan: each artifact, then an index of
// them tagged sha256-<hex>, the tag schema the embedded registry serves
// them by (distribution has no Referrers API). nil when there are none.
func (c *creator) planReferrers(ctx context.Context, of *imagePlan, d string) (*imagePlan, error) {
	idx, err := remote.Referrers(of.ref.fetch.Digest(d), remote.Reuse(c.puller), remote.WithContext(ctx))
	if err != nil {
		c.log.Debug("no referrers", "image", of.ref.String(), "manifest", d, "err", err)
		return nil, nil // a source that offers none has none
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, nil
	}
	plan := &imagePlan{ref: &imageRef{name: of.ref.name, tag: bundle.ReferrersTag(d), fetch: of.ref.fetch}, repo: of.repo}
	var kept []v1.Descriptor
	for _, desc := range im.Manifests {
		t := desc.ArtifactType
		if t == "" {
			t = string(desc.MediaType)
		}
		if !isSigstoreArtifact(t) {
			continue
		}
		ap, err := c.plan(ctx, &imageRef{name: of.ref.name, digest: desc.Digest.String(), fetch: of.ref.fetch})
		if err != nil {
			return nil, err
		}
		plan.blobs = append(plan.blobs, ap.blobs...)
		plan.manifests = append(plan.manifests, ap.manifests...)
		kept = append(kept, desc)
	}
	if len(kept) == 0 {
		return nil, nil
	}
	body, err := json.Marshal(v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex, Manifests: kept})
	if err != nil {
		return nil, err
	}
	id := digest.Digest(godigest.FromBytes(body))
	plan.manifests = append(plan.manifests, rawManifest{mediaType: string(types.OCIImageIndex), body: body, digest: id})
	plan.ref.digest = id.String()
	return plan, nil
}
