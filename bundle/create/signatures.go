package create

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// DefaultSignatureStore is the public store of OpenShift release
// signatures.
const DefaultSignatureStore = "https://mirror.openshift.com/pub/openshift-v4/signatures/openshift/release"

// maxSignatures bounds how many signature-N a store is asked for.
const maxSignatures = 16

// FetchSignatures gets the signatures of the release image with digest
// from a signature store: <store>/sha256=<hex>/signature-1, -2, … until
// the first 404.
func FetchSignatures(ctx context.Context, hc *http.Client, store, digest string) ([][]byte, error) {
	hex, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || !sha256digest.Valid(digest) {
		return nil, fmt.Errorf("release digest %q is not sha256:<64 hex>", digest)
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	var out [][]byte
	for i := 1; i <= maxSignatures; i++ {
		u := fmt.Sprintf("%s/sha256=%s/signature-%d", strings.TrimSuffix(store, "/"), hex, i)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return out, fmt.Errorf("signature store %s: %w", store, err)
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusNotFound:
			return out, nil
		case resp.StatusCode != http.StatusOK:
			return out, fmt.Errorf("signature store %s: %s for %s", store, resp.Status, u)
		case err != nil:
			return out, fmt.Errorf("signature store %s: %w", store, err)
		case len(b) == 0:
			return out, errors.New("signature store " + store + ": empty signature-" + fmt.Sprint(i))
		}
		out = append(out, b)
	}
	return out, nil
}

// releaseSignatures are the signatures the bundle carries: those given,
// or those the store has. Without any, the cluster half of the upgrade
// will be refused by a disconnected cluster: said loudly, not a failure.
func (c *creator) releaseSignatures(ctx context.Context, digest string) [][]byte {
	var sigs [][]byte
	switch {
	case len(c.o.ReleaseSignatures) > 0 && len(c.o.givenReleases()) == 1:
		return c.o.ReleaseSignatures
	case len(c.o.ReleaseSignatures) > 0:
		// A path: each file goes with the release it signs.
		for _, b := range c.o.ReleaseSignatures {
			if d, err := signedManifestDigest(b); err == nil && d == digest {
				sigs = append(sigs, b)
			}
		}
	case c.o.SignatureStore != "":
		hc := c.o.SignatureClient
		if hc == nil {
			hc = &http.Client{Timeout: 20 * time.Second}
		}
		var err error
		sigs, err = FetchSignatures(ctx, hc, c.o.SignatureStore, digest)
		if err != nil {
			c.log.Warn("WARNING: the release signature store cannot be read; the bundle is made without the signatures it could not get", "store", c.o.SignatureStore, "err", err)
		}
	}
	if len(sigs) == 0 {
		c.log.Warn("WARNING: the bundle carries NO release signature: a disconnected cluster's version operator will refuse this release; give --release-signature FILE or a reachable --signature-store", "release", digest)
	}
	return sigs
}
