package create

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	//lint:ignore SA1019 the format Red Hat's release signatures are in
	"golang.org/x/crypto/openpgp" //nolint:staticcheck

	"github.com/ferry-edge/ferry/bundle"
	"github.com/ferry-edge/ferry/hop"
)

// A bundle of several releases (Options.Releases) holds every image of
// each once and a path through them in version order, each hop one the
// version operator accepts (hop.CheckPath): the cluster takes them one
// after another from one stick.

// pathRelease is one release of the bundle and what it holds.
type pathRelease struct {
	ref  *imageRef
	info *releaseInfo
}

// givenReleases are the releases Options names: Releases, else Release.
func (o *Options) givenReleases() []string {
	if len(o.Releases) > 0 {
		return o.Releases
	}
	return []string{o.Release}
}

func (c *creator) parseReleases() ([]*imageRef, error) {
	given := c.o.givenReleases()
	if len(given) > 1 && c.o.Version != "" {
		return nil, fmt.Errorf("%w: --version names one release; with several --release, each release's own %s gives its version: drop --version", ErrRelease, bundle.ReleaseMetadataPath)
	}
	var out []*imageRef
	seen := map[string]bool{}
	for _, s := range given {
		r, err := c.parseRef(s)
		if err != nil {
			return nil, fmt.Errorf("--release: %w", err)
		}
		if seen[r.String()] {
			return nil, fmt.Errorf("%w: --release %s given twice", ErrRelease, s)
		}
		seen[r.String()] = true
		out = append(out, r)
	}
	return out, nil
}

// inspectPath reads every release and orders them by version; the last
// is the bundle's own, whose version it returns.
func (c *creator) inspectPath(ctx context.Context, rels []*imageRef) ([]pathRelease, string, error) {
	archGiven := c.arch != ""
	var path []pathRelease
	for i, r := range rels {
		info, err := c.inspectRelease(ctx, r)
		if err != nil {
			return nil, "", err
		}
		if i > 0 && !archGiven && info.Arch != "" && info.Arch != c.arch {
			return nil, "", fmt.Errorf("%w: release %s is for %s, release %s for %s: a path is for one architecture", ErrRelease, r, info.Arch, rels[0], c.arch)
		}
		path = append(path, pathRelease{ref: r, info: info})
	}
	if len(path) == 1 {
		v, err := c.releaseVersion(path[0])
		return path, v, err
	}
	for _, p := range path {
		if _, ok := hop.Parse(p.info.Version); !ok {
			return nil, "", fmt.Errorf("%w: release %s gives version %q in %s, not major.minor.patch: a path needs each release's version", ErrRelease, p.ref, p.info.Version, bundle.ReleaseMetadataPath)
		}
	}
	slices.SortStableFunc(path, func(a, b pathRelease) int {
		va, _ := hop.Parse(a.info.Version)
		vb, _ := hop.Parse(b.info.Version)
		return va.Compare(vb)
	})
	var versions []string
	for i, p := range path {
		if i > 0 && p.info.Version == path[i-1].info.Version {
			return nil, "", fmt.Errorf("%w: releases %s and %s are both %s", ErrRelease, path[i-1].ref, p.ref, p.info.Version)
		}
		versions = append(versions, p.info.Version)
	}
	if err := hop.CheckPath(versions[0], versions[1:]); err != nil {
		return nil, "", fmt.Errorf("%w: the releases make the path %s, which the cluster would refuse: %v", ErrRelease, strings.Join(versions, " → "), err)
	}
	return path, versions[len(versions)-1], nil
}

// releaseVersion is the version of a bundle of one release: --version,
// which must agree with the release's own.
func (c *creator) releaseVersion(p pathRelease) (string, error) {
	version, rel, info := c.o.Version, p.ref, p.info
	switch {
	case version == "" && info.Version == "":
		return "", fmt.Errorf("%w: %s has no version in %s: pass --version", ErrRelease, rel, bundle.ReleaseMetadataPath)
	case version == "":
		version = info.Version
	case info.Version != "" && info.Version != version:
		// The version operator downloads the release, reads its version
		// and refuses it when desiredUpdate's (this one) differs: the
		// bundle would load everywhere and then never upgrade.
		return "", fmt.Errorf("%w: --version %s, but release %s says it is %s (%s): the cluster version operator would refuse it after downloading it; drop --version, or give the release image of %s",
			ErrRelease, version, rel, info.Version, bundle.ReleaseMetadataPath, version)
	}
	return version, nil
}

// pathMetadata fills meta's path and signatures: the last release's
// signatures are meta's own, each earlier hop carries its own.
func (c *creator) pathMetadata(ctx context.Context, meta *bundle.Metadata, path []pathRelease) {
	last := path[len(path)-1]
	meta.ReleaseSignatures = c.releaseSignatures(ctx, last.ref.digest)
	if len(path) == 1 {
		return
	}
	for _, p := range path[:len(path)-1] {
		meta.Path = append(meta.Path, bundle.Hop{Version: p.info.Version, Release: p.ref.String(), ReleaseSignatures: c.releaseSignatures(ctx, p.ref.digest)})
	}
	meta.Path = append(meta.Path, bundle.Hop{Version: meta.Version, Release: meta.Release})
}

// checkSignatureFiles refuses, for a path, a --release-signature that
// signs none of its releases: each file goes with the release whose
// digest it signs.
func (c *creator) checkSignatureFiles(path []pathRelease) error {
	if len(path) == 1 {
		return nil
	}
	for i, b := range c.o.ReleaseSignatures {
		d, err := signedManifestDigest(b)
		if err != nil {
			return fmt.Errorf("%w: --release-signature #%d: %v", ErrRelease, i+1, err)
		}
		if !slices.ContainsFunc(path, func(p pathRelease) bool { return p.ref.digest == d }) {
			return fmt.Errorf("%w: --release-signature #%d signs %s, none of the releases given: give the signatures of these releases", ErrRelease, i+1, d)
		}
	}
	return nil
}

// signedManifestDigest is the manifest digest a release signature (an
// OpenPGP signed message holding simple-signing JSON) names, read
// without verifying it: the version operator verifies it on the cluster.
func signedManifestDigest(b []byte) (string, error) {
	md, err := openpgp.ReadMessage(bytes.NewReader(b), openpgp.EntityList{}, nil, nil)
	if err != nil {
		return "", fmt.Errorf("not an OpenPGP signed message: %v", err)
	}
	body, err := io.ReadAll(io.LimitReader(md.UnverifiedBody, 1<<20))
	if err != nil {
		return "", fmt.Errorf("reading the signed message: %v", err)
	}
	var p struct {
		Critical struct {
			Image struct {
				DockerManifestDigest string `json:"docker-manifest-digest"`
			} `json:"image"`
		} `json:"critical"`
	}
	if err := json.Unmarshal(body, &p); err != nil || p.Critical.Image.DockerManifestDigest == "" {
		return "", fmt.Errorf("the signed message names no docker-manifest-digest")
	}
	return p.Critical.Image.DockerManifestDigest, nil
}
