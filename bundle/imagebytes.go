package bundle

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ImageBlobs lists, for each image of an extracted bundle (references as
// in metadata.json), the blobs a runtime stores when it pulls it (config
// and layers, digest → size; of a manifest list, the child for goarch,
// else every child): what sizes the room a load needs.
func ImageBlobs(dir string, images []string, goarch string) (map[string]map[string]int64, error) {
	repos := RepoPaths(images)
	out := map[string]map[string]int64{}
	for _, ref := range images {
		name, tag, digest := SplitRef(ref)
		repo := filepath.Join(dir, RegistryRoot, "repositories", repos[name])
		if digest == "" && tag != "" {
			b, err := os.ReadFile(filepath.Join(repo, "_manifests/tags", tag, "current/link"))
			if err != nil {
				return nil, fmt.Errorf("image %s: %w", ref, err)
			}
			digest = strings.TrimSpace(string(b))
		}
		blobs := map[string]int64{}
		if err := manifestBlobs(dir, digest, goarch, blobs, 0); err != nil {
			return nil, fmt.Errorf("image %s: %w", ref, err)
		}
		out[ref] = blobs
	}
	return out, nil
}

func manifestBlobs(dir, digest, goarch string, blobs map[string]int64, depth int) error {
	h, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(h) < 2 || depth > 1 {
		return fmt.Errorf("manifest %q cannot be read", digest)
	}
	b, err := os.ReadFile(filepath.Join(dir, RegistryRoot, blobsDir, h[:2], h, "data"))
	if err != nil {
		return err
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("manifest %s: %w", digest, err)
	}
	if len(m.Manifests) > 0 {
		var pick []descriptor
		for _, c := range m.Manifests {
			if c.Platform != nil && c.Platform.Architecture == goarch {
				pick = append(pick, c)
			}
		}
		if len(pick) == 0 {
			pick = m.Manifests
		}
		for _, c := range pick {
			if err := manifestBlobs(dir, c.Digest, goarch, blobs, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	if m.Config != nil {
		blobs[m.Config.Digest] = m.Config.Size
	}
	for _, l := range m.Layers {
		if !l.foreign() {
			blobs[l.Digest] = l.Size
		}
	}
	return nil
}

// MissingBytes is what pulling the images a runtime lacks writes: the
// blobs of images not in present, each counted once, less those an image
// present already holds.
func MissingBytes(blobs map[string]map[string]int64, present func(ref string) bool) (bytes int64, missing int) {
	held := map[string]bool{}
	for ref, bs := range blobs {
		if present(ref) {
			for d := range bs {
				held[d] = true
			}
		}
	}
	counted := map[string]bool{}
	for ref, bs := range blobs {
		if present(ref) {
			continue
		}
		missing++
		for d, n := range bs {
			if !held[d] && !counted[d] {
				counted[d] = true
				bytes += n
			}
		}
	}
	return bytes, missing
}

// ImageSizes is, for each image of blobs (ImageBlobs), the bytes of its
// blobs: what metadata.json's imageBytes holds.
func ImageSizes(blobs map[string]map[string]int64) map[string]int64 {
	out := make(map[string]int64, len(blobs))
	for ref, bs := range blobs {
		var n int64
		for _, b := range bs {
			n += b
		}
		out[ref] = n
	}
	return out
}

// EstimateMissingBytes sizes, from the metadata alone (before the tree is
// extracted), what pulling the images a runtime lacks (not present, by
// the references of metadata.json) writes. It never says less than
// MissingBytes on the extracted tree, so that a bundle that passes a room
// check before extraction does not fail the same check once extracted,
// with its tree already written:
//
//   - with imageBytes, the smaller of their sum over the missing images
//     (a blob two of them share counted twice) and sizeBytes less the
//     biggest present image (every blob of the tree belongs to some image,
//     and a runtime that holds an image holds all its blobs);
//   - without (bundles made before ferry wrote imageBytes, seed-shaped
//     ones), the whole sizeBytes as soon as one image is missing: a share
//     by count would say too little when the missing images are the big
//     ones.
//
// perImage says which.
func EstimateMissingBytes(m *Metadata, present func(ref string) bool) (bytes int64, missing int, perImage bool) {
	perImage = len(m.ImageBytes) > 0
	var sum, biggestPresent int64
	for _, ref := range m.AllImages() {
		n, known := m.ImageBytes[ref]
		if present(ref) {
			if known {
				biggestPresent = max(biggestPresent, n)
			}
			continue
		}
		missing++
		sum += n
		if !known {
			perImage = false
		}
	}
	switch {
	case missing == 0:
		return 0, 0, perImage
	case !perImage:
		return m.SizeBytes, missing, false
	}
	return max(min(sum, m.SizeBytes-biggestPresent), 0), missing, true
}
