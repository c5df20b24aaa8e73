package bundle

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Files of a release image that bundle create reads.
const (
	imageReferencesPath = "release-manifests/image-references"
	releaseMetadataPath = "release-manifests/release-metadata"
	maxReleaseFile      = 16 << 20
)

// releaseInfo is what a release image says about itself.
type releaseInfo struct {
	Version string   // from release-metadata; "" if absent
	Arch    string   // uname -m name from the image config; "" if unknown
	Payload []string // image-references' .spec.tags[].from.name, in order, deduplicated
}

// readRelease reads image-references and release-metadata from img's
// layers, top layer first (the release-manifests layer is normally the
// last), stopping as soon as both are found.
func readRelease(img v1.Image) (*releaseInfo, error) {
	info := &releaseInfo{}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read image config: %w", err)
	}
	info.Arch = UnameArch(cf.Architecture)
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{}
	for i := len(layers) - 1; i >= 0 && len(files) < 2; i-- {
		if err := readLayerFiles(layers[i], files); err != nil {
			return nil, fmt.Errorf("read layer %d of the release image: %w", i+1, err)
		}
	}
	refs, ok := files[imageReferencesPath]
	if !ok {
		return nil, fmt.Errorf("%w: it has no %s: is it an OpenShift release image?", ErrRelease, imageReferencesPath)
	}
	if info.Payload, err = parseImageReferences(refs); err != nil {
		return nil, err
	}
	if b, ok := files[releaseMetadataPath]; ok {
		var m struct {
			Version string `json:"version"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("%w: %s is not JSON: %v", ErrRelease, releaseMetadataPath, err)
		}
		info.Version = m.Version
	}
	return info, nil
}

// readLayerFiles adds the wanted release files found in layer to files,
// keeping any already found (upper layers win).
func readLayerFiles(layer v1.Layer, files map[string][]byte) error {
	rc, err := layer.Uncompressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	return readTarFiles(rc, files)
}

// readTarFiles is readLayerFiles of an uncompressed layer's tar.
func readTarFiles(r io.Reader, files map[string][]byte) error {
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
		if name != imageReferencesPath && name != releaseMetadataPath {
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

// parseImageReferences returns every .spec.tags[].from.name of an
// ImageStream, in order, without duplicates.
func parseImageReferences(b []byte) ([]string, error) {
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
		return nil, fmt.Errorf("%w: %s is not JSON: %v", ErrRelease, imageReferencesPath, err)
	}
	if is.Kind != "" && is.Kind != "ImageStream" {
		return nil, fmt.Errorf("%w: %s is a %s, not an ImageStream", ErrRelease, imageReferencesPath, is.Kind)
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
		return nil, fmt.Errorf("%w: %s names no images", ErrRelease, imageReferencesPath)
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
