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

	"github.com/ferry-edge/ferry/internal/diskspace"
)

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

// Arches are the architectures ferry knows, by `uname -m` name.
var Arches = []string{"x86_64", "aarch64", "ppc64le", "s390x"}

var versionRE = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z._+-]{0,63}$`)

// ParseMetadata decodes and validates metadata.json. Unknown fields are
// ignored; a missing or malformed required field is an error.
func ParseMetadata(b []byte) (*Metadata, error) {
	var m Metadata
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: metadata.json is not valid JSON: %v", ErrInvalid, err)
	}
	if m.FormatVersion == 0 {
		readSeedShape(&m)
	} else {
		m.Shape = ShapeFerry
	}
	if err := ValidateMetadata(&m); err != nil {
		return nil, err
	}
	return &m, nil
}

// readSeedShape fills what the seed's metadata leaves out: sizeBytes from
// the human size ("16 GiB"; 0 when absent: the tar's length then serves
// the space checks), and each image listed once.
func readSeedShape(m *Metadata) {
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

// ValidateMetadata checks every required field of m.
func ValidateMetadata(m *Metadata) error {
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
	if err := validatePath(m, seen); err != nil {
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
func validatePath(m *Metadata, images map[string]bool) error {
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
