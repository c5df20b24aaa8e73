package bundle

import (
	"github.com/ferry-edge/ferry/bundle/meta"
	"github.com/ferry-edge/ferry/internal/digest"
)

// The bundle's words that the agent's state machine reads too are
// bundle/meta's (a leaf without fmt, encoding/json or crypto); bundle
// names them as its own, so that its readers import one package.
type (
	Metadata      = meta.Metadata
	Hop           = meta.Hop
	Approval      = meta.Approval
	Policy        = meta.Policy
	TrustedKey    = meta.TrustedKey
	ReleaseSource = meta.ReleaseSource
	Source        = meta.Source
	Result        = meta.Result
	Admission     = meta.Admission
)

const (
	FormatVersion = meta.FormatVersion
	FormatPath    = meta.FormatPath
	ShapeFerry    = meta.ShapeFerry
	ShapeSeed     = meta.ShapeSeed

	ApprovalDigest    = meta.ApprovalDigest
	ApprovalSignature = meta.ApprovalSignature
	ApprovalPeer      = meta.ApprovalPeer
	ApprovalSource    = meta.ApprovalSource
	ApprovalOff       = meta.ApprovalOff
	ApprovalNone      = meta.ApprovalNone
)

// The refusals (meta's).
var (
	ErrInvalid     = meta.ErrInvalid
	ErrMismatch    = meta.ErrMismatch
	ErrWrongArch   = meta.ErrWrongArch
	ErrNotApproved = meta.ErrNotApproved
	ErrNoSpace     = meta.ErrNoSpace
	ErrPolicy      = meta.ErrPolicy
	ErrDiskFilled  = meta.ErrDiskFilled
)

// NormalizeDigest accepts "sha256:<hex>" or "<hex>" and returns
// "sha256:<hex>", or "" when s is neither.
func NormalizeDigest(s string) digest.Digest { return meta.NormalizeDigest(s) }

// DropTags is images with the tag dropped from those in digestOnly.
func DropTags(images, digestOnly []string) []string { return meta.DropTags(images, digestOnly) }

// StagingDir is where Extract writes before the rename.
func StagingDir(dest string) string { return meta.StagingDir(dest) }

// SignedDigest is the manifest digest a signature tag is for, and
// whether tag is one.
func SignedDigest(tag string) (digest.Digest, bool) { return meta.SignedDigest(tag) }

// SignatureTag is cosign's tag for the signatures of manifest d.
func SignatureTag(d string) string { return meta.SignatureTag(d) }

// ReferrersTag is the OCI referrers tag schema's tag for manifest d.
func ReferrersTag(d string) string { return meta.ReferrersTag(d) }
