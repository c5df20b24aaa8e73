// Package bundle holds ferry's upgrade bundle format: metadata.json, the tar
// layout, verification with extraction in one pass, and signing. Making a
// bundle from a registry is bundle/create's job.
package bundle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/diskspace"
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

const (
	// MetadataName is the tar's first entry.
	MetadataName = "metadata.json"
	// RegistryRoot is the prefix of every other entry: the root of
	// distribution's filesystem storage driver.
	RegistryRoot = "docker/registry/v2/"
	// maxMetadataSize bounds what is read of metadata.json (a release has a
	// few hundred images: tens of KiB).
	maxMetadataSize = 8 << 20
)

// ErrInvalid marks a bundle that breaks the format; errors.Is finds it in
// every refusal caused by the bundle's own content.
var ErrInvalid = errors.New("invalid bundle")

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

// Arches are the architectures ferry knows, by `uname -m` name.
var Arches = []string{"x86_64", "aarch64", "ppc64le", "s390x"}

var versionRE = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z._+-]{0,63}$`)

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
	name, tag, _ := SplitRef(sig)
	d, _ := SignedDigest(tag)
	return name + "@" + string(d)
}

// ParseMetadata decodes and validates metadata.json. Unknown fields are
// ignored; a missing or malformed required field is an error.
func ParseMetadata(b []byte) (*Metadata, error) {
	var m Metadata
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: metadata.json is not valid JSON: %v", ErrInvalid, err)
	}
	if m.FormatVersion == 0 {
		m.readSeedShape()
	} else {
		m.Shape = ShapeFerry
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// readSeedShape fills what the seed's metadata leaves out: sizeBytes from
// the human size ("16 GiB"; 0 when absent: the tar's length then serves
// the space checks), and each image listed once.
func (m *Metadata) readSeedShape() {
	m.Shape = ShapeSeed
	if m.SizeBytes == 0 {
		m.SizeBytes = parseHumanSize(m.Size)
	}
	seen := map[string]bool{m.Release: true}
	images := m.Images[:0]
	for _, ref := range m.Images {
		if seen[ref] {
			m.Duplicates = append(m.Duplicates, ref)
			continue
		}
		seen[ref] = true
		images = append(images, ref)
	}
	m.Images = images
}

// parseHumanSize reads "16 GiB", "3.9GB", "512 MiB", "1024" as bytes; 0
// when it cannot.
func parseHumanSize(s string) int64 {
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := s, ""
	if i >= 0 {
		num, unit = s[:i], strings.ToUpper(strings.TrimSpace(s[i:]))
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0
	}
	mult := map[string]float64{"": 1, "B": 1, "K": 1 << 10, "KB": 1e3, "KIB": 1 << 10, "M": 1 << 20, "MB": 1e6, "MIB": 1 << 20,
		"G": 1 << 30, "GB": 1e9, "GIB": 1 << 30, "T": 1 << 40, "TB": 1e12, "TIB": 1 << 40}[unit]
	return int64(math.Round(v * mult))
}

// ParseSize reads a size as people write it ("20M", "2.5 MiB", "1e6"
// bytes as "1000000"): binary units for K, M, G, T alone.
func ParseSize(s string) (int64, error) {
	n := parseHumanSize(s)
	if n <= 0 {
		return 0, fmt.Errorf("%q is not a size (like 20M, 2.5MiB or 1000000)", s)
	}
	return n, nil
}

// Validate checks every required field.
func (m *Metadata) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: metadata.json: %s", ErrInvalid, fmt.Sprintf(format, a...))
	}
	seed := m.Shape == ShapeSeed
	switch {
	case m.FormatVersion < 1 && !seed:
		return bad("formatVersion missing")
	case m.FormatVersion > FormatVersion:
		return bad("formatVersion %d is newer than this ferry understands (%d): update ferry", m.FormatVersion, FormatVersion)
	case !versionRE.MatchString(m.Version):
		return bad("version %q missing or malformed", m.Version)
	case !knownArch(m.Arch):
		return bad("arch %q is not one of %s", m.Arch, strings.Join(Arches, ", "))
	case m.SizeBytes <= 0 && !seed:
		return bad("sizeBytes missing")
	case m.Size == "" && !seed:
		return bad("size missing")
	case m.Release == "":
		return bad("release missing")
	}
	if err := checkDigestRef(m.Release); err != nil {
		return bad("release: %v", err)
	}
	seen := map[string]bool{m.Release: true}
	for i, ref := range m.Images {
		if err := checkDigestRef(ref); err != nil {
			return bad("images[%d]: %v", i, err)
		}
		if seen[ref] {
			return bad("images[%d]: %s listed twice", i, ref)
		}
		seen[ref] = true
	}
	if err := m.validatePath(seen); err != nil {
		return bad("%v", err)
	}
	names := map[string]bool{}
	for ref := range seen {
		n, _, _ := SplitRef(ref)
		names[n] = true
	}
	for i, ref := range m.Signatures {
		if err := checkDigestRef(ref); err != nil {
			return bad("signatures[%d]: %v", i, err)
		}
		n, tag, _ := SplitRef(ref)
		if _, ok := SignedDigest(tag); !ok {
			return bad("signatures[%d]: %s is not tagged sha256-<hex>.sig or sha256-<hex>", i, ref)
		}
		if !names[n] {
			return bad("signatures[%d]: %s is not in a repository of the release or the images", i, ref)
		}
		if seen[ref] {
			return bad("signatures[%d]: %s listed twice", i, ref)
		}
		seen[ref] = true
	}
	for ref, n := range m.ImageBytes {
		if !seen[ref] {
			return bad("imageBytes: %s is not the release nor one of the images", ref)
		}
		if n < 0 || m.SizeBytes > 0 && n > m.SizeBytes {
			return bad("imageBytes: %s: %d bytes does not fit in sizeBytes %d", ref, n, m.SizeBytes)
		}
	}
	return nil
}

// validatePath checks the path against the images (images: the release
// and every image, by reference).
func (m *Metadata) validatePath(images map[string]bool) error {
	if len(m.Path) == 0 {
		return nil
	}
	switch last := m.Path[len(m.Path)-1]; {
	case m.FormatVersion < FormatPath:
		return fmt.Errorf("path needs formatVersion %d or later, not %d", FormatPath, m.FormatVersion)
	case len(m.Path) < 2:
		return errors.New("path of one hop: a bundle of one release has no path")
	case last.Version != m.Version || last.Release != m.Release:
		return fmt.Errorf("path ends at %s (%s), not at the bundle's version %s and release %s", last.Version, last.Release, m.Version, m.Release)
	case len(last.ReleaseSignatures) > 0:
		return errors.New("path: the last hop's signatures are releaseSignatures, not repeated in the path")
	}
	versions := map[string]bool{}
	for i, h := range m.Path {
		switch {
		case !versionRE.MatchString(h.Version):
			return fmt.Errorf("path[%d]: version %q missing or malformed", i, h.Version)
		case versions[h.Version]:
			return fmt.Errorf("path[%d]: version %s listed twice", i, h.Version)
		case !images[h.Release]:
			return fmt.Errorf("path[%d]: release %q is not one of the bundle's images", i, h.Release)
		}
		versions[h.Version] = true
	}
	return nil
}

func knownArch(a string) bool {
	for _, k := range Arches {
		if a == k {
			return true
		}
	}
	return false
}

// HumanSize formats n bytes the way metadata's size field does ("16 GiB").
func HumanSize(n int64) string { return diskspace.Human(n) }

// SameMetadata reports whether a and b say the same, field for field, as
// their JSON says it (a peer's offer carries the metadata it parsed).
func SameMetadata(a, b *Metadata) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && bytes.Equal(ja, jb)
}
