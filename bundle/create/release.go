package create

import (
	"encoding/json"
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/ferry-edge/ferry/bundle"
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
	info.Arch = bundle.UnameArch(cf.Architecture)
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
	refs, ok := files[bundle.ImageReferencesPath]
	if !ok {
		return nil, fmt.Errorf("%w: it has no %s: is it an OpenShift release image?", ErrRelease, bundle.ImageReferencesPath)
	}
	if info.Payload, err = bundle.ParseImageReferences(refs); err != nil {
		return nil, err
	}
	if b, ok := files[bundle.ReleaseMetadataPath]; ok {
		var m struct {
			Version string `json:"version"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("%w: %s is not JSON: %v", ErrRelease, bundle.ReleaseMetadataPath, err)
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
	return bundle.ReadReleaseFiles(rc, files)
}
