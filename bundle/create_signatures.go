package bundle

import (
	"context"
	"errors"
	"slices"

	"golang.org/x/sync/errgroup"
)

// Which images' sigstore attachments Create copies
// (CreateOptions.Signatures). The release's are always copied: OpenShift
// 4.21+ nodes refuse the release image without one.
const (
	// SignaturesAll copies the attachments of every image that has any.
	SignaturesAll = "all"
	// SignaturesRelease copies only the release image's.
	SignaturesRelease = "release"
)

// planSignatures finds the sigstore attachments (cosign's
// <name>:sha256-<hex>.sig tag) of every manifest the plans copy, the
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
			key := p.ref.name + ":" + SignatureTag(m.digest.String())
			if !seen[key] {
				seen[key] = true
				probes = append(probes, probe{of: p, tag: SignatureTag(m.digest.String())})
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
	return slices.DeleteFunc(found, func(p *imagePlan) bool { return p == nil }), nil
}
