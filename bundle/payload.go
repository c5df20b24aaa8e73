package bundle

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ferry-edge/ferry/internal/digest"
	"github.com/ferry-edge/ferry/internal/sha256digest"
)

// checkPayload holds a bundle made from the registry to its source: every
// image it lists is one the release image names (its
// release-manifests/image-references, read from the staged tree under
// root) or one of the source's extras. A node that made it cannot slip in
// an image nobody asked for.
func checkPayload(root string, meta *Metadata, tree Tree, src ReleaseSource) error {
	if !src.Matches(meta) {
		return fmt.Errorf("%w: the bundle is not of release %s with the extra images asked for", ErrNotApproved, src.Release)
	}
	refs, err := treeReleaseImages(root, meta, tree)
	if err != nil {
		return err
	}
	for _, img := range meta.Images {
		if slices.Contains(refs, img) || slices.ContainsFunc(src.Extras, func(e string) bool { return src.IsExtra(img, e) }) {
			continue
		}
		return fmt.Errorf("%w: the bundle holds %s, which release %s does not name and the UpgradeBundle's source does not ask for: the node that made it is not to be trusted", ErrNotApproved, img, src.Release)
	}
	return nil
}

// treeReleaseImages reads the release image's image-references from the
// tree: its manifest (the arch's, for a manifest list) from the pass's
// index, its layers from the staged blobs, top layer first.
func treeReleaseImages(root string, meta *Metadata, tree Tree) ([]string, error) {
	name, dgst, _ := strings.Cut(meta.Release, "@")
	mb, ok := tree.Manifest(name, digest.Digest(dgst))
	if !ok {
		return nil, fmt.Errorf("%w: the bundle does not hold its release image %s", ErrInvalid, meta.Release)
	}
	var m struct {
		Manifests []struct {
			Digest   digest.Digest `json:"digest"`
			Platform *struct {
				Architecture string `json:"architecture"`
				OS           string `json:"os"`
			} `json:"platform"`
		} `json:"manifests"`
		Layers []struct {
			Digest string `json:"digest"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(mb, &m); err != nil {
		return nil, fmt.Errorf("%w: the release image's manifest: %v", ErrInvalid, err)
	}
	if len(m.Manifests) > 0 { // a manifest list: the node's arch
		child := digest.Digest("")
		for _, c := range m.Manifests {
			if c.Platform != nil && c.Platform.OS == "linux" && c.Platform.Architecture == GoArch(meta.Arch) {
				child = c.Digest
			}
		}
		if mb, ok = tree.Manifest(name, child); !ok {
			return nil, fmt.Errorf("%w: the bundle does not hold the %s image of release %s", ErrInvalid, meta.Arch, meta.Release)
		}
		if err := json.Unmarshal(mb, &m); err != nil {
			return nil, fmt.Errorf("%w: the release image's manifest: %v", ErrInvalid, err)
		}
	}
	files := map[string][]byte{}
	for i := len(m.Layers) - 1; i >= 0 && files[ImageReferencesPath] == nil; i-- {
		d, err := sha256digest.Parse(m.Layers[i].Digest)
		if err != nil {
			return nil, fmt.Errorf("%w: the release image names layer %q", ErrInvalid, m.Layers[i].Digest)
		}
		if err := readBlobFiles(filepath.Join(root, filepath.FromSlash(RegistryRoot), filepath.FromSlash(BlobDataPath(d))), files); err != nil {
			return nil, fmt.Errorf("%w: layer %d of the release image: %v", ErrInvalid, i+1, err)
		}
	}
	b, ok := files[ImageReferencesPath]
	if !ok {
		return nil, fmt.Errorf("%w: the release image has no %s", ErrRelease, ImageReferencesPath)
	}
	return ParseImageReferences(b)
}

// readBlobFiles reads the release's files from a layer blob on disk,
// gzip-compressed or not.
func readBlobFiles(path string, files map[string][]byte) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	}
	return ReadReleaseFiles(r, files)
}
