package bundle

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/ferry-edge/ferry/internal/digest"
)

// ErrRelease: a release image ferry cannot read (bundle create, and a node
// holding a bundle to the release it was asked for).
var ErrRelease = errors.New("bad release image")

// Files of an OpenShift release image that ferry reads.
const (
	// ImageReferencesPath is the release's payload: an ImageStream.
	ImageReferencesPath = "release-manifests/image-references"
	// ReleaseMetadataPath holds the release's version.
	ReleaseMetadataPath = "release-manifests/release-metadata"
	maxReleaseFile      = 16 << 20
)

// BlobDataPath is where distribution keeps a blob's bytes, below
// RegistryRoot.
func BlobDataPath(d digest.Digest) string {
	h := d.Encoded()
	return path.Join("blobs", "sha256", h[:2], h, "data")
}

// ReadReleaseFiles adds the release files (ImageReferencesPath,
// ReleaseMetadataPath) found in an uncompressed layer's tar to files,
// keeping any already found (upper layers win).
func ReadReleaseFiles(r io.Reader, files map[string][]byte) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if name != ImageReferencesPath && name != ReleaseMetadataPath {
			continue
		}
		if _, seen := files[name]; seen || h.Typeflag != tar.TypeReg {
			continue
		}
		if h.Size > maxReleaseFile {
			return fmt.Errorf("%w: %s is %d bytes", ErrRelease, name, h.Size)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		files[name] = b
	}
}

// ParseImageReferences returns every .spec.tags[].from.name of an
// ImageStream, in order, without duplicates.
func ParseImageReferences(b []byte) ([]string, error) {
	var is struct {
		Kind string `json:"kind"`
		Spec struct {
			Tags []struct {
				Name string `json:"name"`
				From *struct {
					Kind string `json:"kind"`
					Name string `json:"name"`
				} `json:"from"`
			} `json:"tags"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(b, &is); err != nil {
		return nil, fmt.Errorf("%w: %s is not JSON: %v", ErrRelease, ImageReferencesPath, err)
	}
	if is.Kind != "" && is.Kind != "ImageStream" {
		return nil, fmt.Errorf("%w: %s is a %s, not an ImageStream", ErrRelease, ImageReferencesPath, is.Kind)
	}
	var out []string
	seen := map[string]bool{}
	for _, t := range is.Spec.Tags {
		if t.From == nil || t.From.Name == "" || (t.From.Kind != "" && t.From.Kind != "DockerImage") {
			continue
		}
		if !seen[t.From.Name] {
			seen[t.From.Name] = true
			out = append(out, t.From.Name)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s names no images", ErrRelease, ImageReferencesPath)
	}
	return out, nil
}

// UnameArch maps an image config's (GOARCH) architecture to the uname -m
// name bundles use; uname names pass through. Unknown names give "".
func UnameArch(a string) string {
	switch a {
	case "amd64", "x86_64":
		return "x86_64"
	case "arm64", "aarch64":
		return "aarch64"
	case "ppc64le":
		return "ppc64le"
	case "s390x":
		return "s390x"
	}
	return ""
}

// GoArch maps a uname -m name to the GOARCH name image configs and
// manifest lists use.
func GoArch(a string) string {
	switch a {
	case "x86_64":
		return "amd64"
	case "aarch64":
		return "arm64"
	}
	return a
}
