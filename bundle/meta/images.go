package meta

import "github.com/ferry-edge/ferry/internal/imageref"

// DropTags is images with the tag dropped from those in digestOnly
// (name:tag@sha256:… becomes name@sha256:…): what a node loads when its
// signature policy admits those images by digest only (Admission). Their
// PullRefs are then the digest alone, and MirrorsConf serves their
// repository by digest only unless another image there keeps its tag.
func DropTags(images, digestOnly []string) []string {
	if len(digestOnly) == 0 {
		return images
	}
	drop := make(map[string]bool, len(digestOnly))
	for _, r := range digestOnly {
		drop[r] = true
	}
	out := make([]string, 0, len(images))
	for _, ref := range images {
		if name, tag, digest := imageref.Split(ref); drop[ref] && tag != "" && digest != "" {
			ref = name + "@" + digest
		}
		out = append(out, ref)
	}
	return out
}
