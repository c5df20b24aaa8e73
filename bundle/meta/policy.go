package meta

import (
	"slices"
	"strings"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// Policy is what a bundle must satisfy to be accepted (docs/design.md, "Trust").
type Policy struct {
	// Arch is the node's architecture; "" skips the check.
	Arch string
	// ApprovedDigests and TrustedKeys approve bundles; with neither (and
	// not Required), any bundle whose sha256 checks is accepted (and a
	// warning logged): what `ferry bundle verify` does without flags.
	ApprovedDigests []string
	TrustedKeys     []TrustedKey
	// Required makes approval required even when neither approved
	// digests nor trusted keys are given: nothing is approved then (the
	// agent's default; docs/design.md, "Approval").
	Required bool
	// Off approves every bundle whose sha256 checks, whatever else is
	// set (the agent's explicit `approval = "off"`, for labs).
	Off bool
	// Unapproved lets an unapproved bundle whose .sha256 checks be
	// verified and extracted instead of refused: its Result says
	// ApprovalNone, and the caller must not load it (it may share it).
	Unapproved bool
	// SpaceFactor × sizeBytes must be free where the bundle is extracted;
	// 0 means 2. Negative skips the check (verify only).
	SpaceFactor int64
	// ApprovedByPeer is a digest this node approved before fetching it from
	// a peer (ApproveOffer): it is approved, and said to be so (ApprovalPeer).
	ApprovedByPeer digest.Digest
	// ApprovedSources are releases the administrator asked for from the
	// registry: a bundle of one (made by the node that pulled it) is
	// approved by what it holds (ApproveOffer: ApprovalSource).
	ApprovedSources []ReleaseSource
	// Payload, when set, holds the bundle to that source as it is
	// extracted: every image it lists is named by the release or asked
	// for (checkPayload).
	Payload *ReleaseSource
}

// TrustedKey is an engineer's minisign public key as its .pub file's
// second line writes it ("RWQ…"): package bundle checks signatures with
// it (bundle.TrustKey makes one); the state machine only counts them.
type TrustedKey string

// On reports whether approval is required: not Off, and Required or
// some approved digest or trusted key configured.
func (p Policy) On() bool {
	return !p.Off && (p.Required || len(p.ApprovedDigests) > 0 || len(p.TrustedKeys) > 0 || len(p.ApprovedSources) > 0)
}

// Approves reports whether digest is one of the approved digests (or
// approval is off): what lets a bundle extracted unapproved be loaded
// once the config approves it.
func (p Policy) Approves(digest digest.Digest) bool {
	if !p.On() {
		return true
	}
	for _, d := range p.ApprovedDigests {
		if NormalizeDigest(d) == digest {
			return true
		}
	}
	return false
}

// PreApproved is the policy for extracting a bundle whose digest was
// approved before it was fetched (ApproveOffer): that digest, and nothing
// else, is approved, and the result says ApprovalPeer; with approval off it
// stays off.
func (p Policy) PreApproved(digest digest.Digest) Policy {
	if p.On() {
		p.ApprovedDigests, p.TrustedKeys, p.ApprovedSources, p.ApprovedByPeer = nil, nil, nil, digest
		p.Unapproved = false
	}
	return p
}

// ReleaseSource is a release an administrator asked for from the site's
// registry (an UpgradeBundle's spec.source): the release by digest and
// extra images by tag or digest. A bundle one node made of it is approved
// on the others when it is the bundle that node published through the
// cluster's API (Digest), and then held to what it holds.
type ReleaseSource struct {
	Release string
	Extras  []string
	// Digest is the bundle the pulling node made, as it published it in
	// its own entry of the UpgradeBundle (only its credential writes
	// there); "" while it has published none: no offer is taken.
	Digest digest.Digest
	// Resolved are the digests the extras given by tag resolved to on the
	// pulling node, as it published them: a tag matches only that digest.
	Resolved map[string]digest.Digest
}

// Matches reports whether meta is a bundle of s: its release, and every
// one of its extras (the tree check then holds it to the rest).
func (s ReleaseSource) Matches(meta *Metadata) bool {
	if meta == nil || meta.Release != s.Release {
		return false
	}
	for _, e := range s.Extras {
		if !slices.ContainsFunc(meta.Images, func(img string) bool { return s.IsExtra(img, e) }) {
			return false
		}
	}
	return true
}

// IsExtra reports whether the bundle's image img is the extra image e: the
// same digest reference, or e's name:tag resolved (name:tag@sha256:…) to
// the digest the pulling node published, when it published one.
func (s ReleaseSource) IsExtra(img, e string) bool {
	if img == e {
		return true
	}
	if strings.Contains(e, "@") {
		return false
	}
	d, ok := strings.CutPrefix(img, e+"@")
	return ok && sha256digest.Valid(d) && (s.Resolved[e] == "" || digest.Digest(d) == s.Resolved[e])
}

// SourceFor is the approved source whose pulling node published dgst and
// meta is a bundle of, or nil.
func (p Policy) SourceFor(dgst digest.Digest, meta *Metadata) *ReleaseSource {
	for _, s := range p.ApprovedSources {
		if s.Digest != "" && s.Digest == dgst && s.Matches(meta) {
			return &s
		}
	}
	return nil
}

// NormalizeDigest accepts "sha256:<hex>" or "<hex>" and returns
// "sha256:<hex>", or "" when s is neither.
func NormalizeDigest(s string) digest.Digest {
	s = strings.ToLower(strings.TrimSpace(s))
	d, ok := sha256digest.FromHex(strings.TrimPrefix(s, "sha256:"))
	if !ok {
		return ""
	}
	return d
}
