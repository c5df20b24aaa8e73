// Package meta is what a bundle is and what it must satisfy, in the words
// that package bundle and the agent's state machine (agent/machine) share:
// metadata.json as parsed, the approval policy, where a bundle is read
// from and what its check found, and the refusals. It links only the
// standard library's smallest packages (no fmt, no encoding/json, no
// crypto) and ferry's leaves of them, so that the state machine may
// import it: parsing metadata.json, checking signatures and reading
// bundles are package bundle's.
package meta

import (
	"strings"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/imageref"
	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// FormatVersion is the newest metadata.json format this ferry understands.
// A bundle of one release is written as format 1, which every ferry
// reads; a bundle with a path of several releases as FormatPath, which a
// ferry older than paths refuses ("update ferry") rather than aiming
// straight at the last release and skipping the hops before it.
const FormatVersion = FormatPath

// FormatPath is the first format with a path of several releases.
const FormatPath = 2

// Metadata is metadata.json.
type Metadata struct {
	FormatVersion int       `json:"formatVersion"`
	Version       string    `json:"version"`
	Arch          string    `json:"arch"`
	Size          string    `json:"size"`
	SizeBytes     int64     `json:"sizeBytes"`
	Release       string    `json:"release"`
	Images        []string  `json:"images"`
	Created       time.Time `json:"created"`
	// ReleaseSignatures are the release image's signatures, each one
	// signature file as a signature store serves it (base64 in JSON).
	ReleaseSignatures [][]byte `json:"releaseSignatures,omitempty"`
	// ImageBytes (optional; ferry bundle create writes it) is, for the
	// release and each image (keys as in release and images), the bytes a
	// runtime stores when it pulls it: its config and layers, each once.
	// It lets a node size a load before the bundle is extracted (see
	// EstimateMissingBytes); bundles without it still load.
	ImageBytes map[string]int64 `json:"imageBytes,omitempty"`
	// Signatures are the sigstore signature attachments carried with the
	// images, each name:sha256-<hex>.sig@sha256:… (cosign's tag for the
	// manifest sha256:<hex> of an image or a list child, under the image's
	// name) or name:sha256-<hex>@sha256:… (an index of the sigstore
	// artifacts among its OCI referrers, by the referrers tag schema). A node's policy.json may require them (OpenShift 4.21+ does
	// for the release); the embedded registry serves them as the source did.
	Signatures []string `json:"signatures,omitempty"`

	// Path (formats FormatPath and later), for a bundle of several
	// releases, is every hop the cluster takes, in order: the last is the
	// bundle's own version and release (its signatures are
	// releaseSignatures, not repeated there), the earlier ones are among
	// images. Empty: one hop, to release. Hops reads both.
	Path []Hop `json:"path,omitempty"`

	// Shape is how the metadata was written: ShapeFerry, or ShapeSeed (no
	// formatVersion: the seed's example and upgrade-tool), read leniently.
	Shape string `json:"-"`
	// Duplicates are images a seed-shaped metadata listed more than once
	// (counted once).
	Duplicates []string `json:"-"`
}

// Hop is one release of a bundle's path.
type Hop struct {
	Version string `json:"version"`
	Release string `json:"release"` // name@sha256:…
	// ReleaseSignatures are this release image's signatures, as
	// Metadata's; empty for the last hop (Metadata carries them).
	ReleaseSignatures [][]byte `json:"releaseSignatures,omitempty"`
}

// OldestFormat is the oldest format that holds m: 1 for one release, so
// that every ferry reads it; FormatPath for a path.
func (m *Metadata) OldestFormat() int {
	if len(m.Path) > 0 {
		return FormatPath
	}
	return 1
}

// Hops is the bundle's path, the last hop carrying the bundle's release
// signatures: one hop for a bundle without a path.
func (m *Metadata) Hops() []Hop {
	last := Hop{Version: m.Version, Release: m.Release, ReleaseSignatures: m.ReleaseSignatures}
	if len(m.Path) == 0 {
		return []Hop{last}
	}
	out := append([]Hop(nil), m.Path[:len(m.Path)-1]...)
	return append(out, last)
}

// Metadata shapes.
const (
	ShapeFerry = "ferry"
	ShapeSeed  = "seed (upgrade-tool)"
)

// Name is the bundle's base name: upgrade-<version>-<arch>.
func (m *Metadata) Name() string { return "upgrade-" + m.Version + "-" + m.Arch }

// DirName is the extracted directory's name under /var/lib/upgrade.
func (m *Metadata) DirName() string { return m.Version + "-" + m.Arch }

// AllImages is the release followed by every other image.
func (m *Metadata) AllImages() []string {
	return append([]string{m.Release}, m.Images...)
}

// SignatureTag is cosign's tag for the signatures of manifest d
// (sha256:<hex>): sha256-<hex>.sig.
func SignatureTag(d string) string { return strings.Replace(d, ":", "-", 1) + ".sig" }

// ReferrersTag is the OCI referrers tag schema's tag for the referrers of
// manifest d (sha256:<hex>): sha256-<hex>, an index of them.
func ReferrersTag(d string) string { return strings.Replace(d, ":", "-", 1) }

// SignedDigest is the manifest digest a signature tag (cosign's
// sha256-<hex>.sig, or the referrers index sha256-<hex>) is for, and
// whether tag is one.
func SignedDigest(tag string) (digest.Digest, bool) {
	hexd, ok := strings.CutPrefix(tag, "sha256-")
	hexd = strings.TrimSuffix(hexd, ".sig")
	if !ok {
		return "", false
	}
	return sha256digest.FromHex(hexd)
}

// SignatureOf is the reference (name@sha256:…) of the manifest the
// signature sig (an entry of Signatures) is for.
func (m *Metadata) SignatureOf(sig string) string {
	name, tag, _ := imageref.Split(sig)
	d, _ := SignedDigest(tag)
	return name + "@" + string(d)
}
