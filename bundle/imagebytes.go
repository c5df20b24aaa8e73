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
